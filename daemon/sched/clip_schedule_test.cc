// ClipSchedule::kDeferWhenCertain against kRedoAll: two jobs of the same
// shape and initial weights, driven with the same gradients, must end every
// iteration with the same bits (norm, scale, outcome, fp32 weights, moments,
// 16-bit copies), while the deferred schedule updates each chunk once when
// the outcome is certain early and redoes only what it updated before.
// (job_pipeline_test checks the default schedule, kDeferWhenCertain,
// against a reference AdamW bit for bit.)

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon/optim/adam.h"
#include "daemon/optim/half.h"
#include "daemon/sched/clip_test_util.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/store/aio_device.h"
#include "daemon/store/fault_injection_device.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using clip_test::Gradients;
using clip_test::kChunks;
using clip_test::Layout;
using clip_test::MakeGradients;
using testing_util::TempDir;

struct Variant {
  Schedule schedule;
  DType grad_dtype;
  bool streamed;  // Gradients and 16-bit weights through the store.
  bool predict;
  bool settle = false;      // The deferred job's settle_in_background.
  uint64_t read_ahead = 0;  // The deferred job's read_ahead_bytes.
  uint64_t tier = 0;        // The deferred job's state tier (0: none).
  // Its updates copy the tier's states into chunk buffers and back
  // (StateTierMemory::update_in_place false).
  bool tier_copy = false;
};

// Read-ahead budgets: every chunk, and a few (2 to 4 buffers, by layout).
constexpr uint64_t kReadAheadAll = uint64_t{1} << 30;
constexpr uint64_t kReadAheadSome = 50000;
// State tiers: every chunk, and the first three (12 KB states each).
constexpr uint64_t kTierAll = uint64_t{1} << 30;
constexpr uint64_t kTierSome = 40000;

// What one job produced in an iteration.
struct Outcome {
  IterationReport report;
  std::vector<std::vector<float>> weights, exp_avg, exp_avg_sq;
  std::vector<std::vector<uint16_t>> weight16;
};

class ClipScheduleTest : public clip_test::UpdaterAndStoreTest<Variant> {
 protected:
  void SetUp() override {
    UpdaterAndStoreTest::SetUp();
    if (HasFatalFailure()) return;
    layout_ = Layout(GetParam().grad_dtype);
    if (GetParam().tier > 0) {
      tier_ = std::make_unique<MemoryShares>(GetParam().tier);
    }
    for (int k = 0; k < 2; ++k) {
      PipelineOptions options;
      options.schedule = GetParam().schedule;
      options.buffers = 3;
      options.stream_gradients = GetParam().streamed;
      options.stream_weight16 = GetParam().streamed;
      options.clip_schedule =
          k == 0 ? ClipSchedule::kRedoAll : ClipSchedule::kDeferWhenCertain;
      options.predict_clipping = GetParam().predict;
      options.settle_in_background = k == 1 && GetParam().settle;
      if (k == 1) options.read_ahead_bytes = GetParam().read_ahead;
      if (k == 1) options.state_tier.shares = tier_.get();
      // Fetches after the norm read the deferred job's new weights from
      // its handoff (the masters, or the streamed 16-bit copies).
      options.hand_off_weights = k == 1;
      options.state_tier.update_in_place = !GetParam().tier_copy;
      auto p = JobPipeline::Open(store_.get(), *updater_,
                                 k == 0 ? "old" : "new", layout_, options);
      ASSERT_TRUE(p.ok()) << p.status();
      jobs_[k] = *std::move(p);
      std::mt19937 rng(7);
      std::normal_distribution<float> dist(0.0f, 0.5f);
      out_[k].resize(layout_.layer_elements.size());
      for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
        std::vector<float> w(layout_.layer_elements[l]);
        for (float& x : w) x = dist(rng);
        ASSERT_TRUE(jobs_[k]->InitializeWeights(l, w.data()).ok());
        // What a client's buffer holds: the committed weights' copy.
        out_[k][l].resize(w.size());
        for (size_t i = 0; i < w.size(); ++i) out_[k][l][i] = FloatToBf16(w[i]);
      }
    }
  }

  Outcome Run(int k, const Gradients& g, float grad_scale,
              const ClipOptions& clip) {
    JobPipeline& p = *jobs_[k];
    const size_t layers = layout_.layer_elements.size();
    EXPECT_TRUE(p.BeginIteration(grad_scale, std::nullopt, clip).ok());
    std::vector<uint8_t> slot;
    for (size_t j = 0; j < layers; ++j) {
      const size_t l = layers - 1 - j;
      if (GetParam().streamed) {
        // One reused buffer: the pipeline may not look after the call.
        slot = g.bytes[l];
        EXPECT_TRUE(p.SubmitGradients(l, slot.data(), nullptr).ok());
        std::fill(slot.begin(), slot.end(), 0x7f);
      } else {
        EXPECT_TRUE(
            p.SubmitGradients(l, g.bytes[l].data(), out_[k][l].data()).ok());
      }
    }
    if (k == 1 && await_read_ahead_) AwaitReadAhead(p);
    Outcome o;
    absl::StatusOr<IterationReport> report = p.EndIteration();
    EXPECT_TRUE(report.ok()) << report.status();
    if (report.ok()) o.report = *report;
    // Settling: whenever updates are left after the norm (and, timing
    // permitting, when eager ones still run); never without the option or
    // after a skip.
    const bool settles = k == 1 && GetParam().settle && !o.report.skipped;
    if (!settles) {
      EXPECT_FALSE(o.report.settling);
    }
    if (settles &&
        (o.report.deferred_chunks > 0 || o.report.redone_chunks > 0)) {
      EXPECT_TRUE(o.report.settling);
    }
    for (size_t l = 0; l < layers; ++l) {
      const size_t n = layout_.layer_elements[l];
      // As the next forward would: this layer's update, and only it.
      EXPECT_TRUE(p.WaitLayer(l).ok());
      o.weights.emplace_back(n);
      o.exp_avg.emplace_back(n);
      o.exp_avg_sq.emplace_back(n);
      EXPECT_TRUE(p.ReadWeights(l, o.weights.back().data()).ok());
      EXPECT_TRUE(
          p.ReadState(l, StatePart::kExpAvg, o.exp_avg.back().data()).ok());
      EXPECT_TRUE(
          p.ReadState(l, StatePart::kExpAvgSq, o.exp_avg_sq.back().data())
              .ok());
      if (GetParam().streamed) {
        o.weight16.emplace_back(n);
        EXPECT_TRUE(p.ReadWeight16(l, o.weight16.back().data()).ok());
      } else {
        o.weight16.push_back(out_[k][l]);
      }
    }
    return o;
  }

  // Runs both jobs on the same iteration and checks they agree bit for bit;
  // returns the deferred job's report, with the redo-all job's in `old`.
  IterationReport RunBoth(uint32_t seed, const ClipOptions& clip,
                          float grad_scale = 1.0f, int nan_layer = -1,
                          IterationReport* old = nullptr) {
    const Gradients g = MakeGradients(layout_, seed, grad_scale, nan_layer);
    const Outcome a = Run(0, g, grad_scale, clip);
    const Outcome b = Run(1, g, grad_scale, clip);
    EXPECT_EQ(0, std::memcmp(&a.report.global_norm, &b.report.global_norm, 8))
        << a.report.global_norm << " vs " << b.report.global_norm;
    EXPECT_EQ(a.report.clipped, b.report.clipped);
    EXPECT_EQ(a.report.skipped, b.report.skipped);
    EXPECT_EQ(a.report.nonfinite, b.report.nonfinite);
    EXPECT_EQ(a.report.iteration, b.report.iteration);
    EXPECT_EQ(0, std::memcmp(&a.report.clip_scale, &b.report.clip_scale, 8));
    for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
      const size_t n = layout_.layer_elements[l];
      EXPECT_EQ(0, std::memcmp(a.weights[l].data(), b.weights[l].data(), 4 * n))
          << "fp32 weights of layer " << l;
      EXPECT_EQ(0, std::memcmp(a.exp_avg[l].data(), b.exp_avg[l].data(), 4 * n))
          << "exp_avg of layer " << l;
      EXPECT_EQ(
          0, std::memcmp(a.exp_avg_sq[l].data(), b.exp_avg_sq[l].data(), 4 * n))
          << "exp_avg_sq of layer " << l;
      EXPECT_EQ(a.weight16[l], b.weight16[l]) << "16-bit copy of layer " << l;
      size_t stale = 0;
      for (size_t i = 0; i < n; ++i) {
        stale += b.weight16[l][i] != FloatToBf16(b.weights[l][i]);
      }
      EXPECT_EQ(stale, 0u) << "16-bit copies of layer " << l
                           << " that are not the committed weights'";
    }
    for (const char* job : {"old", "new"}) {
      for (const std::string& name : store_->List(job)) {
        EXPECT_EQ(store_->Stat(job, name)->pending_version, 0u) << name;
        EXPECT_NE(name.rfind(StateLayout::kScratchPrefix, 0), 0u) << name;
      }
    }
    if (old != nullptr) *old = a.report;
    return b.report;
  }

  // Until the budget's chunks are read ahead (the read-ahead stops once
  // the norm is known: the counts are only exact if backward waits).
  void AwaitReadAhead(const JobPipeline& p) {
    const size_t budget = p.read_ahead_budget_chunks();
    for (int i = 0; i < 3000 && p.chunks_read_ahead() < budget; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(p.chunks_read_ahead(), budget);
  }

  // Clipping certain exactly at decision `chunk` (clip_test::).
  double LimitCrossingAt(uint32_t seed, size_t chunk, float grad_scale = 1) {
    return clip_test::LimitCrossingAt(layout_, seed, chunk, grad_scale);
  }

  // Streamed: the bytes of one iteration's gradients stored at submit.
  uint64_t GradBytes() const {
    if (!GetParam().streamed) return 0;
    uint64_t elements = 0;
    for (uint64_t n : layout_.layer_elements) elements += n;
    return elements * (layout_.grad_dtype == DType::kFloat32 ? 4 : 2);
  }

  // The streamed gradients the deferred job keeps in its tier's memory
  // instead of the store: every one when the tier holds every state with
  // room to spare.
  uint64_t GradBytesInRam() const {
    return GetParam().tier == kTierAll ? GradBytes() : 0;
  }

  bool AfterBackward() const {
    return GetParam().schedule == Schedule::kAfterBackward;
  }

  ModelLayout layout_;
  std::unique_ptr<MemoryShares> tier_;  // Outlives the jobs.
  std::unique_ptr<JobPipeline> jobs_[2];
  // Run waits for the deferred job's read-ahead before EndIteration.
  bool await_read_ahead_ = false;
  // Gradients handed over in an aborted iteration (alive past it).
  std::vector<std::vector<uint8_t>> kept_;
  std::vector<std::vector<uint16_t>> out_[2];
};

TEST_P(ClipScheduleTest, NeverClippedUpdatesEagerlyAndOnce) {
  for (uint32_t seed : {1, 2}) {
    IterationReport old;
    const IterationReport r =
        RunBoth(seed, ClipOptions{.max_grad_norm = 1e9}, 1.0f, -1, &old);
    EXPECT_FALSE(r.clipped);
    EXPECT_EQ(r.eager_chunks, AfterBackward() ? 0u : kChunks);
    EXPECT_EQ(r.deferred_chunks, AfterBackward() ? kChunks : 0u);
    EXPECT_EQ(r.redone_chunks, 0u);
    if (!GetParam().settle) {  // Else counted in the next report.
      // Every state read once, from the store or the tier (and a streamed
      // gradient from the store unless it stayed in RAM).
      EXPECT_EQ(r.busy.bytes_read + r.busy.bytes_from_tier + GradBytesInRam(),
                old.busy.bytes_read);
      EXPECT_EQ(r.busy.bytes_written + GradBytesInRam(),
                old.busy.bytes_written);
      if (seed == 2 && GetParam().tier == kTierAll) {
        // From the second iteration on, no state is read from the SSDs, and
        // no streamed gradient goes through them.
        EXPECT_EQ(r.busy.bytes_read, 0u);
        EXPECT_EQ(jobs_[1]->tier_stats().placed_chunks, kChunks);
        // Updated where the tier holds them, or copied out and back (the
        // 16-bit weight copies are the update's own output, no memcpy).
        const uint64_t states = r.busy.bytes_from_tier;
        EXPECT_EQ(states, old.busy.bytes_read - GradBytes());
        EXPECT_EQ(r.busy.bytes_in_tier, GetParam().tier_copy ? 0u : states);
        // The gradients copied into the tier's memory at submit (and the
        // 16-bit copies of updates still running at EndIteration, kept for
        // their fetch: as many as the timing gave).
        EXPECT_EQ(r.busy.bytes_copied - r.busy.bytes_handed_off,
                  (GetParam().tier_copy ? 2 * states : 0u) + GradBytes());
      }
      if (seed == 2 && GetParam().tier == kTierSome) {
        EXPECT_EQ(jobs_[1]->tier_stats().placed_chunks, 3u);
        EXPECT_GT(r.busy.bytes_from_tier, 0u);
        EXPECT_GT(r.busy.bytes_read, GradBytes());
      }
    }
  }
}

TEST_P(ClipScheduleTest, ClippedFromTheFirstChunkPaysOnePass) {
  await_read_ahead_ = true;
  IterationReport old;
  const IterationReport r = RunBoth(
      3, ClipOptions{.max_grad_norm = LimitCrossingAt(3, 0)}, 1.0f, -1, &old);
  EXPECT_TRUE(r.clipped);
  EXPECT_EQ(r.eager_chunks, 0u);
  EXPECT_EQ(r.deferred_chunks, kChunks);
  EXPECT_EQ(r.redone_chunks, 0u);
  EXPECT_EQ(old.redone_chunks, kChunks);
  // Each chunk's state read and written once: what redo-all moves for its
  // first pass alone (read ahead or not).
  if (!GetParam().settle) {  // Else counted in the next report.
    const size_t budget = jobs_[1]->read_ahead_budget_chunks();
    if (GetParam().read_ahead == kReadAheadAll) {
      EXPECT_EQ(budget, kChunks);
    } else if (GetParam().read_ahead > 0) {
      EXPECT_GE(budget, 2u);
      EXPECT_LT(budget, kChunks);
    } else {
      EXPECT_EQ(budget, 0u);
    }
    if (GetParam().tier == 0) {
      EXPECT_EQ(r.busy.read_ahead_used, budget);
    }
    // Streamed, the deferred job keeps in its read-ahead buffers the
    // gradients handed over once their states were read ahead (as many as
    // the timing gave: settle_test.cc controls it), and the rest in its
    // tier's memory if it has room; whatever it did not keep it stores
    // once at submit and reads once, as redo-all's first pass does.
    const uint64_t kept = r.busy.grad_bytes_kept_ahead + GradBytesInRam();
    if (GetParam().read_ahead == 0 || !GetParam().streamed) {
      EXPECT_EQ(r.busy.grad_bytes_kept_ahead, 0u);
    }
    EXPECT_EQ((r.busy.bytes_read + r.busy.bytes_from_tier + kept) * 2,
              old.busy.bytes_read);
    EXPECT_EQ((r.busy.bytes_written + kept) * 2,
              old.busy.bytes_written + GradBytes());
  }
}

TEST_P(ClipScheduleTest, CrossingLateRedoesOnlyTheChunksBefore) {
  // Certain at decision 7: layer 0's first chunk, after layers 3, 2 and 1.
  const IterationReport r =
      RunBoth(4, ClipOptions{.max_grad_norm = LimitCrossingAt(4, 7)});
  EXPECT_TRUE(r.clipped);
  EXPECT_EQ(r.eager_chunks, AfterBackward() ? 0u : 7u);
  EXPECT_EQ(r.deferred_chunks, AfterBackward() ? kChunks : 3u);
  EXPECT_EQ(r.redone_chunks + r.dropped_chunks, r.eager_chunks);
  // Crossing in the middle of layer 3 (decision 2), with a loss scale
  // (after a clipped iteration, unless the start is not predicted).
  const IterationReport mid = RunBoth(
      5, ClipOptions{.max_grad_norm = LimitCrossingAt(5, 2, 0.5f)}, 0.5f);
  EXPECT_TRUE(mid.clipped);
  EXPECT_EQ(mid.eager_chunks, AfterBackward() || GetParam().predict ? 0u : 2u);
  EXPECT_EQ(mid.redone_chunks + mid.dropped_chunks, mid.eager_chunks);
}

TEST_P(ClipScheduleTest, ClippingStreaksStartDeferredWhenPredicted) {
  const ClipOptions clip{.max_grad_norm = LimitCrossingAt(6, 8)};
  const IterationReport first = RunBoth(6, clip);
  EXPECT_TRUE(first.clipped);
  EXPECT_EQ(first.started_deferred, AfterBackward());
  // The same gradients and limit again: the history says clip.
  await_read_ahead_ = true;  // Certain or predicted: read-ahead queued.
  const IterationReport second = RunBoth(6, clip);
  await_read_ahead_ = false;
  EXPECT_TRUE(second.clipped);
  const bool predicted = GetParam().predict || AfterBackward();
  EXPECT_EQ(second.started_deferred, predicted);
  EXPECT_EQ(second.eager_chunks, predicted ? 0u : 8u);
  if (predicted && !GetParam().settle && GetParam().tier == 0) {
    // Read ahead from the start of backward, layer 0 first.
    EXPECT_EQ(second.busy.read_ahead_used,
              jobs_[1]->read_ahead_budget_chunks());
  }
  // A wrong guess: the next iteration does not clip. Its updates wait for
  // the norm, but each is made once, with the same result.
  const IterationReport third = RunBoth(8, ClipOptions{.max_grad_norm = 1e9});
  EXPECT_FALSE(third.clipped);
  EXPECT_EQ(third.started_deferred, predicted);
  EXPECT_EQ(third.redone_chunks, 0u);
  EXPECT_EQ(third.deferred_chunks, predicted ? kChunks : 0u);
  // And the one after that is eager again.
  const IterationReport fourth = RunBoth(9, ClipOptions{.max_grad_norm = 1e9});
  EXPECT_EQ(fourth.started_deferred, AfterBackward());
}

TEST_P(ClipScheduleTest, NonFiniteGradientsSkipAtAnyPoint) {
  // inf/NaN in the first layer handed over (layer 3) and in the last
  // (layer 0): the skip is certain at once, or after seven updates that
  // are then rolled back and their 16-bit copies restored.
  // A limit the finite gradients never reach: only the inf/NaN decides.
  const ClipOptions clip{.max_grad_norm = 1e9, .skip_nonfinite = true};
  RunBoth(10, ClipOptions{.max_grad_norm = 1e9});
  const IterationReport early = RunBoth(11, clip, 1.0f, /*nan_layer=*/3);
  EXPECT_TRUE(early.skipped);
  EXPECT_EQ(early.eager_chunks, 0u);
  const IterationReport late = RunBoth(12, clip, 1.0f, /*nan_layer=*/0);
  EXPECT_TRUE(late.skipped);
  EXPECT_EQ(late.iteration, 1u);
  EXPECT_EQ(late.eager_chunks, AfterBackward() ? 0u : 7u);
  // Without skipping, the update is committed as computed, unclipped, also
  // when the finite part had made clipping look certain (a norm of about
  // 2.8 against 1.0) and the chunks after it waited.
  const IterationReport kept = RunBoth(
      13, ClipOptions{.max_grad_norm = 1.0, .skip_nonfinite = false}, 1.0f, 0);
  EXPECT_FALSE(kept.skipped);
  EXPECT_FALSE(kept.clipped);
  EXPECT_EQ(kept.iteration, 2u);
  EXPECT_GT(kept.deferred_chunks, 0u);
}

TEST_P(ClipScheduleTest, AnAbortedIterationChangesNothing) {
  // Both jobs: an iteration that clips from its first chunk (so the next
  // one is predicted to clip, and reads ahead) abandoned after two layers,
  // one abandoned after all four, then clipped and unclipped ones: every
  // later iteration agrees bit for bit, from the weights before the aborts.
  RunBoth(14, ClipOptions{.max_grad_norm = LimitCrossingAt(14, 0)});
  const Gradients g = MakeGradients(layout_, 15, 1.0f, -1);
  for (int k = 0; k < 2; ++k) {
    for (size_t handed : {size_t{2}, size_t{4}}) {
      JobPipeline& p = *jobs_[k];
      ASSERT_TRUE(p.BeginIteration(1.0f, std::nullopt,
                                   ClipOptions{.max_grad_norm = 1e-3})
                      .ok());
      for (size_t j = 0; j < handed; ++j) {
        const size_t l = 3 - j;
        std::vector<uint8_t> slot = g.bytes[l];
        ASSERT_TRUE(
            p.SubmitGradients(l, slot.data(),
                              GetParam().streamed ? nullptr : out_[k][l].data())
                .ok());
        if (!GetParam().streamed) {
          // The buffer must outlive the iteration: keep it alive.
          kept_.push_back(std::move(slot));
        }
      }
      ASSERT_TRUE(p.AbortIteration().ok());
      EXPECT_EQ(p.iteration(), 1u);
    }
  }
  const IterationReport clipped =
      RunBoth(16, ClipOptions{.max_grad_norm = LimitCrossingAt(16, 4)});
  EXPECT_TRUE(clipped.clipped);
  EXPECT_EQ(clipped.iteration, 2u);
  const IterationReport unclipped = RunBoth(17, ClipOptions{});
  EXPECT_FALSE(unclipped.clipped);
  EXPECT_EQ(unclipped.iteration, 3u);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ClipScheduleTest,
    ::testing::Values(
        Variant{Schedule::kPipelined, DType::kBFloat16, false, true},
        Variant{Schedule::kPipelined, DType::kBFloat16, false, false},
        Variant{Schedule::kPipelined, DType::kFloat32, true, true},
        Variant{Schedule::kPipelined, DType::kFloat16, true, false},
        Variant{Schedule::kSerialized, DType::kBFloat16, false, true},
        Variant{Schedule::kAfterBackward, DType::kBFloat16, false, true},
        Variant{Schedule::kAfterBackward, DType::kBFloat16, true, false},
        Variant{Schedule::kPipelined, DType::kBFloat16, false, true, true},
        Variant{Schedule::kPipelined, DType::kFloat32, true, false, true},
        Variant{Schedule::kAfterBackward, DType::kFloat16, false, true, true},
        Variant{Schedule::kPipelined, DType::kBFloat16, false, true, false,
                kReadAheadAll},
        Variant{Schedule::kPipelined, DType::kFloat32, false, false, false,
                kReadAheadSome},
        Variant{Schedule::kPipelined, DType::kFloat16, false, true, true,
                kReadAheadAll},
        // Streamed gradients, read ahead between their stores.
        Variant{Schedule::kPipelined, DType::kBFloat16, true, true, false,
                kReadAheadAll},
        Variant{Schedule::kPipelined, DType::kFloat32, true, false, true,
                kReadAheadSome},
        Variant{Schedule::kPipelined, DType::kBFloat16, false, false, true,
                kReadAheadSome},
        // The state tier: every state in RAM, or the first three chunks'.
        Variant{Schedule::kPipelined, DType::kBFloat16, false, true, false, 0,
                kTierAll},
        Variant{Schedule::kPipelined, DType::kBFloat16, false, false, false, 0,
                kTierSome},
        Variant{Schedule::kPipelined, DType::kFloat32, true, false, true, 0,
                kTierSome},
        Variant{Schedule::kPipelined, DType::kBFloat16, false, true, false,
                kReadAheadSome, kTierSome},
        Variant{Schedule::kAfterBackward, DType::kFloat16, false, true, true, 0,
                kTierAll},
        // Streamed gradients in the tier's memory (every state placed, room
        // left beside them).
        Variant{Schedule::kPipelined, DType::kFloat32, true, true, false, 0,
                kTierAll},
        Variant{Schedule::kPipelined, DType::kBFloat16, true, false, true, 0,
                kTierAll},
        Variant{Schedule::kAfterBackward, DType::kFloat16, true, true, false, 0,
                kTierAll},
        // The tier's states copied into chunk buffers and back.
        Variant{Schedule::kPipelined, DType::kBFloat16, false, true, false, 0,
                kTierAll, true},
        Variant{Schedule::kPipelined, DType::kFloat32, true, false, true, 0,
                kTierSome, true}));

}  // namespace
}  // namespace lohan
