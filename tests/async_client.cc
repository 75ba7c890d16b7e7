// A training process on liblohan_client's C ABI only (linked against
// liblohan_client.so, like any user's program), exercising the asynchronous
// requests and the host/device copies against a real lohand.
//
//   async_client train --socket S --job NAME [--layers 1000,5000,333]
//       [--iterations N] [--dtype fp32|bf16] [--grad-scale X] [--seed N]
//       [--chunk N] [--grad-threads K] [--max-norm X] [--grad-slots K]
//       [--weight-slots K] [--host-pool BYTES] --out FILE
//     The synthetic model of tests/synthetic_model.h, as train_client trains
//     it, but: FETCH_PARAMS of every layer submitted at once and waited for
//     in reverse order, every layer's gradient handed over with
//     lohan_model_grad_ready_from_host without waiting (from K threads, each
//     taking every K-th layer), and the tickets waited for only before
//     ITER_END. Writes the same file as train_client: per layer the fp32
//     master weights and what FETCH_PARAMS then gives (read with
//     lohan_model_weights_to_host). With --grad-slots K (a streamed layout:
//     layers share K gradient buffers), handing a gradient over waits by
//     itself until the buffer's previous GRAD_READY has completed.
//
//   async_client checks --socket S
//     The ABI's edges; prints one line per check, "FAIL ..." on a surprise
//     (exit 1): NULL arguments, wrong sizes, tickets waited for twice or
//     never issued, many requests in flight with several failing (each with
//     its own text), several threads at once, and the CUDA functions (on a
//     machine without a GPU they must fail cleanly; with one, a round trip
//     through device memory allocated by this program's own CUDA runtime).
#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "daemon/optim/half.h"
#include "lohan/lohan_client.h"
#include "tests/synthetic_model.h"

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lohan::testing {
namespace {

int failures = 0;

int Fail(const char* step, int status) {
  std::printf("%s: %s: %s\n", step, lohan_status_name(status),
              lohan_last_error());
  return status == 0 ? 1 : status;
}

void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL %s (last error: %s)\n", what.c_str(), lohan_last_error());
    ++failures;
  }
}

struct Session {
  lohan_client* client = nullptr;
  lohan_data_plane* plane = nullptr;
  lohan_model* model = nullptr;
  std::string job_id;

  ~Session() {
    lohan_model_destroy(model);
    lohan_data_plane_destroy(plane);
    lohan_client_destroy(client);
  }
};

// Connects, creates (or finds) the job, attaches, opens the data plane and
// registers the model. 0 or the failing status (printed).
struct Layout {
  uint64_t chunk = 0;
  uint64_t activation_bytes = 0;
  double max_norm = 0.0;
  uint32_t grad_slots = 0, weight_slots = 0;
  uint64_t host_pool = uint64_t{16} << 20;
};

int Open(const std::string& socket, const std::string& job_name,
         const std::vector<uint64_t>& layers, uint32_t dtype,
         const Layout& layout, Session& session) {
  int status = lohan_client_connect(socket.c_str(), &session.client);
  if (status != LOHAN_OK) return Fail("connect", status);
  lohan_job_list* list = nullptr;
  status = lohan_jobs_list(session.client, &list);
  if (status != LOHAN_OK) return Fail("list", status);
  for (size_t i = 0; i < lohan_job_list_size(list); ++i) {
    const lohan_job_info* job = lohan_job_list_get(list, i);
    if (job_name == lohan_job_info_name(job)) {
      session.job_id = lohan_job_info_id(job);
    }
  }
  lohan_job_list_destroy(list);
  if (session.job_id.empty()) {
    lohan_job_info* job = nullptr;
    status = lohan_job_create(session.client, job_name.c_str(),
                              layout.host_pool, 0, &job);
    if (status != LOHAN_OK) return Fail("create", status);
    session.job_id = lohan_job_info_id(job);
    lohan_job_info_destroy(job);
  }
  status = lohan_job_attach(session.client, session.job_id.c_str(), nullptr);
  if (status != LOHAN_OK) return Fail("attach", status);
  status = lohan_data_plane_open(session.client, session.job_id.c_str(),
                                 &session.plane);
  if (status != LOHAN_OK) return Fail("data-plane", status);
  const SyntheticAdam adam;
  lohan_model_spec spec{};
  spec.struct_size = sizeof(spec);
  spec.dtype = dtype;
  spec.layer_elements = layers.data();
  spec.num_layers = static_cast<uint32_t>(layers.size());
  spec.lr = adam.lr;
  spec.beta1 = adam.beta1;
  spec.beta2 = adam.beta2;
  spec.eps = adam.eps;
  spec.weight_decay = adam.weight_decay;
  spec.adamw = 1;
  spec.skip_nonfinite = 1;
  spec.chunk_elements = layout.chunk;
  spec.activation_bytes = layout.activation_bytes;
  spec.max_grad_norm = layout.max_norm;
  spec.grad_slots = layout.grad_slots;
  spec.weight_slots = layout.weight_slots;
  status = lohan_model_register(session.client, session.plane,
                                session.job_id.c_str(), &spec, &session.model);
  if (status != LOHAN_OK) return Fail("register", status);
  return 0;
}

// ------------------------------------------------------------------ train

struct TrainArgs {
  std::string socket, job, layers = "1000,5000,333", dtype = "fp32", out;
  int iterations = 3;
  double grad_scale = 0.01;
  uint64_t seed = 7;
  uint64_t chunk = 2048;
  int grad_threads = 1;
  double max_norm = 0.0;
  uint32_t grad_slots = 0, weight_slots = 0;
  uint64_t host_pool = uint64_t{16} << 20;
};

int Train(const TrainArgs& args) {
  std::vector<uint64_t> layers;
  for (absl::string_view part : absl::StrSplit(args.layers, ',')) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(part, &n))
      return Fail("args", LOHAN_INVALID_ARGUMENT);
    layers.push_back(n);
  }
  const bool bf16 = args.dtype == "bf16";
  const uint64_t element = bf16 ? 2 : 4;
  Session session;
  const Layout layout{.chunk = args.chunk,
                      .max_norm = args.max_norm,
                      .grad_slots = args.grad_slots,
                      .weight_slots = args.weight_slots,
                      .host_pool = args.host_pool};
  if (int status =
          Open(args.socket, args.job, layers,
               bf16 ? LOHAN_DTYPE_BF16 : LOHAN_DTYPE_FP32, layout, session);
      status != 0) {
    return status;
  }
  lohan_model* model = session.model;
  float* staging = lohan_model_staging(model);
  for (uint32_t l = 0; l < layers.size(); ++l) {
    if (lohan_model_layer_initialized(model, l)) continue;
    for (uint64_t i = 0; i < layers[l]; ++i) {
      staging[i] = InitialWeight(args.seed, l, i);
    }
    if (int status = lohan_model_init_weights(model, l); status != LOHAN_OK) {
      return Fail("init", status);
    }
  }

  const uint64_t first = lohan_model_iteration(model);
  std::vector<uint64_t> tickets(layers.size());
  for (int t = 0; t < args.iterations; ++t) {
    const uint64_t step = first + t;
    if (int status = lohan_model_iter_begin(model); status != LOHAN_OK) {
      return Fail("iter-begin", status);
    }
    // Forward: every layer's weights asked for at once.
    for (uint32_t l = 0; l < layers.size(); ++l) {
      if (int status = lohan_model_submit_fetch_params(model, l, &tickets[l]);
          status != LOHAN_OK) {
        return Fail("submit-fetch", status);
      }
    }
    for (size_t l = layers.size(); l-- > 0;) {
      if (int status = lohan_model_wait(model, tickets[l], -1);
          status != LOHAN_OK) {
        return Fail("wait-fetch", status);
      }
    }
    // Backward: every gradient handed over without waiting, from
    // grad_threads threads; the tickets are waited for before ITER_END.
    std::atomic<int> failed{0};
    auto backward = [&](int thread) {
      std::vector<uint8_t> gradient;
      for (size_t back = 0; back < layers.size(); ++back) {
        const uint32_t l = static_cast<uint32_t>(layers.size() - 1 - back);
        if (static_cast<int>(back % args.grad_threads) != thread) continue;
        gradient.resize(layers[l] * element);
        for (uint64_t i = 0; i < layers[l]; ++i) {
          const float g = Gradient(args.seed, step, l, i, args.grad_scale);
          if (bf16) {
            const uint16_t h = FloatToBf16(g);
            std::memcpy(gradient.data() + 2 * i, &h, 2);
          } else {
            std::memcpy(gradient.data() + 4 * i, &g, 4);
          }
        }
        if (int status = lohan_model_grad_ready_from_host(
                model, l, gradient.data(), gradient.size(), &tickets[l]);
            status != LOHAN_OK) {
          failed.store(Fail("grad-ready-from-host", status));
        }
      }
    };
    std::vector<std::thread> threads;
    for (int thread = 1; thread < args.grad_threads; ++thread) {
      threads.emplace_back(backward, thread);
    }
    backward(0);
    for (std::thread& thread : threads) thread.join();
    if (failed.load() != 0) return failed.load();
    for (uint32_t l = 0; l < layers.size(); ++l) {
      if (int status = lohan_model_wait(model, tickets[l], -1);
          status != LOHAN_OK) {
        return Fail("wait-grad", status);
      }
    }
    double norm = 0;
    int clipped = 0, skipped = 0;
    if (int status = lohan_model_iter_end(model, &norm, &clipped, &skipped);
        status != LOHAN_OK) {
      return Fail("iter-end", status);
    }
    std::printf("iteration %llu norm %.9g flags %d\n",
                static_cast<unsigned long long>(step + 1), norm,
                clipped | skipped << 1);
  }

  std::ofstream out(args.out, std::ios::binary);
  std::vector<uint8_t> weights;
  for (uint32_t l = 0; l < layers.size(); ++l) {
    if (int status = lohan_model_read_weights(model, l); status != LOHAN_OK) {
      return Fail("read", status);
    }
    out.write(reinterpret_cast<const char*>(staging), layers[l] * 4);
    // What the next forward would get: FETCH_PARAMS between iterations.
    if (int status = lohan_model_fetch_params(model, l); status != LOHAN_OK) {
      return Fail("fetch", status);
    }
    weights.resize(layers[l] * element);
    if (int status = lohan_model_weights_to_host(model, l, weights.data(),
                                                 weights.size());
        status != LOHAN_OK) {
      return Fail("weights-to-host", status);
    }
    out.write(reinterpret_cast<const char*>(weights.data()), weights.size());
  }
  if (!out) return Fail("write", LOHAN_INTERNAL);
  std::printf("done\n");
  return 0;
}

// ----------------------------------------------------------------- checks

std::string Name(int status) { return lohan_status_name(status); }

void CheckNulls(lohan_model* model, lohan_data_plane* plane) {
  uint64_t ticket = 0;
  int done = 0;
  char buffer[256] = {};
  const std::pair<const char*, int> calls[] = {
      {"submit_grad_ready(NULL)",
       lohan_model_submit_grad_ready(nullptr, 0, &ticket)},
      {"submit_grad_ready(ticket NULL)",
       lohan_model_submit_grad_ready(model, 0, nullptr)},
      {"submit_fetch_params(NULL)",
       lohan_model_submit_fetch_params(nullptr, 0, &ticket)},
      {"submit_fetch_params(ticket NULL)",
       lohan_model_submit_fetch_params(model, 0, nullptr)},
      {"submit_act_put(NULL)",
       lohan_model_submit_act_put(nullptr, 1, 0, 8, &ticket)},
      {"submit_act_put(ticket NULL)",
       lohan_model_submit_act_put(model, 1, 0, 8, nullptr)},
      {"submit_act_get(NULL)",
       lohan_model_submit_act_get(nullptr, 1, 0, 8, &ticket)},
      {"submit_act_get(ticket NULL)",
       lohan_model_submit_act_get(model, 1, 0, 8, nullptr)},
      {"submit_act_free(NULL)",
       lohan_model_submit_act_free(nullptr, 1, &ticket)},
      {"submit_act_free(ticket NULL)",
       lohan_model_submit_act_free(model, 1, nullptr)},
      {"wait(NULL)", lohan_model_wait(nullptr, 1, 0)},
      {"poll(NULL)", lohan_model_poll(nullptr, 1, &done)},
      {"poll(done NULL)", lohan_model_poll(model, 1, nullptr)},
      {"grad_ready_from_host(NULL)",
       lohan_model_grad_ready_from_host(nullptr, 0, buffer, 256, &ticket)},
      {"grad_ready_from_host(source NULL)",
       lohan_model_grad_ready_from_host(model, 0, nullptr, 256, &ticket)},
      {"grad_ready_from_host(ticket NULL)",
       lohan_model_grad_ready_from_host(model, 0, buffer, 256, nullptr)},
      {"weights_to_host(NULL)",
       lohan_model_weights_to_host(nullptr, 0, buffer, 256)},
      {"weights_to_host(destination NULL)",
       lohan_model_weights_to_host(model, 0, nullptr, 256)},
      {"data_plane_cuda_register(NULL)",
       lohan_data_plane_cuda_register(nullptr)},
      {"grad_ready_from_device(NULL)",
       lohan_model_grad_ready_from_device(nullptr, 0, buffer, 256, nullptr,
                                          &ticket)},
      {"grad_ready_from_device(source NULL)",
       lohan_model_grad_ready_from_device(model, 0, nullptr, 256, nullptr,
                                          &ticket)},
      {"grad_ready_from_device(ticket NULL)",
       lohan_model_grad_ready_from_device(model, 0, buffer, 256, nullptr,
                                          nullptr)},
      {"weights_to_device(NULL)",
       lohan_model_weights_to_device(nullptr, 0, buffer, 256, nullptr)},
      {"weights_to_device(destination NULL)",
       lohan_model_weights_to_device(model, 0, nullptr, 256, nullptr)},
      {"data_plane_cuda_register_on_device(NULL)",
       lohan_data_plane_cuda_register_on_device(nullptr, 0)},
      {"data_plane_cuda_register_on_device(device -1)",
       lohan_data_plane_cuda_register_on_device(plane, -1)},
      {"grad_ready_from_device_on_device(NULL)",
       lohan_model_grad_ready_from_device_on_device(nullptr, 0, 0, buffer, 256,
                                                    nullptr, &ticket)},
      {"grad_ready_from_device_on_device(device -1)",
       lohan_model_grad_ready_from_device_on_device(model, 0, -1, buffer, 256,
                                                    nullptr, &ticket)},
      {"grad_ready_from_device_on_device(source NULL)",
       lohan_model_grad_ready_from_device_on_device(model, 0, 0, nullptr, 256,
                                                    nullptr, &ticket)},
      {"weights_to_device_on_device(NULL)",
       lohan_model_weights_to_device_on_device(nullptr, 0, 0, buffer, 256,
                                               nullptr)},
      {"weights_to_device_on_device(device -1)",
       lohan_model_weights_to_device_on_device(model, 0, -1, buffer, 256,
                                               nullptr)},
      {"read_state(NULL)",
       lohan_model_read_state(nullptr, 0, LOHAN_STATE_EXP_AVG)},
      {"init_state(NULL)",
       lohan_model_init_state(nullptr, 0, LOHAN_STATE_EXP_AVG)},
      {"iter_abort(NULL)", lohan_model_iter_abort(nullptr)},
      {"iter_end_global(NULL)",
       lohan_model_iter_end_global(nullptr, 1.0, nullptr, nullptr, nullptr)},
  };
  int invalid = 0;
  for (const auto& [what, status] : calls) {
    Check(status == LOHAN_INVALID_ARGUMENT,
          std::string(what) + " gave " + Name(status));
    invalid += status == LOHAN_INVALID_ARGUMENT;
  }
  (void)plane;
  std::printf("nulls: %d of %zu INVALID_ARGUMENT\n", invalid,
              sizeof(calls) / sizeof(calls[0]));
}

void CheckSizes(lohan_model* model) {
  uint64_t ticket = 0;
  std::vector<uint8_t> buffer(lohan_model_layer_bytes(model, 0) + 8);
  int status = lohan_model_grad_ready_from_host(
      model, 0, buffer.data(), lohan_model_layer_bytes(model, 0) - 4, &ticket);
  std::printf("short-gradient: %s: %s\n", Name(status).c_str(),
              lohan_last_error());
  status = lohan_model_weights_to_host(model, 0, buffer.data(),
                                       lohan_model_layer_bytes(model, 0) + 8);
  std::printf("long-weights: %s: %s\n", Name(status).c_str(),
              lohan_last_error());
  status =
      lohan_model_grad_ready_from_host(model, 99, buffer.data(), 4, &ticket);
  std::printf("layer-out-of-range: %s: %s\n", Name(status).c_str(),
              lohan_last_error());
}

// Adam moments through staging: read (zero after init_weights), replaced,
// read back; refused with a bad part, a part the job lacks, or inside an
// iteration. Leaves the moments zero (zero gradients keep them so).
void CheckStates(lohan_model* model) {
  float* staging = lohan_model_staging(model);
  const uint64_t n = lohan_model_layer_bytes(model, 1) / 4;  // fp32 model
  for (int part : {LOHAN_STATE_EXP_AVG, LOHAN_STATE_EXP_AVG_SQ}) {
    for (uint64_t i = 0; i < n; ++i) staging[i] = -1.0f;
    Check(lohan_model_read_state(model, 1, part) == LOHAN_OK, "read_state");
    bool zero = true;
    for (uint64_t i = 0; i < n; ++i) zero &= staging[i] == 0.0f;
    Check(zero, "moments of a new layer are zero");
    for (uint64_t i = 0; i < n; ++i) staging[i] = 0.25f * part + i;
    Check(lohan_model_init_state(model, 1, part) == LOHAN_OK, "init_state");
  }
  bool restored = true;
  for (int part : {LOHAN_STATE_EXP_AVG, LOHAN_STATE_EXP_AVG_SQ}) {
    Check(lohan_model_read_state(model, 1, part) == LOHAN_OK, "read_state");
    for (uint64_t i = 0; i < n; ++i) restored &= staging[i] == 0.25f * part + i;
  }
  std::printf("state-roundtrip: %s\n", restored ? "ok" : "CORRUPT");
  Check(restored, "moments restored");
  int status = lohan_model_read_state(model, 1, 7);
  std::printf("state-bad-part: %s: %s\n", Name(status).c_str(),
              lohan_last_error());
  status = lohan_model_read_state(model, 1, LOHAN_STATE_MAX_EXP_AVG_SQ);
  std::printf("state-max-without-amsgrad: %s: %s\n", Name(status).c_str(),
              lohan_last_error());
  status = lohan_model_init_state(model, 99, LOHAN_STATE_EXP_AVG);
  std::printf("state-layer-out-of-range: %s: %s\n", Name(status).c_str(),
              lohan_last_error());
  for (int part : {LOHAN_STATE_EXP_AVG, LOHAN_STATE_EXP_AVG_SQ}) {
    for (uint64_t i = 0; i < n; ++i) staging[i] = 0.0f;
    Check(lohan_model_init_state(model, 1, part) == LOHAN_OK, "init_state 0");
  }
  Check(lohan_model_iter_begin(model) == LOHAN_OK, "iter_begin");
  status = lohan_model_init_state(model, 1, LOHAN_STATE_EXP_AVG);
  std::printf("state-in-iteration: %s: %s\n", Name(status).c_str(),
              lohan_last_error());
  for (uint32_t l = 0; l < 3; ++l) {
    std::vector<float> zeros(lohan_model_layer_bytes(model, l) / 4, 0.0f);
    uint64_t ticket = 0;
    Check(lohan_model_grad_ready_from_host(
              model, l, zeros.data(), zeros.size() * 4, &ticket) == LOHAN_OK &&
              lohan_model_wait(model, ticket, -1) == LOHAN_OK,
          "grad_ready");
  }
  Check(lohan_model_iter_end(model, nullptr, nullptr, nullptr) == LOHAN_OK,
        "iter_end");
}

void CheckTickets(lohan_model* model) {
  uint64_t ticket = 0;
  Check(lohan_model_submit_act_put(model, 1, 0, 64, &ticket) == LOHAN_OK,
        "act_put");
  Check(lohan_model_wait(model, ticket, -1) == LOHAN_OK, "wait act_put");
  int status = lohan_model_wait(model, ticket, -1);
  std::printf("wait-twice: %s: %s\n", Name(status).c_str(), lohan_last_error());
  int done = 0;
  status = lohan_model_poll(model, ticket, &done);
  std::printf("poll-consumed: %s\n", Name(status).c_str());
  status = lohan_model_wait(model, ticket + 1000, 0);
  std::printf("wait-never-issued: %s: %s\n", Name(status).c_str(),
              lohan_last_error());
  Check(lohan_model_act_free(model, 1) == LOHAN_OK, "act_free");
}

// Many requests in flight at once, several failing: every ticket gets its
// own result and text.
void CheckInFlight(lohan_model* model, uint32_t layers) {
  uint64_t area = 0;
  auto* activations =
      static_cast<uint8_t*>(lohan_model_activation_buffer(model, &area));
  constexpr uint64_t kActivation = 1024;
  constexpr int kActivations = 4;
  for (int a = 0; a < kActivations; ++a) {
    std::memset(activations + a * kActivation, 0x10 + a, kActivation);
  }
  Check(lohan_model_iter_begin(model) == LOHAN_OK, "iter_begin");
  struct Sent {
    std::string what;
    uint64_t ticket;
  };
  std::vector<Sent> sent;
  uint64_t ticket = 0;
  // Records the request just submitted (its status, and `ticket` it wrote).
  auto add = [&](std::string what, int status) {
    Check(status == LOHAN_OK, "submit " + what);
    sent.push_back({std::move(what), ticket});
  };
  for (int a = 0; a < kActivations; ++a) {
    int status = lohan_model_submit_act_put(model, 10 + a, a * kActivation,
                                            kActivation, &ticket);
    add("act_put " + std::to_string(10 + a), status);
    // Activations never put: NOT_FOUND, each naming its id.
    status = lohan_model_submit_act_free(model, 1000 + a, &ticket);
    add("act_free " + std::to_string(1000 + a), status);
  }
  for (uint32_t l = 0; l < layers; ++l) {
    add("fetch_params " + std::to_string(l),
        lohan_model_submit_fetch_params(model, l, &ticket));
  }
  for (uint32_t l = layers; l-- > 0;) {
    std::vector<float> gradient(lohan_model_layer_bytes(model, l) / 4, 0.5f);
    add("grad_ready " + std::to_string(l),
        lohan_model_grad_ready_from_host(model, l, gradient.data(),
                                         gradient.size() * 4, &ticket));
  }
  // A gradient handed over twice in one iteration fails too.
  add("grad_ready again 0", lohan_model_submit_grad_ready(model, 0, &ticket));
  std::printf("in-flight: %zu requests submitted\n", sent.size());
  for (size_t i = sent.size(); i-- > 0;) {
    const int status = lohan_model_wait(model, sent[i].ticket, -1);
    std::printf("in-flight %s: %s%s%s\n", sent[i].what.c_str(),
                Name(status).c_str(), status == LOHAN_OK ? "" : ": ",
                status == LOHAN_OK ? "" : lohan_last_error());
  }
  // The area is rewritten, then every activation comes back at once.
  std::memset(activations, 0, kActivations * kActivation);
  std::vector<uint64_t> gets;
  for (int a = 0; a < kActivations; ++a) {
    Check(lohan_model_submit_act_get(model, 10 + a, a * kActivation,
                                     kActivation, &ticket) == LOHAN_OK,
          "submit act_get");
    gets.push_back(ticket);
  }
  bool restored = true;
  for (int a = kActivations; a-- > 0;) {
    Check(lohan_model_wait(model, gets[a], -1) == LOHAN_OK, "wait act_get");
    for (uint64_t i = 0; i < kActivation; ++i) {
      restored &= activations[a * kActivation + i] == 0x10 + a;
    }
    Check(lohan_model_submit_act_free(model, 10 + a, &ticket) == LOHAN_OK &&
              lohan_model_wait(model, ticket, -1) == LOHAN_OK,
          "act_free");
  }
  std::printf("in-flight act_get: %s\n", restored ? "restored" : "CORRUPT");
  Check(restored, "activations restored");
  double norm = 0;
  Check(lohan_model_iter_end(model, &norm, nullptr, nullptr) == LOHAN_OK,
        "iter_end");
}

// Several threads, each swapping its own activations through the daemon
// (sync and async mixed, polls too).
void CheckThreads(lohan_model* model) {
  uint64_t area = 0;
  auto* activations =
      static_cast<uint8_t*>(lohan_model_activation_buffer(model, &area));
  constexpr int kThreads = 4;
  constexpr uint64_t kBytes = 2048;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      uint8_t* mine = activations + t * kBytes;
      for (int round = 0; round < 40; ++round) {
        const uint64_t id = 5000 + t * 100 + round;
        std::memset(mine, t * 16 + round % 16, kBytes);
        uint64_t put = 0, get = 0, freed = 0;
        if (lohan_model_submit_act_put(model, id, t * kBytes, kBytes, &put) !=
                LOHAN_OK ||
            lohan_model_wait(model, put, -1) != LOHAN_OK) {
          ++bad;
          continue;
        }
        std::memset(mine, 0xff, kBytes);
        if (round % 2 == 0) {
          if (lohan_model_act_get(model, id, t * kBytes, kBytes) != LOHAN_OK) {
            ++bad;
          }
        } else {
          int done = 0;
          if (lohan_model_submit_act_get(model, id, t * kBytes, kBytes, &get) !=
              LOHAN_OK) {
            ++bad;
            continue;
          }
          while (lohan_model_poll(model, get, &done) == LOHAN_OK && !done) {
            std::this_thread::yield();
          }
          if (!done || lohan_model_wait(model, get, 0) != LOHAN_OK) ++bad;
        }
        for (uint64_t i = 0; i < kBytes; ++i) {
          if (mine[i] != t * 16 + round % 16) {
            ++bad;
            break;
          }
        }
        if (lohan_model_submit_act_free(model, id, &freed) != LOHAN_OK ||
            lohan_model_wait(model, freed, -1) != LOHAN_OK) {
          ++bad;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::printf("threads: %d threads x 40 rounds, %d bad\n", kThreads,
              bad.load());
  Check(bad.load() == 0, "threads");
}

void CheckCuda(lohan_model* model, lohan_data_plane* plane) {
  const int built = lohan_cuda_built_with();
  const int available = lohan_cuda_available();
  std::printf("cuda: built-with %d available %d reason: %s\n", built, available,
              available ? "" : lohan_last_error());
  const uint64_t bytes = lohan_model_layer_bytes(model, 0);
  std::vector<float> host(bytes / 4);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.25f * i;
  uint64_t ticket = 0;
  if (!available) {
    // Everything CUDA fails cleanly, saying why.
    const int registered = lohan_data_plane_cuda_register(plane);
    std::printf("cuda-register: %s: %s\n", Name(registered).c_str(),
                lohan_last_error());
    const int from = lohan_model_grad_ready_from_device(
        model, 0, host.data(), bytes, nullptr, &ticket);
    std::printf("cuda-grad-ready-from-device: %s: %s\n", Name(from).c_str(),
                lohan_last_error());
    const int to =
        lohan_model_weights_to_device(model, 0, host.data(), bytes, nullptr);
    std::printf("cuda-weights-to-device: %s: %s\n", Name(to).c_str(),
                lohan_last_error());
    const int registered_on =
        lohan_data_plane_cuda_register_on_device(plane, 0);
    const int from_on = lohan_model_grad_ready_from_device_on_device(
        model, 0, 0, host.data(), bytes, nullptr, &ticket);
    const int to_on = lohan_model_weights_to_device_on_device(
        model, 0, 0, host.data(), bytes, nullptr);
    std::printf("cuda-on-device: %s %s %s\n", Name(registered_on).c_str(),
                Name(from_on).c_str(), Name(to_on).c_str());
    Check(registered_on == registered && from_on == from && to_on == to,
          "the *_on_device functions fail as the others do");
    return;
  }
#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA
  // A GPU: device memory and a stream from this program's own CUDA runtime
  // (as torch's would be), copies through liblohan_client's.
  int current = -1;
  Check(cudaGetDevice(&current) == cudaSuccess, "cudaGetDevice");
  Check(lohan_data_plane_cuda_register_on_device(plane, current) == LOHAN_OK,
        "cuda register on the current device");
  Check(lohan_data_plane_cuda_register(plane) == LOHAN_OK,
        "cuda register twice");
  void* device = nullptr;
  cudaStream_t stream = nullptr;
  Check(cudaMalloc(&device, bytes) == cudaSuccess, "cudaMalloc");
  Check(cudaStreamCreate(&stream) == cudaSuccess, "cudaStreamCreate");
  Check(cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice) ==
            cudaSuccess,
        "cudaMemcpy to device");
  Check(lohan_model_iter_begin(model) == LOHAN_OK, "iter_begin");
  std::vector<uint64_t> tickets;
  for (uint32_t l = 0; l < 3; ++l) {
    if (l == 0) {
      Check(lohan_model_grad_ready_from_device(model, 0, device, bytes, stream,
                                               &ticket) == LOHAN_OK,
            "grad_ready_from_device");
    } else {
      std::vector<float> zeros(lohan_model_layer_bytes(model, l) / 4, 0.0f);
      Check(lohan_model_grad_ready_from_host(
                model, l, zeros.data(), zeros.size() * 4, &ticket) == LOHAN_OK,
            "grad_ready_from_host");
    }
    tickets.push_back(ticket);
  }
  // iter_end waits for the device gradient's submission by itself; the
  // tickets are waited for after it here on purpose.
  double norm = 0;
  Check(lohan_model_iter_end(model, &norm, nullptr, nullptr) == LOHAN_OK,
        "iter_end after a device gradient");
  for (uint64_t t : tickets) {
    Check(lohan_model_wait(model, t, -1) == LOHAN_OK, "wait device ticket");
  }
  Check(std::memcmp(lohan_model_grad_buffer(model, 0), host.data(), bytes) == 0,
        "gradient copied from the device");
  // The updated weights: what the daemon committed (read into staging)
  // must be what reaches the device after FETCH_PARAMS.
  Check(lohan_model_read_weights(model, 0) == LOHAN_OK, "read_weights");
  std::vector<float> committed(lohan_model_staging(model),
                               lohan_model_staging(model) + host.size());
  Check(lohan_model_fetch_params(model, 0) == LOHAN_OK, "fetch_params");
  std::vector<float> back(host.size(), -1.0f);
  Check(lohan_model_weights_to_device_on_device(model, 0, current, device,
                                                bytes, stream) == LOHAN_OK,
        "weights_to_device_on_device");
  int after = -1;
  Check(cudaGetDevice(&after) == cudaSuccess && after == current,
        "the current device did not move");
  // The buffer is held until the copy has read it; the refill waits.
  Check(lohan_model_fetch_params(model, 0) == LOHAN_OK,
        "fetch_params after weights_to_device");
  Check(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
  Check(cudaMemcpy(back.data(), device, bytes, cudaMemcpyDeviceToHost) ==
            cudaSuccess,
        "cudaMemcpy back");
  Check(std::memcmp(back.data(), committed.data(), bytes) == 0,
        "committed weights copied to the device");
  cudaStreamDestroy(stream);
  cudaFree(device);
  std::printf("cuda-roundtrip: %s\n", failures == 0 ? "ok" : "FAILED");
#else
  Check(false, "CUDA available but this program was built without it");
#endif
}

int Checks(const std::string& socket) {
  Session session;
  const std::vector<uint64_t> layers = {64, 128, 32};
  if (int status = Open(socket, "abi-checks", layers, LOHAN_DTYPE_FP32,
                        Layout{.activation_bytes = 64 << 10}, session);
      status != 0) {
    return status;
  }
  lohan_model* model = session.model;
  float* staging = lohan_model_staging(model);
  for (uint32_t l = 0; l < layers.size(); ++l) {
    for (uint64_t i = 0; i < layers[l]; ++i) staging[i] = 0.01f * i;
    Check(lohan_model_init_weights(model, l) == LOHAN_OK, "init_weights");
  }
  CheckNulls(model, session.plane);
  CheckSizes(model);
  CheckStates(model);
  CheckTickets(model);
  CheckInFlight(model, static_cast<uint32_t>(layers.size()));
  CheckThreads(model);
  CheckCuda(model, session.plane);
  std::printf("checks: %d failures\n", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace lohan::testing

int main(int argc, char** argv) {
  lohan::testing::TrainArgs args;
  CLI::App app{"C ABI client: asynchronous requests and copies"};
  app.require_subcommand(1);
  CLI::App* train = app.add_subcommand("train", "train the synthetic model");
  train->add_option("--socket", args.socket)->required();
  train->add_option("--job", args.job)->required();
  train->add_option("--layers", args.layers);
  train->add_option("--iterations", args.iterations);
  train->add_option("--dtype", args.dtype);
  train->add_option("--grad-scale", args.grad_scale);
  train->add_option("--seed", args.seed);
  train->add_option("--chunk", args.chunk);
  train->add_option("--grad-threads", args.grad_threads)
      ->check(CLI::Range(1, 64));
  train->add_option("--max-norm", args.max_norm);
  train->add_option("--grad-slots", args.grad_slots);
  train->add_option("--weight-slots", args.weight_slots);
  train->add_option("--host-pool", args.host_pool);
  train->add_option("--out", args.out)->required();
  std::string checks_socket;
  CLI::App* checks = app.add_subcommand("checks", "the ABI's edges");
  checks->add_option("--socket", checks_socket)->required();
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (*train) return lohan::testing::Train(args);
  return lohan::testing::Checks(checks_socket);
}
