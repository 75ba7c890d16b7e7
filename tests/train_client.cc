// A training process in miniature: drives a synthetic N-layer model through a
// real lohand on liblohan_client's C ABI (the library's code linked in, not
// liblohan_client.so, so a copy of the binary runs outside the runfiles, as
// another user too), one synchronous request at a time, the way the PyTorch
// plugin does, and writes the final fp32 master weights to a file.
//
//   train_client --socket S --job NAME --layers 1000,5000,333 --iterations 4
//                [--dtype fp32|bf16] [--max-norm X] [--grad-scale X]
//                [--seed N] [--chunk N] [--die-in-iteration K]
//                [--grad-slots K] [--weight-slots K] [--host-pool BYTES]
//                [--fit-arena [--register-resident]] [--ignore-share]
//                [--ignore-grow]
//                [--answer-shrink resident|acknowledge --answer-file F]
//                [--device-ms MS] [--commit-interval N] --out FILE
//
// Per iteration: ITER_BEGIN, FETCH_PARAMS for every layer (forward), then
// GRAD_READY from the last layer to the first (backward), then ITER_END.
// --die-in-iteration K: in iteration K (1-based), after handing over half
// the gradients, the process kills itself (SIGKILL): a client dying
// mid-iteration. The job keeps its name, so a rerun attaches to it again.
// --hold-in-iteration K: the same point, but it waits there until killed.
// Prints one line per iteration: "iteration T norm N flags F" (F: the
// ITER_END completion's kIterEnd* bits; skipped iterations are non-finite
// ones, the model skipping those).
// After each iteration it follows lohand's ask to move to another arena
// (lohan_job_follow_share), printing "moved to a N byte arena (G grad
// buffers)" per move and taking every buffer pointer again;
// --ignore-share never follows (a client that does not shrink);
// --ignore-grow follows asks to shrink, never those to grow;
// --answer-shrink MODE answers lohand's first ask to shrink wrongly (the
// bad input of tests/elastic_shares_hostile_test.cc), writing what it got
// to --answer-file F (whole: written aside and renamed), and follows later
// asks:
//   resident: begins the move (waits for the commit, closes its plane and
//     opens it again), then registers the model laid out as given with a
//     buffer per layer, more than the arena lohand grants: once refused it
//     registers the model as before on the same plane and trains on; F
//     says "resident: CODE: text" and "resumed at iteration I of committed
//     C in N bytes (G grad buffers)";
//   acknowledge: waits for the commit (as a move begins) and moves no
//     further: asks ITER_COMMITTED every 20 ms until a request fails; F
//     says "acknowledged at iteration C" and "closed: CODE: text", and it
//     exits 1;
// --moves-file F appends a line per move to F: the arena bytes before and
// after, the seconds it took and, with --lohand-pid, lohand's storage
// bytes read and written meanwhile (/proc/<pid>/io; the job is between
// iterations, so they are the move's).
// --grad-slots / --weight-slots: ModelSpec's (0: one buffer per layer;
// K < layers: K shared buffers, the data streamed through the daemon's
// SSDs); layer l's buffers are those the registration gave (buffer l % K).
// --host-pool: the job's arena when this run creates it. --fit-arena: this
// run creates the job for its model instead (JobSpec.model, the daemon
// sizing the arena) and registers it with ARENA_FIT_MOST: laid out in the
// arena its plane got; with --register-resident it registers the model
// laid out as given with a buffer per layer instead (ARENA_FIT_AS_GIVEN,
// no grad_slots or weight_slots), which no smaller arena holds.
// The dump holds, per layer, the fp32 master weights and the weights
// FETCH_PARAMS gives after training (the 16-bit copy, or fp32 weights).
// --hold: after training, keep the data plane open until killed.
// --until-file F: stop after the first iteration (of at most --iterations)
// at whose end F exists, writing the iterations this run trained to
// F.iterations, then dump and exit as after the last.
// --pause-after K --resume-file F: after K iterations, create F.paused and
// wait (data plane open) until F exists, then go on. With --pause-mid, the
// pause is half-way through the next iteration's backward instead; with
// --pause-after-forward, between its forward and its backward.
// --swap-bytes N: the model gets an N-byte activation area
// (ModelSpec.activation_bytes) and each iteration swaps N bytes per layer
// through it: ACT_PUT after the layer's FETCH_PARAMS (forward), ACT_GET
// (its bytes checked) and ACT_FREE before its GRAD_READY (backward). A put
// refused RESOURCE_EXHAUSTED (lohand has no room for it on the SSDs) is
// kept in this process's memory instead, as the plugin does, and training
// goes on. --swap-file F: at the end, writes "puts P refused R" to F.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/optim/half.h"
#include "google/protobuf/util/json_util.h"
#include "lohan/lohan_client.h"
#include "proto/lohan.pb.h"
#include "tests/harness/proc_io.h"
#include "tests/synthetic_model.h"

namespace lohan::testing {
namespace {

// The ITER_END completion's flags (wire/ring_entry.h's kIterEnd*), as the
// lines print them.
constexpr unsigned kClipped = 1u << 0;
constexpr unsigned kSkipped = 1u << 1;
constexpr unsigned kNonfinite = 1u << 2;

// The failed step and the library's status, as "step: CODE: text".
int Fail(const char* step, int status) {
  std::printf("%s: %s: %s\n", step, lohan_status_name(status),
              lohan_last_error());
  return 1;
}

int FailWith(const char* step, const std::string& text) {
  std::printf("%s: %s\n", step, text.c_str());
  return 1;
}

struct Args {
  std::string socket, job, layers = "1000,5000,333", dtype = "fp32", out;
  int iterations = 3;
  double max_norm = 0.0;
  double grad_scale = 0.01;
  uint64_t seed = 7;
  uint64_t chunk = 2048;
  // 0: lohand's default durability; N: every N-th iteration durable.
  uint32_t commit_interval = 0;
  int die_in_iteration = 0;
  int hold_in_iteration = 0;
  uint32_t grad_slots = 0;
  uint32_t weight_slots = 0;
  uint64_t host_pool = uint64_t{16} << 20;
  bool hold = false;
  int pause_after = 0;
  std::string resume_file;
  std::string until_file;
  bool pause_mid = false;
  // Create the job for its model (JobSpec.model) and register it with
  // ARENA_FIT_MOST: the daemon sizes the arena and lays the model out in
  // the one the plane gets.
  bool fit_arena = false;
  // With fit_arena: register the model laid out as given, a buffer per
  // layer, all the same.
  bool register_resident = false;
  // Never follow lohand's asks to move to another arena.
  bool ignore_share = false;
  // Follow asks to shrink only.
  bool ignore_grow = false;
  // How the first ask to shrink is answered wrongly (empty: it is not).
  std::string answer_shrink;
  std::string answer_file;
  std::string moves_file;
  int lohand_pid = 0;
  bool pause_after_forward = false;
  uint64_t swap_bytes = 0;
  std::string swap_file;
  // Milliseconds an accelerator would compute per step, waited (not
  // computed: the process leaves the host's cores free, as one waiting on
  // its GPU does): a third in forward, two thirds in backward, spread over
  // the layers.
  double device_ms = 0;
};

// Waits `share` of an iteration's --device-ms for one layer.
void DeviceCompute(const Args& args, double share, size_t layers) {
  if (args.device_ms <= 0) return;
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(
      args.device_ms * share / static_cast<double>(layers)));
}

// The client's handles, destroyed in reverse.
struct Session {
  lohan_client* client = nullptr;
  lohan_data_plane* plane = nullptr;
  lohan_model* model = nullptr;
  std::string job_id;
  // --answer-shrink answered lohand's first ask to shrink.
  bool answered = false;

  ~Session() {
    lohan_model_destroy(model);
    lohan_data_plane_destroy(plane);
    lohan_client_destroy(client);
  }
};

// See --pause-after.
void PauseUntilResumed(const Args& args, int iterations_done) {
  // Whoever waits for this line may stop reading: later lines must not
  // kill us (SIGPIPE).
  signal(SIGPIPE, SIG_IGN);
  std::printf("paused after %d iterations%s\n", iterations_done,
              args.pause_after_forward ? " and a forward"
              : args.pause_mid         ? " and half a backward"
                                       : "");
  std::fflush(stdout);
  std::ofstream(args.resume_file + ".paused") << "paused\n";
  while (access(args.resume_file.c_str(), F_OK) != 0) usleep(10 * 1000);
}

v1::ModelSpec SpecOf(const Args& args, const std::vector<uint64_t>& layers) {
  v1::ModelSpec model;
  for (uint64_t n : layers) model.add_layer_elements(n);
  model.set_dtype(args.dtype == "bf16" ? v1::DTYPE_BF16 : v1::DTYPE_FP32);
  const SyntheticAdam adam;
  model.mutable_adam()->set_lr(adam.lr);
  model.mutable_adam()->set_beta1(adam.beta1);
  model.mutable_adam()->set_beta2(adam.beta2);
  model.mutable_adam()->set_eps(adam.eps);
  model.mutable_adam()->set_weight_decay(adam.weight_decay);
  model.mutable_adam()->set_decoupled_weight_decay(true);
  model.set_max_grad_norm(args.max_norm);
  model.set_skip_nonfinite(true);
  model.set_chunk_elements(args.chunk);
  model.set_grad_slots(args.grad_slots);
  model.set_weight_slots(args.weight_slots);
  if (args.fit_arena) model.set_arena_fit(v1::ARENA_FIT_MOST);
  model.set_activation_bytes(args.swap_bytes);
  model.set_commit_interval(args.commit_interval);
  return model;
}

// `spec` laid out as given with a buffer per layer (ARENA_FIT_AS_GIVEN, no
// shared buffers): the largest arena the model takes.
v1::ModelSpec ResidentAsGiven(v1::ModelSpec spec) {
  spec.set_arena_fit(v1::ARENA_FIT_AS_GIVEN);
  spec.set_grad_slots(0);
  spec.set_weight_slots(0);
  return spec;
}

std::string Json(const google::protobuf::Message& message) {
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json);
  return json;
}

// The job of that name, found or created; attached, its plane open and
// the model registered. 0 or the failure's exit code (printed).
int Open(const Args& args, const v1::ModelSpec& model, Session& session) {
  int status = lohan_client_connect(args.socket.c_str(), &session.client);
  if (status != LOHAN_OK) return Fail("connect", status);
  lohan_job_list* list = nullptr;
  status = lohan_jobs_list(session.client, &list);
  if (status != LOHAN_OK) return Fail("list", status);
  for (size_t i = 0; i < lohan_job_list_size(list); ++i) {
    const lohan_job_info* job = lohan_job_list_get(list, i);
    if (args.job == lohan_job_info_name(job)) {
      session.job_id = lohan_job_info_id(job);
    }
  }
  lohan_job_list_destroy(list);
  if (session.job_id.empty()) {
    if (args.fit_arena) {
      v1::CreateJobRequest request;
      request.mutable_spec()->set_name(args.job);
      *request.mutable_spec()->mutable_model() = model;
      char* response = nullptr;
      status = lohan_job_create_json(session.client, Json(request).c_str(),
                                     &response);
      if (status != LOHAN_OK) return Fail("create", status);
      v1::CreateJobResponse created;
      const bool parsed =
          google::protobuf::util::JsonStringToMessage(response, &created).ok();
      lohan_string_free(response);
      if (!parsed) return FailWith("create", "unreadable CreateJobResponse");
      session.job_id = created.job().id();
    } else {
      lohan_job_info* job = nullptr;
      status = lohan_job_create(session.client, args.job.c_str(),
                                args.host_pool, 0, &job);
      if (status != LOHAN_OK) return Fail("create", status);
      session.job_id = lohan_job_info_id(job);
      lohan_job_info_destroy(job);
    }
  }
  status = lohan_job_attach(session.client, session.job_id.c_str(), nullptr);
  if (status != LOHAN_OK) return Fail("attach", status);
  status = lohan_data_plane_open(session.client, session.job_id.c_str(),
                                 &session.plane);
  if (status != LOHAN_OK) return Fail("data-plane", status);
  const v1::ModelSpec registered =
      args.register_resident ? ResidentAsGiven(model) : model;
  status = lohan_model_register_json(session.client, session.plane,
                                     session.job_id.c_str(),
                                     Json(registered).c_str(), &session.model);
  if (status != LOHAN_OK) return Fail("register", status);
  return 0;
}

// The layer's gradient of `step` into its buffer, then GRAD_READY.
int HandOver(const Args& args, lohan_model* model, uint64_t step, uint32_t l,
             uint64_t elements) {
  uint8_t* grad = static_cast<uint8_t*>(lohan_model_grad_buffer(model, l));
  if (grad == nullptr) return FailWith("grad-buffer", "none for the layer");
  for (uint64_t i = 0; i < elements; ++i) {
    const float g = Gradient(args.seed, step, l, i, args.grad_scale);
    if (args.dtype == "bf16") {
      reinterpret_cast<uint16_t*>(grad)[i] = FloatToBf16(g);
    } else {
      reinterpret_cast<float*>(grad)[i] = g;
    }
  }
  if (int status = lohan_model_grad_ready(model, l); status != LOHAN_OK) {
    return Fail("grad-ready", status);
  }
  return 0;
}

// lohand's storage bytes so far (zeros without its pid).
ProcIo StorageBytesOf(int pid) { return pid > 0 ? ReadProcIo(pid) : ProcIo{}; }

// The library's last failure, as "CODE: text".
std::string LastFailure(int status) {
  return absl::StrCat(lohan_status_name(status), ": ", lohan_last_error());
}

// `text` into `path`, whole or not at all (the test reads it once there).
int WriteWhole(const std::string& path, const std::string& text) {
  const std::string partial = path + ".part";
  std::ofstream(partial) << text;
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    return FailWith("answer-file", "INTERNAL: cannot write " + path);
  }
  return 0;
}

// --answer-shrink resident (see the file's comment): the model registered
// again as `spec`, at the job's committed iteration, once lohand refused
// it a buffer per layer.
int AnswerResident(const Args& args, const v1::ModelSpec& spec,
                   Session& session) {
  uint64_t committed = 0;
  if (int status = lohan_model_await_committed(session.model, &committed);
      status != LOHAN_OK) {
    return Fail("await-committed", status);
  }
  lohan_model_destroy(session.model);
  session.model = nullptr;
  lohan_data_plane_destroy(session.plane);
  session.plane = nullptr;
  if (int status = lohan_job_reopen_data_plane(
          session.client, session.job_id.c_str(), &session.plane);
      status != LOHAN_OK) {
    return Fail("reopen", status);
  }
  lohan_model* accepted = nullptr;
  const int wrong = lohan_model_register_json(
      session.client, session.plane, session.job_id.c_str(),
      Json(ResidentAsGiven(spec)).c_str(), &accepted);
  if (wrong == LOHAN_OK) {
    session.model = accepted;
    return FailWith(
        "answer-shrink",
        absl::StrCat("a buffer per layer was accepted in ",
                     lohan_data_plane_arena_size(session.plane), " bytes"));
  }
  const std::string refused = LastFailure(wrong);
  if (int status = lohan_model_register_json(
          session.client, session.plane, session.job_id.c_str(),
          Json(spec).c_str(), &session.model);
      status != LOHAN_OK) {
    return Fail("register-again", status);
  }
  const uint64_t resumed = lohan_model_iteration(session.model);
  if (int failed = WriteWhole(
          args.answer_file,
          absl::StrCat("resident: ", refused, "\nresumed at iteration ",
                       resumed, " of committed ", committed, " in ",
                       lohan_data_plane_arena_size(session.plane), " bytes (",
                       lohan_model_grad_slots(session.model),
                       " grad buffers)\n"));
      failed != 0) {
    return failed;
  }
  std::printf("registered again after a refused buffer per layer\n");
  return resumed == committed
             ? 0
             : FailWith("register-again", "not at the committed iteration");
}

// --answer-shrink acknowledge (see the file's comment): never returns 0.
int AnswerAcknowledge(const Args& args, Session& session) {
  uint64_t committed = 0;
  int status = lohan_model_await_committed(session.model, &committed);
  if (status != LOHAN_OK) return Fail("await-committed", status);
  while (status == LOHAN_OK) {
    usleep(20 * 1000);
    status = lohan_model_await_committed(session.model, nullptr);
  }
  const std::string closed = LastFailure(status);
  if (int failed =
          WriteWhole(args.answer_file,
                     absl::StrCat("acknowledged at iteration ", committed,
                                  "\nclosed: ", closed, "\n"));
      failed != 0) {
    return failed;
  }
  return Fail("await-committed", status);
}

// After an iteration: moves to the arena lohand asked for, if it asked
// (and we follow), or answers it as --answer-shrink says. Every pointer
// into the arena is taken anew after it.
int FollowShare(const Args& args, const v1::ModelSpec& spec, Session& session) {
  if (args.ignore_share) return 0;
  uint64_t asked = 0;
  if (int status = lohan_model_arena_asked(session.model, &asked);
      status != LOHAN_OK) {
    return Fail("arena-asked", status);
  }
  const uint64_t held = lohan_data_plane_arena_size(session.plane);
  if (asked > held && args.ignore_grow) return 0;
  if (asked != 0 && asked < held && !args.answer_shrink.empty() &&
      !session.answered) {
    session.answered = true;
    if (args.answer_shrink == "resident") {
      return AnswerResident(args, spec, session);
    }
    if (args.answer_shrink == "acknowledge") {
      return AnswerAcknowledge(args, session);
    }
    return FailWith("args", "INVALID_ARGUMENT: --answer-shrink");
  }
  int moved = 0;
  const uint64_t from = lohan_data_plane_arena_size(session.plane);
  const ProcIo before = StorageBytesOf(args.lohand_pid);
  const auto began = std::chrono::steady_clock::now();
  if (int status =
          lohan_job_follow_share(session.client, session.job_id.c_str(),
                                 session.plane, session.model, &moved);
      status != LOHAN_OK) {
    return Fail("follow-share", status);
  }
  if (moved != 0 && !args.moves_file.empty()) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - began)
            .count();
    const ProcIo after = StorageBytesOf(args.lohand_pid);
    std::ofstream(args.moves_file, std::ios::app)
        << from << " " << lohan_data_plane_arena_size(session.plane) << " "
        << seconds << " " << after.read - before.read << " "
        << after.written - before.written << "\n";
  }
  if (moved != 0) {
    std::printf("moved to a %llu byte arena (%u grad buffers)\n",
                static_cast<unsigned long long>(
                    lohan_data_plane_arena_size(session.plane)),
                lohan_model_grad_slots(session.model));
    std::fflush(stdout);
  }
  return 0;
}

// The bytes layer `l` swaps out in the iteration of `step` (--swap-bytes).
void FillActivation(const Args& args, uint64_t step, uint32_t l,
                    uint8_t* bytes) {
  uint64_t x = (step + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{l} + 1);
  for (uint64_t i = 0; i + 8 <= args.swap_bytes; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(bytes + i, &x, 8);
  }
  for (uint64_t i = args.swap_bytes / 8 * 8; i < args.swap_bytes; ++i) {
    bytes[i] = static_cast<uint8_t>(x >> (8 * (i % 8)));
  }
}

// Activation swapping (--swap-bytes): what each layer of the iteration
// swapped out, or kept here when lohand refused it.
struct Swapper {
  const Args& args;
  uint64_t puts = 0;
  uint64_t refused = 0;
  std::vector<std::vector<uint8_t>> kept;  // per layer; empty: on the SSDs
  std::vector<uint8_t> expected;

  static uint64_t Id(uint64_t step, uint32_t l, size_t layers) {
    return step * layers + l + 1;
  }

  // Forward: layer l's activations out.
  int Put(lohan_model* model, uint64_t step, uint32_t l, size_t layers) {
    if (args.swap_bytes == 0) return 0;
    kept.resize(layers);
    uint64_t area = 0;
    auto* buffer =
        static_cast<uint8_t*>(lohan_model_activation_buffer(model, &area));
    if (buffer == nullptr || area < args.swap_bytes) {
      return FailWith("act-put", "no activation area of --swap-bytes");
    }
    FillActivation(args, step, l, buffer);
    ++puts;
    const int status =
        lohan_model_act_put(model, Id(step, l, layers), 0, args.swap_bytes);
    if (status == LOHAN_RESOURCE_EXHAUSTED) {
      ++refused;  // kept in host memory
      kept[l].assign(buffer, buffer + args.swap_bytes);
      return 0;
    }
    if (status != LOHAN_OK) return Fail("act-put", status);
    kept[l].clear();
    return 0;
  }

  // Backward: layer l's activations back (and freed on lohand's side).
  int Get(lohan_model* model, uint64_t step, uint32_t l, size_t layers) {
    if (args.swap_bytes == 0) return 0;
    expected.resize(args.swap_bytes);
    FillActivation(args, step, l, expected.data());
    if (!kept[l].empty()) {
      if (kept[l] != expected) return FailWith("act-get", "kept bytes differ");
      kept[l].clear();
      return 0;
    }
    const uint64_t id = Id(step, l, layers);
    if (int status = lohan_model_act_get(model, id, 0, args.swap_bytes);
        status != LOHAN_OK) {
      return Fail("act-get", status);
    }
    uint64_t area = 0;
    const auto* buffer = static_cast<const uint8_t*>(
        lohan_model_activation_buffer(model, &area));
    if (buffer == nullptr ||
        std::memcmp(buffer, expected.data(), args.swap_bytes) != 0) {
      return FailWith("act-get", "DATA_LOSS: swapped bytes differ");
    }
    if (int status = lohan_model_act_free(model, id); status != LOHAN_OK) {
      return Fail("act-free", status);
    }
    return 0;
  }
};

int Run(const Args& args) {
  std::vector<uint64_t> layers;
  for (absl::string_view part : absl::StrSplit(args.layers, ',')) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(part, &n))
      return FailWith("args", "INVALID_ARGUMENT: layers");
    layers.push_back(n);
  }
  const uint64_t element = args.dtype == "bf16" ? 2 : 4;
  if (!args.answer_shrink.empty() && args.answer_file.empty()) {
    return FailWith("args",
                    "INVALID_ARGUMENT: --answer-shrink without "
                    "--answer-file");
  }

  Session session;
  const v1::ModelSpec spec = SpecOf(args, layers);
  if (int failed = Open(args, spec, session); failed != 0) {
    return failed;
  }
  lohan_model* model = session.model;
  std::printf("buffers %u gradient %u weight\n", lohan_model_grad_slots(model),
              lohan_model_weight_slots(model));

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

  Swapper swapper{.args = args};
  const bool pause_in_iteration = args.pause_mid || args.pause_after_forward;
  const size_t pause_at_back = args.pause_after_forward ? 0 : layers.size() / 2;
  const uint64_t first = lohan_model_iteration(model);
  for (int t = 0; t < args.iterations; ++t) {
    if (args.pause_after != 0 && t == args.pause_after && !pause_in_iteration) {
      PauseUntilResumed(args, t);
    }
    const uint64_t step = first + t;  // gradients of the step-th iteration
    if (int status = lohan_model_iter_begin(model); status != LOHAN_OK) {
      return Fail("iter-begin", status);
    }
    for (uint32_t l = 0; l < layers.size(); ++l) {
      if (int status = lohan_model_fetch_params(model, l); status != LOHAN_OK) {
        return Fail("fetch", status);
      }
      DeviceCompute(args, 1.0 / 3, layers.size());
      if (int failed = swapper.Put(model, step, l, layers.size());
          failed != 0) {
        return failed;
      }
    }
    for (size_t back = 0; back < layers.size(); ++back) {
      const uint32_t l = static_cast<uint32_t>(layers.size() - 1 - back);
      if (args.die_in_iteration == t + 1 && back == layers.size() / 2) {
        std::fflush(stdout);
        kill(getpid(), SIGKILL);
      }
      if (pause_in_iteration && args.pause_after == t &&
          back == pause_at_back) {
        PauseUntilResumed(args, t);
      }
      if (args.hold_in_iteration == t + 1 && back == layers.size() / 2) {
        std::printf("holding mid-iteration\n");
        std::fflush(stdout);
        for (;;) pause();
      }
      if (int failed = swapper.Get(model, step, l, layers.size());
          failed != 0) {
        return failed;
      }
      DeviceCompute(args, 2.0 / 3, layers.size());
      if (int failed = HandOver(args, model, step, l, layers[l]); failed != 0) {
        return failed;
      }
    }
    double norm = 0;
    int clipped = 0, skipped = 0;
    if (int status = lohan_model_iter_end(model, &norm, &clipped, &skipped);
        status != LOHAN_OK) {
      return Fail("iter-end", status);
    }
    // The model skips non-finite iterations: a skip is one.
    const unsigned flags = (clipped != 0 ? kClipped : 0) |
                           (skipped != 0 ? kSkipped | kNonfinite : 0);
    std::printf("iteration %llu norm %.9g flags %u\n",
                static_cast<unsigned long long>(step + 1), norm, flags);
    if (int failed = FollowShare(args, spec, session); failed != 0) {
      return failed;
    }
    model = session.model;  // --answer-shrink may have registered it anew
    if (!args.until_file.empty() &&
        access(args.until_file.c_str(), F_OK) == 0) {
      std::ofstream(args.until_file + ".iterations") << t + 1 << "\n";
      break;
    }
  }

  // The final master weights, and the weights the next forward would get:
  // FETCH_PARAMS between iterations (resident 16-bit: the copy ITER_END
  // left in the buffer; streamed: the committed copy from the store; fp32:
  // the masters).
  std::ofstream out(args.out, std::ios::binary);
  staging = lohan_model_staging(model);  // a move changed the arena
  for (uint32_t l = 0; l < layers.size(); ++l) {
    if (int status = lohan_model_fetch_params(model, l); status != LOHAN_OK) {
      return Fail("fetch", status);
    }
    if (int status = lohan_model_read_weights(model, l); status != LOHAN_OK) {
      return Fail("read", status);
    }
    out.write(reinterpret_cast<const char*>(staging), layers[l] * 4);
    out.write(static_cast<const char*>(lohan_model_weight_buffer(model, l)),
              layers[l] * element);
  }
  if (!out) return FailWith("write", "INTERNAL: " + args.out);
  if (!args.swap_file.empty()) {
    std::ofstream(args.swap_file)
        << "puts " << swapper.puts << " refused " << swapper.refused << "\n";
  }
  std::printf("done\n");
  if (args.hold) {
    std::printf("holding\n");
    std::fflush(stdout);
    for (;;) pause();
  }
  return 0;
}

}  // namespace
}  // namespace lohan::testing

int main(int argc, char** argv) {
  // Each line as it is said (a harness waits for the first), and nothing
  // lost to a reader that stopped reading (the harness reads one line):
  // lines it does not read are dropped, never a SIGPIPE.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  lohan::testing::Args args;
  CLI::App app{"synthetic training client"};
  app.add_option("--socket", args.socket)->required();
  app.add_option("--job", args.job)->required();
  app.add_option("--layers", args.layers);
  app.add_option("--iterations", args.iterations);
  app.add_option("--dtype", args.dtype);
  app.add_option("--max-norm", args.max_norm);
  app.add_option("--grad-scale", args.grad_scale);
  app.add_option("--seed", args.seed);
  app.add_option("--chunk", args.chunk);
  app.add_option("--die-in-iteration", args.die_in_iteration);
  app.add_option("--hold-in-iteration", args.hold_in_iteration,
                 "like --die-in-iteration, but wait there until killed");
  app.add_option("--grad-slots", args.grad_slots);
  app.add_option("--weight-slots", args.weight_slots);
  app.add_option("--host-pool", args.host_pool);
  app.add_option("--out", args.out)->required();
  app.add_flag("--hold", args.hold, "after training, wait until killed");
  app.add_option("--pause-after", args.pause_after,
                 "iterations after which to wait for --resume-file");
  app.add_option("--resume-file", args.resume_file);
  app.add_option("--until-file", args.until_file,
                 "stop at the first iteration's end at which this file exists");
  app.add_flag("--fit-arena", args.fit_arena,
               "create the job for its model, registered with "
               "ARENA_FIT_MOST");
  app.add_flag("--register-resident", args.register_resident,
               "with --fit-arena, register the model laid out as given with "
               "a buffer per layer");
  app.add_flag("--pause-mid", args.pause_mid,
               "pause half-way through backward instead");
  app.add_flag("--pause-after-forward", args.pause_after_forward,
               "pause between forward and backward instead");
  app.add_option("--swap-bytes", args.swap_bytes,
                 "swap this many bytes of activations per layer per "
                 "iteration through lohand (kept here when refused)");
  app.add_option("--swap-file", args.swap_file,
                 "at the end, write \"puts P refused R\" here");
  app.add_option("--moves-file", args.moves_file,
                 "append a line per move: arena bytes before and after, "
                 "seconds, lohand's storage bytes read and written meanwhile "
                 "(with --lohand-pid)");
  app.add_option("--lohand-pid", args.lohand_pid);
  app.add_option("--device-ms", args.device_ms,
                 "milliseconds an accelerator would compute per step, waited "
                 "(a third in forward, two thirds in backward)")
      ->check(CLI::Range(0.0, 60000.0));
  app.add_option("--commit-interval", args.commit_interval,
                 "every how many iterations the states are durable (0: "
                 "lohand's default)")
      ->check(CLI::Range(0u, 1000000u));
  app.add_flag("--ignore-share", args.ignore_share,
               "never follow lohand's asks to move to another arena");
  app.add_flag("--ignore-grow", args.ignore_grow,
               "follow lohand's asks to shrink, never those to grow");
  app.add_option("--answer-shrink", args.answer_shrink,
                 "answer lohand's first ask to shrink wrongly")
      ->check(CLI::IsMember({"resident", "acknowledge"}));
  app.add_option("--answer-file", args.answer_file,
                 "what the wrong answer got, written whole");
  CLI11_PARSE(app, argc, argv);
  return lohan::testing::Run(args);
}
