// A training process in miniature: drives a synthetic N-layer model through a
// real lohand over the control plane and the data plane, the way the PyTorch
// plugin does, and writes the final fp32 master weights to a file.
//
//   train_client --socket S --job NAME --layers 1000,5000,333 --iterations 4
//                [--dtype fp32|bf16] [--max-norm X] [--grad-scale X]
//                [--seed N] [--chunk N] [--die-in-iteration K]
//                [--grad-slots K] [--weight-slots K] [--host-pool BYTES]
//                [--fit-arena] --out FILE
//
// Per iteration: ITER_BEGIN, FETCH_PARAMS for every layer (forward), then
// GRAD_READY from the last layer to the first (backward), then ITER_END.
// --die-in-iteration K: in iteration K (1-based), after handing over half
// the gradients, the process kills itself (SIGKILL): a client dying
// mid-iteration. The job keeps its name, so a rerun attaches to it again.
// --hold-in-iteration K: the same point, but it waits there until killed.
// Prints one line per iteration: "iteration T norm N flags F".
// --grad-slots / --weight-slots: ModelSpec's (0: one buffer per layer;
// K < layers: K shared buffers, the data streamed through the daemon's
// SSDs); the client uses layer l's offsets from the response (buffer l % K).
// --host-pool: the job's arena when this run creates it. --fit-arena: this
// run creates the job for its model instead (JobSpec.model, the daemon
// sizing the arena) and registers it with ARENA_FIT_MOST: laid out in the
// arena its plane got.
// The dump holds, per layer, the fp32 master weights and the weights
// FETCH_PARAMS gives after training (the 16-bit copy, or fp32 weights).
// --hold: after training, keep the data plane open until killed.
// --pause-after K --resume-file F: after K iterations, create F.paused and
// wait (data plane open) until F exists, then go on. With --pause-mid, the
// pause is half-way through the next iteration's backward instead.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/control_client.h"
#include "client/data_plane.h"
#include "daemon/optim/half.h"
#include "tests/synthetic_model.h"

namespace lohan::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(120);

int Fail(const char* step, const absl::Status& status) {
  std::printf("%s: %s\n", step, status.ToString().c_str());
  return 1;
}

struct Args {
  std::string socket, job, layers = "1000,5000,333", dtype = "fp32", out;
  int iterations = 3;
  double max_norm = 0.0;
  double grad_scale = 0.01;
  uint64_t seed = 7;
  uint64_t chunk = 2048;
  int die_in_iteration = 0;
  int hold_in_iteration = 0;
  uint32_t grad_slots = 0;
  uint32_t weight_slots = 0;
  uint64_t host_pool = uint64_t{16} << 20;
  bool hold = false;
  int pause_after = 0;
  std::string resume_file;
  bool pause_mid = false;
  // Create the job for its model (JobSpec.model) and register it with
  // ARENA_FIT_MOST: the daemon sizes the arena and lays the model out in
  // the one the plane gets.
  bool fit_arena = false;
};

// See --pause-after.
void PauseUntilResumed(const Args& args, int iterations_done) {
  // Whoever waits for this line may stop reading: later lines must not
  // kill us (SIGPIPE).
  signal(SIGPIPE, SIG_IGN);
  std::printf("paused after %d iterations%s\n", iterations_done,
              args.pause_mid ? " and half a backward" : "");
  std::fflush(stdout);
  std::ofstream(args.resume_file + ".paused") << "paused\n";
  while (access(args.resume_file.c_str(), F_OK) != 0) usleep(10 * 1000);
}

int Run(const Args& args) {
  std::vector<uint64_t> layers;
  for (absl::string_view part : absl::StrSplit(args.layers, ',')) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(part, &n))
      return Fail("args", absl::InvalidArgumentError("layers"));
    layers.push_back(n);
  }
  const bool bf16 = args.dtype == "bf16";
  const uint64_t element = bf16 ? 2 : 4;

  v1::RegisterModelRequest request;
  v1::ModelSpec* model = request.mutable_model();
  for (uint64_t n : layers) model->add_layer_elements(n);
  model->set_dtype(bf16 ? v1::DTYPE_BF16 : v1::DTYPE_FP32);
  const SyntheticAdam adam;
  model->mutable_adam()->set_lr(adam.lr);
  model->mutable_adam()->set_beta1(adam.beta1);
  model->mutable_adam()->set_beta2(adam.beta2);
  model->mutable_adam()->set_eps(adam.eps);
  model->mutable_adam()->set_weight_decay(adam.weight_decay);
  model->mutable_adam()->set_decoupled_weight_decay(true);
  model->set_max_grad_norm(args.max_norm);
  model->set_skip_nonfinite(true);
  model->set_chunk_elements(args.chunk);
  model->set_grad_slots(args.grad_slots);
  model->set_weight_slots(args.weight_slots);
  if (args.fit_arena) model->set_arena_fit(v1::ARENA_FIT_MOST);

  auto client = ControlClient::Connect({.socket_path = args.socket});
  if (!client.ok()) return Fail("connect", client.status());
  std::string job_id;
  auto jobs = (*client)->ListJobs();
  if (!jobs.ok()) return Fail("list", jobs.status());
  for (const v1::Job& job : *jobs) {
    if (job.spec().name() == args.job) job_id = job.id();
  }
  if (job_id.empty()) {
    v1::JobSpec spec;
    spec.set_name(args.job);
    if (args.fit_arena) {
      *spec.mutable_model() = *model;
    } else {
      spec.set_host_pool_bytes(args.host_pool);
    }
    auto job = (*client)->CreateJob(spec);
    if (!job.ok()) return Fail("create", job.status());
    job_id = job->id();
  }
  if (auto attached = (*client)->AttachJob(job_id); !attached.ok()) {
    return Fail("attach", attached.status());
  }
  auto plane = DataPlane::Open((*client)->hello().data_socket_path(), job_id);
  if (!plane.ok()) return Fail("data-plane", plane.status());
  request.set_job_id(job_id);
  auto registered = (*client)->RegisterModel(request);
  if (!registered.ok()) return Fail("register", registered.status());
  std::printf("buffers %u gradient %u weight\n", registered->grad_slots(),
              registered->weight_slots());
  (*plane)->SetErrorText(registered->error_text_offset(),
                         registered->error_text_bytes());
  uint8_t* arena = (*plane)->arena();
  float* staging =
      reinterpret_cast<float*>(arena + registered->staging_offset());

  for (size_t l = 0; l < layers.size(); ++l) {
    if (registered->layer_initialized(l)) continue;
    for (uint64_t i = 0; i < layers[l]; ++i) {
      staging[i] = InitialWeight(args.seed, l, i);
    }
    SubmissionEntry init{};
    init.op = static_cast<uint16_t>(RingOp::kInitWeights);
    init.layer = static_cast<uint32_t>(l);
    init.slot_offset = registered->staging_offset();
    init.length = layers[l] * 4;
    if (auto done = (*plane)->Call(init, kTimeout); !done.ok()) {
      return Fail("init", done.status());
    }
  }

  uint64_t sequence = registered->iteration();
  const uint64_t first = registered->iteration();
  for (int t = 0; t < args.iterations; ++t) {
    if (args.pause_after != 0 && t == args.pause_after && !args.pause_mid) {
      PauseUntilResumed(args, t);
    }
    const uint64_t step = first + t;  // gradients of the step-th iteration
    SubmissionEntry begin{};
    begin.op = static_cast<uint16_t>(RingOp::kIterBegin);
    begin.iteration = sequence;
    if (auto done = (*plane)->Call(begin, kTimeout); !done.ok()) {
      return Fail("iter-begin", done.status());
    }
    for (size_t l = 0; l < layers.size(); ++l) {
      SubmissionEntry fetch{};
      fetch.op = static_cast<uint16_t>(RingOp::kFetchParams);
      fetch.layer = static_cast<uint32_t>(l);
      fetch.slot_offset = registered->layers(l).weight_offset();
      fetch.length = registered->layers(l).bytes();
      if (auto done = (*plane)->Call(fetch, kTimeout); !done.ok()) {
        return Fail("fetch", done.status());
      }
    }
    for (size_t back = 0; back < layers.size(); ++back) {
      const size_t l = layers.size() - 1 - back;
      if (args.die_in_iteration == t + 1 && back == layers.size() / 2) {
        std::fflush(stdout);
        kill(getpid(), SIGKILL);
      }
      if (args.pause_mid && args.pause_after == t &&
          back == layers.size() / 2) {
        PauseUntilResumed(args, t);
      }
      if (args.hold_in_iteration == t + 1 && back == layers.size() / 2) {
        std::printf("holding mid-iteration\n");
        std::fflush(stdout);
        for (;;) pause();
      }
      uint8_t* grad = arena + registered->layers(l).grad_offset();
      for (uint64_t i = 0; i < layers[l]; ++i) {
        const float g = Gradient(args.seed, step, l, i, args.grad_scale);
        if (bf16) {
          reinterpret_cast<uint16_t*>(grad)[i] = FloatToBf16(g);
        } else {
          reinterpret_cast<float*>(grad)[i] = g;
        }
      }
      SubmissionEntry ready{};
      ready.op = static_cast<uint16_t>(RingOp::kGradReady);
      ready.dtype =
          static_cast<uint16_t>(bf16 ? RingDtype::kBf16 : RingDtype::kFp32);
      ready.layer = static_cast<uint32_t>(l);
      ready.slot_offset = registered->layers(l).grad_offset();
      ready.length = layers[l] * element;
      if (auto done = (*plane)->Call(ready, kTimeout); !done.ok()) {
        return Fail("grad-ready", done.status());
      }
    }
    SubmissionEntry end{};
    end.op = static_cast<uint16_t>(RingOp::kIterEnd);
    end.iteration = sequence;
    auto done = (*plane)->Call(end, kTimeout);
    if (!done.ok()) return Fail("iter-end", done.status());
    double norm = 0;
    std::memcpy(&norm, &done->detail, sizeof(norm));
    std::printf("iteration %llu norm %.9g flags %u\n",
                static_cast<unsigned long long>(step + 1), norm, done->flags);
    ++sequence;
  }

  // The final master weights, and the weights the next forward would get:
  // FETCH_PARAMS between iterations (resident 16-bit: the copy ITER_END
  // left in the buffer; streamed: the committed copy from the store; fp32:
  // the masters).
  std::ofstream out(args.out, std::ios::binary);
  for (size_t l = 0; l < layers.size(); ++l) {
    SubmissionEntry fetch{};
    fetch.op = static_cast<uint16_t>(RingOp::kFetchParams);
    fetch.layer = static_cast<uint32_t>(l);
    fetch.slot_offset = registered->layers(l).weight_offset();
    fetch.length = registered->layers(l).bytes();
    if (auto done = (*plane)->Call(fetch, kTimeout); !done.ok()) {
      return Fail("fetch", done.status());
    }
    SubmissionEntry read{};
    read.op = static_cast<uint16_t>(RingOp::kReadWeights);
    read.layer = static_cast<uint32_t>(l);
    read.slot_offset = registered->staging_offset();
    read.length = layers[l] * 4;
    if (auto got = (*plane)->Call(read, kTimeout); !got.ok()) {
      return Fail("read", got.status());
    }
    out.write(reinterpret_cast<const char*>(staging), layers[l] * 4);
    out.write(reinterpret_cast<const char*>(
                  arena + registered->layers(l).weight_offset()),
              layers[l] * element);
  }
  if (!out) return Fail("write", absl::InternalError(args.out));
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
  app.add_flag("--fit-arena", args.fit_arena,
               "create the job for its model, registered with "
               "ARENA_FIT_MOST");
  app.add_flag("--pause-mid", args.pause_mid,
               "pause half-way through backward instead");
  CLI11_PARSE(app, argc, argv);
  return lohan::testing::Run(args);
}
