#include "bench/sched/clip_compare.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <thread>

#include "daemon/optim/optim_types.h"
#include "daemon/sched/job_pipeline.h"

namespace lohan {
namespace sched_bench {

int CompareClip(const Flags& flags, TensorStore* store,
                const AdamUpdater& updater, const ModelLayout& layout,
                uint64_t state_total,
                const std::vector<std::vector<uint8_t>>& grads,
                std::vector<std::vector<uint16_t>>& outs) {
  // The limits: from the gradients' exact sums of squares (the bench's
  // gradients are the same every iteration).
  std::vector<double> layer_squares;
  for (size_t l = 0; l < flags.layers; ++l) {
    auto sum = updater.GradSumSquares(
        GradientView{grads[l].data(), flags.grad, 1.0f}, flags.params);
    Check(sum.status(), "sum of squares");
    layer_squares.push_back(*sum);
  }
  double before_last = 0;  // Backward hands layer 0 over last.
  for (size_t l = 1; l < flags.layers; ++l) before_last += layer_squares[l];
  const double late = std::sqrt(before_last + layer_squares[0] / 2);
  struct Regime {
    const char* name;
    double limits[2];  // By iteration parity; equal but for "alternate".
  };
  const Regime regimes[] = {{"never", {1e9, 1e9}},
                            {"always", {1e-6, 1e-6}},
                            {"late", {late, late}},
                            {"alternate", {1e9, 1e-6}}};
  constexpr int kJobs = 4;
  const char* const names[kJobs] = {"redo-all", "deferred", "+overlap",
                                    "+read-ahead"};
  std::unique_ptr<JobPipeline> jobs[kJobs];
  for (int k = 0; k < kJobs; ++k) {
    PipelineOptions options;
    options.buffers = flags.buffers;
    options.stream_gradients = flags.streamed;
    options.stream_weight16 = flags.streamed;
    options.clip_schedule =
        k == 0 ? ClipSchedule::kRedoAll : ClipSchedule::kDeferWhenCertain;
    options.settle_in_background = k >= 2;
    if (k == 3) options.read_ahead_bytes = flags.read_ahead_mib << 20;
    auto p = JobPipeline::Open(store, updater, names[k], layout, options);
    Check(p.status(), "open job");
    jobs[k] = *std::move(p);
    std::vector<float> w(flags.params, 0.01f);
    for (size_t l = 0; l < flags.layers; ++l) {
      Check(jobs[k]->InitializeWeights(l, w.data()), "init");
    }
  }
  auto sleep_ms = [](double ms) {
    if (ms > 0) {
      std::this_thread::sleep_for(
          std::chrono::duration<double, std::milli>(ms));
    }
  };
  struct ClipTotals {
    double seconds = 0, exposed = 0;
    double io_read = 0, io_written = 0;
    uint64_t clipped = 0, redone = 0;
    int n = 0;  // Iterations.
  };
  const double params = static_cast<double>(TotalParams(flags));
  const double compute_ms = (flags.forward_ms + flags.backward_ms) *
                            static_cast<double>(flags.layers);
  std::printf(
      "\nclip schedules, pipelined, %s layout, simulated forward %.0f ms and "
      "backward %.0f ms per layer (%.3f s of compute an iteration); bytes "
      "per parameter per iteration (states alone: %.1f each way):\n",
      flags.streamed ? "streamed" : "resident", flags.forward_ms,
      flags.backward_ms, compute_ms / 1e3, state_total / params);
  std::printf("%-10s %-11s %8s %9s %7s %8s %8s %8s %8s\n", "regime", "schedule",
              "iter s", "exposed s", "vs old", "io read", "io wrt", "clipped",
              "redone");
  for (const Regime& regime : regimes) {
    ClipTotals totals[kJobs];
    for (int round = 0; round <= flags.rounds; ++round) {
      for (int i = 0; i < kJobs; ++i) {
        const int k = (i + round) % kJobs;
        JobPipeline& p = *jobs[k];
        ClipTotals block;
        double waited = 0;  // The "GPU" waiting for the optimizer.
        // The next forward: each layer's weights, then its compute.
        auto forward = [&] {
          for (size_t l = 0; l < flags.layers; ++l) {
            const double w0 = Now();
            Check(flags.streamed ? p.ReadWeight16(l, outs[l].data())
                                 : p.WaitLayer(l),
                  "fetch");
            waited += Now() - w0;
            sleep_ms(flags.forward_ms);
          }
        };
        const ProcIo io0 = ReadProcIo();
        const double t0 = Now();
        for (int step = 0; step < flags.steps; ++step) {
          forward();
          ClipOptions clip;
          clip.max_grad_norm = regime.limits[(round * flags.steps + step) % 2];
          Check(p.BeginIteration(1.0f, std::nullopt, clip), "begin");
          for (size_t j = 0; j < flags.layers; ++j) {
            const size_t l = flags.layers - 1 - j;
            sleep_ms(flags.backward_ms);
            Check(p.SubmitGradients(l, grads[l].data(),
                                    flags.streamed ? nullptr : outs[l].data()),
                  "submit");
          }
          const double e0 = Now();
          auto r = p.EndIteration();
          Check(r.status(), "end iteration");
          waited += Now() - e0;
          block.clipped += r->clipped;
          block.redone += r->redone_chunks;
        }
        forward();  // The last iteration's updates, where they still run.
        // And its commit, so the next job finds the disk quiet.
        Check(p.BeginIteration(), "begin");
        Check(p.AbortIteration(), "abort");
        const double seconds =
            Now() - t0 - flags.forward_ms * flags.layers / 1e3;
        const ProcIo io1 = ReadProcIo();
        if (round == 0) continue;
        ClipTotals& t = totals[k];
        t.seconds += seconds;
        t.exposed += waited;
        t.io_read += io1.read - io0.read;
        t.io_written += io1.written - io0.written;
        t.clipped += block.clipped;
        t.redone += block.redone;
        t.n += flags.steps;
      }
    }
    const double base = totals[0].seconds / totals[0].n;
    for (int k = 0; k < kJobs; ++k) {
      const ClipTotals& t = totals[k];
      const double per = t.n * params;
      std::printf(
          "%-10s %-11s %8.3f %9.3f %6.2fx %8.2f %8.2f %5llu/%-3d %6llu\n",
          k == 0 ? regime.name : "", names[k], t.seconds / t.n, t.exposed / t.n,
          t.seconds / t.n / base, t.io_read / per, t.io_written / per,
          static_cast<unsigned long long>(t.clipped), t.n,
          static_cast<unsigned long long>(t.redone));
    }
  }
  std::printf(
      "(iter s: per iteration of forward + backward + EndIteration, --steps "
      "of them back to back per round and the forward after the last one "
      "(its weight waits counted, its compute not); exposed s: the part of "
      "it the training loop waited for the optimizer: in EndIteration and "
      "for a layer's weights in the next forward; mean of %d rounds after "
      "a warm-up, the jobs' order rotated per round; redone: chunks updated "
      "twice; io: /proc/self/io, catalog included; redo-all: eager updates "
      "and a full redo when clipped; deferred: kDeferWhenCertain; "
      "+overlap: and settle_in_background; +read-ahead: and %llu MiB of "
      "states read ahead during backward)\n",
      flags.rounds, static_cast<unsigned long long>(flags.read_ahead_mib));
  return 0;
}

}  // namespace sched_bench
}  // namespace lohan
