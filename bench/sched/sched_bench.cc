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
//       [--clip=never|always] [--compare=schedules|layouts|clip]
//       [--slots=2] [--layout=resident|streamed] [--forward_ms=0] [--steps=3]
//       [--read_ahead_mib=256] [--gate_unit_mib=0]
// --gate_unit_mib: with N > 0, the store's transfers pass a gate as
// lohand's do (one read and one write in flight on the array, each a part
// of at most N MiB: lohand's default [store] gate_unit is 8 MiB on one
// SSD); 0: no gate, each transfer at the store's full queue depth.
// --backward_ms simulates the GPU's backward: the bench sleeps that long
// before submitting each layer's gradient (0: all at once).
// --compare=layouts: instead of the three schedules, the pipelined
// schedule with the resident layout (gradients and 16-bit weights in the
// client's buffers) against the streamed one (PipelineOptions
// stream_gradients + stream_weight16: gradients stored at submit and read
// back by the stages, 16-bit weights committed to the store and read back
// for the next forward), interleaved round by round on two jobs of the
// same shape; reports time per iteration and the SSD bytes each moves.
// The streamed client has --slots gradient buffers: its GRAD_READYs are
// served in order on another thread, and backward waits only for a
// buffer still being stored.
// --compare=clip: the clip schedules on four jobs of the same shape:
// redo-all (ClipSchedule::kRedoAll: eager updates, a full redo when the
// iteration clips), deferred (kDeferWhenCertain with predict_clipping) and
// +overlap (deferred, and settle_in_background: the last updates run
// during the next forward, each layer's fetch waiting for its own) and
// +read-ahead (+overlap with --read_ahead_mib of states read during
// backward for the updates that wait for the norm). Each
// job runs --steps iterations back to back per round (a simulated forward
// of --forward_ms per layer that first fetches the layer's weights, the
// backward, EndIteration), the jobs' order rotated per round, in four
// regimes: the limit never reached, always reached (clipping certain at
// the first chunk), reached only in the last layer handed over, and
// alternating by iteration (every prediction wrong). Reports the time per
// iteration, the part of it spent waiting for the optimizer (in
// EndIteration and in the next forward's fetches), and the SSD bytes per
// parameter (the process's /proc/self/io). --layout picks resident or
// streamed gradients and 16-bit weights.

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
#include "absl/synchronization/mutex.h"
#include "bench/sched/bench_common.h"
#include "bench/sched/clip_compare.h"
#include "daemon/optim/adam.h"
#include "daemon/optim/half.h"
#include "daemon/optim/optim_types.h"
#include "daemon/optim/worker_pool.h"
#include "daemon/sched/fair_gates.h"
#include "daemon/sched/fair_queue.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/store/aligned_buffer.h"
#include "daemon/store/tensor_store.h"

namespace lohan {
namespace sched_bench {
namespace {

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
    } else if (key == "slots") {
      ok = absl::SimpleAtoi(value, &f.slots) && f.slots > 0;
    } else if (key == "compare") {
      if (value == "schedules") {
        f.compare = Flags::Compare::kSchedules;
      } else if (value == "layouts") {
        f.compare = Flags::Compare::kLayouts;
      } else if (value == "clip") {
        f.compare = Flags::Compare::kClip;
      } else {
        ok = false;
      }
    } else if (key == "layout") {
      if (value == "resident") {
        f.streamed = false;
      } else if (value == "streamed") {
        f.streamed = true;
      } else {
        ok = false;
      }
    } else if (key == "read_ahead_mib") {
      ok = absl::SimpleAtoi(value, &f.read_ahead_mib);
    } else if (key == "gate_unit_mib") {
      ok = absl::SimpleAtoi(value, &f.gate_unit_mib);
    } else if (key == "forward_ms") {
      ok = absl::SimpleAtod(value, &f.forward_ms);
    } else if (key == "steps") {
      ok = absl::SimpleAtoi(value, &f.steps) && f.steps > 0;
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

void PrintRawStages(const Flags& flags, uint64_t state_total, double raw_read,
                    double raw_compute, double raw_write) {
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
}

// Resident vs streamed layout, pipelined schedule, interleaved by round.
int CompareLayouts(const Flags& flags, TensorStore* store,
                   const AdamUpdater& updater, const ModelLayout& layout,
                   uint64_t state_total,
                   const std::vector<std::vector<uint8_t>>& grads,
                   std::vector<std::vector<uint16_t>>& outs) {
  const char* const names[2] = {"resident", "streamed"};
  std::unique_ptr<JobPipeline> jobs[2];
  for (int k = 0; k < 2; ++k) {
    PipelineOptions options;
    options.buffers = flags.buffers;
    options.stream_gradients = k == 1;
    options.stream_weight16 = k == 1;
    auto p = JobPipeline::Open(store, updater, names[k], layout, options);
    Check(p.status(), "open job");
    jobs[k] = *std::move(p);
    std::vector<float> w(flags.params, 0.01f);
    for (size_t l = 0; l < flags.layers; ++l) {
      Check(jobs[k]->InitializeWeights(l, w.data()), "init");
    }
  }
  struct LayoutTotals {
    double seconds = 0, end_wait = 0, redo = 0;
    double grad_store = 0, slot_wait = 0, fetch = 0;
    double read_bytes = 0, written_bytes = 0;
    int n = 0;
  } totals[2];
  // Backward's wait for a counter (under `mu`) to reach a value.
  struct Wait {
    const size_t* counter;
    size_t at_least;
  };
  bool (*reached)(Wait*) = [](Wait* w) { return *w->counter >= w->at_least; };
  auto backward_step = [&flags] {
    if (flags.backward_ms > 0) {
      std::this_thread::sleep_for(
          std::chrono::duration<double, std::milli>(flags.backward_ms));
    }
  };
  for (int round = 0; round <= flags.rounds; ++round) {
    for (int i = 0; i < 2; ++i) {
      const int k = (i + round) % 2;  // Each goes first equally often.
      JobPipeline& p = *jobs[k];
      const double t0 = Now();
      ClipOptions clip;
      clip.max_grad_norm = flags.clip_always ? 1e-6 : 1e9;
      Check(p.BeginIteration(1.0f, std::nullopt, clip), "begin");
      double slot_wait = 0;
      if (k == 0) {
        for (size_t j = 0; j < flags.layers; ++j) {
          const size_t l = flags.layers - 1 - j;  // Backward order.
          backward_step();
          Check(p.SubmitGradients(l, grads[l].data(), outs[l].data()),
                "submit");
        }
      } else {
        // As the daemon serves a client with K gradient buffers: the
        // GRAD_READYs are served in order on another thread (each returns
        // once its gradient is stored) while backward goes on; backward
        // waits only when the buffer of its j-th layer (j % K) still holds
        // layer j - K's gradient.
        absl::Mutex mu;
        size_t handed = 0, stored = 0;  // Guarded by mu.
        std::thread server([&] {
          for (size_t j = 0; j < flags.layers; ++j) {
            {
              absl::MutexLock lock(&mu);
              Wait w{&handed, j + 1};
              mu.Await(absl::Condition(reached, &w));
            }
            const size_t l = flags.layers - 1 - j;
            Check(p.SubmitGradients(l, grads[l].data(), nullptr), "submit");
            absl::MutexLock lock(&mu);
            ++stored;
          }
        });
        for (size_t j = 0; j < flags.layers; ++j) {
          backward_step();
          const double w0 = Now();
          absl::MutexLock lock(&mu);
          if (j >= flags.slots) {
            Wait w{&stored, j - flags.slots + 1};
            mu.Await(absl::Condition(reached, &w));
          }
          slot_wait += Now() - w0;
          ++handed;
        }
        server.join();
      }
      auto r = p.EndIteration();
      Check(r.status(), "end iteration");
      const double seconds = Now() - t0;
      if (r->skipped || r->clipped != flags.clip_always) {
        Die("unexpected clip/skip");
      }
      // The next forward's weights: resident, already in the buffers;
      // streamed, FETCH_PARAMS reads each layer's copy from the store.
      double fetch = 0;
      if (k == 1) {
        const double f0 = Now();
        for (size_t l = 0; l < flags.layers; ++l) {
          Check(p.ReadWeight16(l, outs[l].data()), "fetch");
        }
        fetch = Now() - f0;
      }
      if (round == 0) continue;
      LayoutTotals& t = totals[k];
      t.seconds += seconds;
      t.end_wait += r->wait_seconds;
      t.redo += r->redo_seconds;
      t.grad_store += r->busy.grad_store;
      t.slot_wait += slot_wait;
      t.fetch += fetch;
      t.read_bytes +=
          r->busy.bytes_read + (k == 1 ? TotalParams(flags) * 2 : 0);
      t.written_bytes += r->busy.bytes_written;
      ++t.n;
    }
  }
  const double mib = 1048576.0;
  std::printf(
      "\nlayouts, pipelined schedule (%s), streamed with %zu "
      "gradient buffers:\n",
      flags.clip_always ? "every iteration clipped: redo pass" : "never clips",
      flags.slots);
  std::printf("%-10s %8s %9s %7s %10s %9s %7s %12s %12s %8s\n", "layout",
              "iter s", "end-wait", "redo", "grad-store", "slot-wait", "fetch",
              "SSD read", "SSD written", "vs res.");
  const double base = (totals[0].seconds + totals[0].fetch) / totals[0].n;
  for (int k = 0; k < 2; ++k) {
    const LayoutTotals& t = totals[k];
    const double it = (t.seconds + t.fetch) / t.n;
    std::printf(
        "%-10s %8.3f %9.3f %7.3f %10.3f %9.3f %7.3f %8.0f MiB "
        "%8.0f MiB %7.2fx\n",
        names[k], it, t.end_wait / t.n, t.redo / t.n, t.grad_store / t.n,
        t.slot_wait / t.n, t.fetch / t.n, t.read_bytes / t.n / mib,
        t.written_bytes / t.n / mib, it / base);
  }
  const double extra_read =
      totals[1].read_bytes / totals[1].n - totals[0].read_bytes / totals[0].n;
  const double extra_written = totals[1].written_bytes / totals[1].n -
                               totals[0].written_bytes / totals[0].n;
  std::printf(
      "streamed moves %.0f MiB more per iteration (%.0f read + %.0f "
      "written; the states alone: %.0f MiB each way)\n",
      (extra_read + extra_written) / mib, extra_read / mib, extra_written / mib,
      state_total / mib);
  std::printf(
      "(iter s: BeginIteration to EndIteration's return plus, streamed, "
      "the next forward's 16-bit fetch of every layer; mean of %d rounds "
      "after a warm-up, order alternated per round. grad-store: seconds "
      "the serving thread spent storing gradients; slot-wait: seconds "
      "backward waited for a free gradient buffer, the part of grad-store "
      "it did not hide)\n",
      flags.rounds);
  return 0;
}

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
  // Per job: committed + pending versions, with room for striping slack,
  // and (streamed) its 16-bit copies (committed + pending) and gradient
  // scratch. Comparing layouts: two jobs; clip schedules: four.
  const uint64_t params_total = TotalParams(flags);
  const uint64_t grad_bytes = params_total * DTypeSize(flags.grad);
  const uint64_t per_job =
      state_total * 2 + state_total / 4 + params_total * 4 + grad_bytes;
  const uint64_t needed = flags.compare == Flags::Compare::kSchedules
                              ? state_total * 2 + state_total / 4
                          : flags.compare == Flags::Compare::kClip
                              ? per_job * 4
                              : per_job * 2;
  so.device_capacity_bytes =
      (needed / flags.ssds + (64 << 20)) / (1 << 20) * (1 << 20);
  // Declared before the store, which uses it until destroyed. lohand's gate
  // (daemon/main/lohand.cc): one read and one write in flight on the array,
  // each a part of at most gate_unit_bytes.
  FairQueue gate_reads(1, absl::Microseconds(300), 8);
  FairQueue gate_writes(1, absl::Microseconds(300), 8);
  FairSsdGate gate(&gate_reads, &gate_writes,
                   [](absl::string_view) { return FairSsdGate::Share{}; });
  so.gate_unit_bytes = flags.gate_unit_mib << 20;
  auto store_or = TensorStore::Open(so);
  Check(store_or.status(), "open store");
  std::unique_ptr<TensorStore> store = *std::move(store_or);
  if (so.gate_unit_bytes > 0) store->SetIoGate(&gate);

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

  if (flags.compare == Flags::Compare::kClip) {
    PrintRawStages(flags, state_total, raw_read, raw_compute, raw_write);
    const int status = CompareClip(flags, store.get(), updater, layout,
                                   state_total, grads, outs);
    store.reset();
    RemoveTree(root);
    return status;
  }
  if (flags.compare == Flags::Compare::kLayouts) {
    PrintRawStages(flags, state_total, raw_read, raw_compute, raw_write);
    const int status = CompareLayouts(flags, store.get(), updater, layout,
                                      state_total, grads, outs);
    store.reset();
    RemoveTree(root);
    return status;
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
      ClipOptions clip;
      // The norm is computed and checked every iteration. --clip=never:
      // the bound never triggers; --clip=always: it always does.
      clip.max_grad_norm = flags.clip_always ? 1e-6 : 1e9;
      Check((*p)->BeginIteration(1.0f, std::nullopt, clip), "begin");
      for (size_t i = 0; i < flags.layers; ++i) {
        const size_t l = flags.layers - 1 - i;  // Backward order.
        if (flags.backward_ms > 0) {
          std::this_thread::sleep_for(
              std::chrono::duration<double, std::milli>(flags.backward_ms));
        }
        Check((*p)->SubmitGradients(l, grads[l].data(), outs[l].data()),
              "submit");
      }
      auto r = (*p)->EndIteration();
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

  PrintRawStages(flags, state_total, raw_read, raw_compute, raw_write);
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
  RemoveTree(root);
  return 0;
}

}  // namespace
}  // namespace sched_bench
}  // namespace lohan

int main(int argc, char** argv) { return lohan::sched_bench::Main(argc, argv); }
