// sched_bench: one job's update pipeline (daemon/sched JobPipeline) on the
// real TensorStore (files under --dir, O_DIRECT) and the real AdamUpdater,
// with the three schedules interleaved round by round: pipelined (Figure
// 3b), serialized (Figure 3a) and after-backward (ZeRO style). In the same
// run it measures the raw stages for the same bytes: the store writing and
// reading one iteration's chunk states one chunk at a time, and the
// optimizer updating them in memory. Not a test: prints a table.
//
// Usage:
//   sched_bench [--dir=/tmp] [--layers=8] [--params=16777216]
//       [--chunk=4194304] [--ssds=2] [--threads=2] [--buffers=4]
//       [--rounds=2] [--backward_ms=0] [--grad=bf16|fp32|fp16]
//       [--clip=never|always]
// --backward_ms simulates the GPU's backward: the bench sleeps that long
// before submitting each layer's gradient (0: all at once).

#include <ftw.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/optim/adam.h"
#include "daemon/optim/half.h"
#include "daemon/optim/worker_pool.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/store/aligned_buffer.h"
#include "daemon/store/tensor_store.h"

namespace lohan {
namespace {

struct Flags {
  std::string dir = "/tmp";
  size_t layers = 8;
  uint64_t params = uint64_t{16} << 20;
  uint64_t chunk = uint64_t{4} << 20;
  size_t ssds = 2;
  int threads = 2;
  size_t buffers = 4;
  int rounds = 2;
  double backward_ms = 0;
  DType grad = DType::kBFloat16;
  bool clip_always = false;
};

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path);
}

std::string g_root;  // The bench's temporary directory, once made.

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "sched_bench: %s\n", message.c_str());
  if (!g_root.empty()) {
    ::nftw(g_root.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
  }
  std::exit(1);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      Die("bad argument " + arg);
    }
    const std::string key = arg.substr(2, eq - 2);
    const std::string value = arg.substr(eq + 1);
    bool ok = true;
    if (key == "dir") {
      f.dir = value;
    } else if (key == "layers") {
      ok = absl::SimpleAtoi(value, &f.layers);
    } else if (key == "params") {
      ok = absl::SimpleAtoi(value, &f.params);
    } else if (key == "chunk") {
      ok = absl::SimpleAtoi(value, &f.chunk);
    } else if (key == "ssds") {
      ok = absl::SimpleAtoi(value, &f.ssds);
    } else if (key == "threads") {
      ok = absl::SimpleAtoi(value, &f.threads);
    } else if (key == "buffers") {
      ok = absl::SimpleAtoi(value, &f.buffers);
    } else if (key == "rounds") {
      ok = absl::SimpleAtoi(value, &f.rounds);
    } else if (key == "clip") {
      if (value == "never") {
        f.clip_always = false;
      } else if (value == "always") {
        f.clip_always = true;
      } else {
        ok = false;
      }
    } else if (key == "backward_ms") {
      ok = absl::SimpleAtod(value, &f.backward_ms);
    } else if (key == "grad") {
      if (value == "bf16") {
        f.grad = DType::kBFloat16;
      } else if (value == "fp16") {
        f.grad = DType::kFloat16;
      } else if (value == "fp32") {
        f.grad = DType::kFloat32;
      } else {
        ok = false;
      }
    } else {
      Die("unknown flag --" + key);
    }
    if (!ok) Die("bad value in " + arg);
  }
  if (f.layers == 0 || f.params == 0 || f.chunk == 0 || f.ssds == 0 ||
      f.rounds <= 0) {
    Die("sizes and counts must be > 0");
  }
  return f;
}

const char* ScheduleName(Schedule s) {
  switch (s) {
    case Schedule::kPipelined:
      return "pipelined (3b)";
    case Schedule::kSerialized:
      return "serialized (3a)";
    case Schedule::kAfterBackward:
      return "after-backward";
  }
  return "?";
}

struct Totals {
  double seconds = 0;
  double end_wait = 0;
  double commit = 0;
  double redo = 0;
  StageBusy busy;
  int n = 0;
};

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  std::string tmpl = flags.dir + "/sched_bench_XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) Die("mkdtemp in " + flags.dir);
  const std::string root = tmpl;
  g_root = root;

  ModelLayout layout;
  layout.layer_elements.assign(flags.layers, flags.params);
  layout.chunk_elements = flags.chunk;
  layout.grad_dtype = flags.grad;
  layout.weight16_dtype = DType::kBFloat16;
  layout.adam.lr = 1e-4;
  layout.adam.weight_decay = 0.01;
  Check(ValidateLayout(layout), "layout");
  const StateLayout state(layout);
  uint64_t state_total = 0;
  for (size_t l = 0; l < flags.layers; ++l) {
    for (size_t c = 0; c < state.num_chunks(l); ++c) {
      state_total += state.state_bytes(state.chunk_count(l, c));
    }
  }

  StoreOptions so;
  for (size_t i = 0; i < flags.ssds; ++i) {
    so.ssd_paths.push_back(root + "/ssd" + std::to_string(i));
    if (::mkdir(so.ssd_paths.back().c_str(), 0700) != 0) Die("mkdir");
  }
  so.state_dir = root + "/state";
  // Committed + pending versions, with room for striping slack.
  so.device_capacity_bytes =
      ((state_total * 2 + state_total / 4) / flags.ssds + (64 << 20)) /
      (1 << 20) * (1 << 20);
  auto store_or = TensorStore::Open(so);
  Check(store_or.status(), "open store");
  std::unique_ptr<TensorStore> store = *std::move(store_or);

  auto pool_or = WorkerPool::Create(WorkerPoolOptions{flags.threads, true});
  Check(pool_or.status(), "worker pool");
  std::unique_ptr<WorkerPool> pool = *std::move(pool_or);
  auto updater_or = AdamUpdater::Create(pool.get(), std::nullopt);
  Check(updater_or.status(), "updater");
  const AdamUpdater updater = *updater_or;

  const size_t grad_size = flags.grad == DType::kFloat32 ? 4 : 2;
  std::printf(
      "sched_bench: %zu layers x %llu params, chunks of %llu, %s grads, "
      "%zu file SSDs under %s, %d optimizer threads (%s), %zu buffers, "
      "backward %.0f ms/layer\n",
      flags.layers, static_cast<unsigned long long>(flags.params),
      static_cast<unsigned long long>(flags.chunk),
      std::string(DTypeName(flags.grad)).c_str(), flags.ssds, root.c_str(),
      flags.threads, updater.kernel_name(), flags.buffers, flags.backward_ms);
  std::printf("states per iteration: %.1f MiB read + %.1f MiB written\n",
              state_total / 1048576.0, state_total / 1048576.0);

  // Gradients and 16-bit outputs, as the client's arena would hold them.
  std::vector<std::vector<uint8_t>> grads(flags.layers);
  std::vector<std::vector<uint16_t>> outs(flags.layers);
  {
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1e-3f);
    for (size_t l = 0; l < flags.layers; ++l) {
      grads[l].resize(flags.params * grad_size);
      for (uint64_t i = 0; i < flags.params; ++i) {
        const float x = dist(rng);
        if (grad_size == 4) {
          std::memcpy(&grads[l][4 * i], &x, 4);
        } else {
          const uint16_t h =
              flags.grad == DType::kBFloat16 ? FloatToBf16(x) : FloatToFp16(x);
          std::memcpy(&grads[l][2 * i], &h, 2);
        }
      }
      outs[l].resize(flags.params);
    }
  }

  // ---- Raw stages, same chunk sizes and bytes, one chunk at a time.
  double raw_write = 0, raw_read = 0, raw_compute = 0;
  {
    AlignedBuffer buffer((state.max_state_bytes() + 4095) / 4096 * 4096, 4096);
    std::vector<std::string> names;
    for (size_t l = 0; l < flags.layers; ++l) {
      for (size_t c = 0; c < state.num_chunks(l); ++c) {
        names.push_back(absl::StrCat("raw", l, ".", c));
        const uint64_t bytes = state.state_bytes(state.chunk_count(l, c));
        Check(store->Create("raw", names.back(), bytes), "raw create");
      }
    }
    size_t k = 0;
    double t0 = Now();
    for (size_t l = 0; l < flags.layers; ++l) {
      for (size_t c = 0; c < state.num_chunks(l); ++c, ++k) {
        const uint64_t bytes = state.state_bytes(state.chunk_count(l, c));
        Check(store
                  ->Write("raw", names[k],
                          absl::MakeConstSpan(buffer.data(), bytes))
                  .status(),
              "raw write");
      }
    }
    raw_write = Now() - t0;
    Check(store->CommitBatch("raw", names), "raw commit");
    k = 0;
    t0 = Now();
    for (size_t l = 0; l < flags.layers; ++l) {
      for (size_t c = 0; c < state.num_chunks(l); ++c, ++k) {
        const uint64_t bytes = state.state_bytes(state.chunk_count(l, c));
        Check(store->Read("raw", names[k], absl::MakeSpan(buffer.data(), bytes))
                  .status(),
              "raw read");
      }
    }
    raw_read = Now() - t0;
    for (const std::string& n : names) Check(store->Delete("raw", n), "delete");

    // The optimizer alone on the same chunks (in memory).
    t0 = Now();
    for (size_t l = 0; l < flags.layers; ++l) {
      for (size_t c = 0; c < state.num_chunks(l); ++c) {
        const uint64_t count = state.chunk_count(l, c);
        AdamTensor t;
        t.size = count;
        t.weight = reinterpret_cast<float*>(buffer.data());
        t.exp_avg = buffer.data() + state.exp_avg_offset(count);
        t.exp_avg_sq = buffer.data() + state.exp_avg_sq_offset(count);
        GradientView g{grads[l].data() + state.chunk_begin(c) * grad_size,
                       flags.grad, 1.0f};
        HalfOutput o{outs[l].data() + state.chunk_begin(c), DType::kBFloat16};
        Check(updater.Step(layout.adam, t, g, o).status(), "raw adam");
      }
    }
    raw_compute = Now() - t0;
  }

  // ---- The job: initialized once, reopened per schedule.
  {
    PipelineOptions options;
    auto p = JobPipeline::Open(store.get(), updater, "bench", layout, options);
    Check(p.status(), "open job");
    std::vector<float> w(flags.params, 0.01f);
    for (size_t l = 0; l < flags.layers; ++l) {
      Check((*p)->InitializeWeights(l, w.data()), "init");
    }
  }
  const Schedule schedules[] = {Schedule::kPipelined, Schedule::kSerialized,
                                Schedule::kAfterBackward};
  Totals totals[3];
  // Round 0 is an untimed warm-up of each schedule. The order rotates
  // every round, so each schedule runs first, second and third equally
  // often (the disk's state after the previous iteration's writes counts).
  for (int round = 0; round <= flags.rounds; ++round) {
    for (int k = 0; k < 3; ++k) {
      const int s = (k + round) % 3;
      PipelineOptions options;
      options.schedule = schedules[s];
      options.buffers = flags.buffers;
      auto p =
          JobPipeline::Open(store.get(), updater, "bench", layout, options);
      Check(p.status(), "open job");
      const double t0 = Now();
      Check((*p)->BeginIteration(), "begin");
      for (size_t i = 0; i < flags.layers; ++i) {
        const size_t l = flags.layers - 1 - i;  // Backward order.
        if (flags.backward_ms > 0) {
          std::this_thread::sleep_for(
              std::chrono::duration<double, std::milli>(flags.backward_ms));
        }
        Check((*p)->SubmitGradients(l, grads[l].data(), outs[l].data()),
              "submit");
      }
      ClipOptions clip;
      // The norm is computed and checked every iteration. --clip=never:
      // the bound never triggers; --clip=always: it always does, and the
      // iteration pays the redo (one more pass over every chunk).
      clip.max_grad_norm = flags.clip_always ? 1e-6 : 1e9;
      auto r = (*p)->EndIteration(clip);
      Check(r.status(), "end iteration");
      const double seconds = Now() - t0;
      if (r->skipped || r->clipped != flags.clip_always) {
        Die("unexpected clip/skip");
      }
      if (round == 0) continue;
      Totals& t = totals[s];
      t.seconds += seconds;
      t.end_wait += r->wait_seconds;
      t.commit += r->commit_seconds;
      t.redo += r->redo_seconds;
      t.busy.read += r->busy.read;
      t.busy.compute += r->busy.compute;
      t.busy.write += r->busy.write;
      ++t.n;
    }
  }

  const double backward = flags.backward_ms * 1e-3 * flags.layers;
  std::printf(
      "\nraw stages for one iteration's bytes (one chunk at a time):\n");
  std::printf(
      "  store write %.3f s (%.0f MiB/s), store read %.3f s (%.0f MiB/s),"
      " adam %.3f s\n",
      raw_write, state_total / 1048576.0 / raw_write, raw_read,
      state_total / 1048576.0 / raw_read, raw_compute);
  const double sum = raw_read + raw_compute + raw_write;
  const double mx = std::max({raw_read, raw_compute, raw_write});
  std::printf(
      "  sum of stages %.3f s, max stage %.3f s; simulated backward "
      "%.3f s\n",
      sum, mx, backward);
  std::printf("\n%-16s %9s %9s %9s %9s %9s %9s %9s %8s\n", "schedule", "iter s",
              "end-wait", "redo", "commit", "read", "adam", "write", "vs 3b");
  const double base = totals[0].seconds / totals[0].n;
  for (int s = 0; s < 3; ++s) {
    const Totals& t = totals[s];
    const double it = t.seconds / t.n;
    std::printf("%-16s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %7.2fx\n",
                ScheduleName(schedules[s]), it, t.end_wait / t.n, t.redo / t.n,
                t.commit / t.n, t.busy.read / t.n, t.busy.compute / t.n,
                t.busy.write / t.n, it / base);
  }
  std::printf(
      "\n(iter s: BeginIteration to EndIteration's return, mean of %d "
      "rounds after a warm-up, order rotated per round; read/adam/write: "
      "stage-thread busy seconds)\n",
      flags.rounds);
  store.reset();
  ::nftw(root.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}

}  // namespace
}  // namespace lohan

int main(int argc, char** argv) { return lohan::Main(argc, argv); }
