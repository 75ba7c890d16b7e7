// EndIteration with a given global sum of squares (data-parallel ranks
// whose pipelines each hold a shard of the model): two pipelines holding
// half of clip_test::Layout's layers each, both given the sum over both
// halves, must commit what one pipeline of the whole model commits, bit for
// bit (norm, scale, outcome, fp32 weights, moments, 16-bit copies), though
// each half's own sum says something else. The gradients are multiples of
// 1/64 (few bits), so every sum of their squares is exact in any order and
// the halves' sum is the whole pipeline's own, bit for bit.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "daemon/optim/adam.h"
#include "daemon/optim/half.h"
#include "daemon/sched/clip_test_util.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/store/tensor_store.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

struct Variant {
  ClipSchedule clip_schedule;
  Schedule schedule;
  DType grad_dtype;
  bool streamed;  // Gradients and 16-bit weights through the store.
  bool settle = false;
};

// The whole model's layers {2500, 1000, 37, 4097}; the halves hold layers
// 0-1 and 2-3.
constexpr size_t kLayers = 4;
constexpr size_t kSplit = 2;
enum Job { kWhole = 0, kLow = 1, kHigh = 2, kJobs = 3 };

// What one job produced in an iteration, by the whole model's layer.
struct Outcome {
  IterationReport report;
  std::vector<std::vector<float>> weights, exp_avg, exp_avg_sq;
  std::vector<std::vector<uint16_t>> weight16;
};

// One iteration's gradients of the whole model: multiples of 1/64 in
// [-0.625, 0.625] (exact in bf16), with a NaN in `nan_layer` (>= 0), and
// the exact sum of squares of x * grad_scale of each layer.
struct Gradients {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<double> sum_squares;
};

Gradients MakeGradients(const ModelLayout& layout, uint32_t seed,
                        float grad_scale, int nan_layer = -1) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> steps(-40, 40);
  const bool fp32 = layout.grad_dtype == DType::kFloat32;
  Gradients g;
  for (size_t l = 0; l < kLayers; ++l) {
    const uint64_t n = layout.layer_elements[l];
    g.bytes.emplace_back(n * (fp32 ? 4 : 2));
    double sum = 0.0;
    for (uint64_t i = 0; i < n; ++i) {
      const float x = static_cast<float>(steps(rng)) / 64.0f;
      if (fp32) {
        std::memcpy(&g.bytes[l][4 * i], &x, 4);
      } else {
        const uint16_t h = FloatToBf16(x);
        std::memcpy(&g.bytes[l][2 * i], &h, 2);
      }
      const double scaled = static_cast<double>(x * grad_scale);
      sum += scaled * scaled;
    }
    g.sum_squares.push_back(sum);
  }
  if (nan_layer >= 0) {
    // 0xffff is a NaN in bf16, and half of an fp32 NaN's bytes.
    g.bytes[nan_layer][6] = 0xff;
    g.bytes[nan_layer][7] = 0xff;
    g.sum_squares[nan_layer] = std::numeric_limits<double>::quiet_NaN();
  }
  return g;
}

// The same double, NaNs of any bits counting as one.
bool SameDouble(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 8) == 0;
}

class ShardedNormTest : public clip_test::UpdaterAndStoreTest<Variant> {
 protected:
  void SetUp() override {
    UpdaterAndStoreTest::SetUp();
    if (HasFatalFailure()) return;
    layout_ = clip_test::Layout(GetParam().grad_dtype);
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 0.5f);
    initial_.resize(kLayers);
    for (size_t l = 0; l < kLayers; ++l) {
      initial_[l].resize(layout_.layer_elements[l]);
      for (float& x : initial_[l]) x = dist(rng);
    }
    ASSERT_NO_FATAL_FAILURE(Open(kWhole, "whole", 0, kLayers));
    ASSERT_NO_FATAL_FAILURE(Open(kLow, "low", 0, kSplit));
    ASSERT_NO_FATAL_FAILURE(Open(kHigh, "high", kSplit, kLayers - kSplit));
  }

  // The whole model's layers job `k` holds.
  size_t First(int k) const { return first_[k]; }
  size_t Count(int k) const { return count_[k]; }

  // Opens job `k` as `name`, holding the whole model's `count` layers from
  // `first` with their initial weights.
  void Open(int k, const std::string& name, size_t first, size_t count) {
    first_[k] = first;
    count_[k] = count;
    ModelLayout layout = layout_;
    layout.layer_elements.assign(
        layout_.layer_elements.begin() + first,
        layout_.layer_elements.begin() + first + count);
    PipelineOptions options;
    options.schedule = GetParam().schedule;
    options.clip_schedule = GetParam().clip_schedule;
    options.buffers = 3;
    options.stream_gradients = GetParam().streamed;
    options.stream_weight16 = GetParam().streamed;
    options.settle_in_background = GetParam().settle;
    auto p = JobPipeline::Open(store_.get(), *updater_, name, layout, options);
    ASSERT_TRUE(p.ok()) << p.status();
    jobs_[k] = *std::move(p);
    out_[k].clear();
    for (size_t j = 0; j < Count(k); ++j) {
      const std::vector<float>& w = initial_[First(k) + j];
      ASSERT_TRUE(jobs_[k]->InitializeWeights(j, w.data()).ok());
      // What a client's buffer holds: the committed weights' copy.
      out_[k].emplace_back(w.size());
      for (size_t i = 0; i < w.size(); ++i) out_[k][j][i] = FloatToBf16(w[i]);
    }
  }

  // Hands job `k` its layers' gradients, last layer first.
  void Backward(int k, const Gradients& g, float grad_scale,
                const ClipOptions& clip) {
    JobPipeline& p = *jobs_[k];
    ASSERT_TRUE(p.BeginIteration(grad_scale, std::nullopt, clip).ok());
    std::vector<uint8_t> slot;
    for (size_t j = Count(k); j-- > 0;) {
      const std::vector<uint8_t>& grad = g.bytes[First(k) + j];
      if (GetParam().streamed) {
        slot = grad;  // One reused buffer.
        ASSERT_TRUE(p.SubmitGradients(j, slot.data(), nullptr).ok());
        std::fill(slot.begin(), slot.end(), 0x7f);
      } else {
        ASSERT_TRUE(p.SubmitGradients(j, grad.data(), out_[k][j].data()).ok());
      }
    }
  }

  // Reads job `k`'s weights, moments and 16-bit copies once settled.
  void Collect(int k, Outcome& o) {
    JobPipeline& p = *jobs_[k];
    for (size_t j = 0; j < Count(k); ++j) {
      const size_t n = layout_.layer_elements[First(k) + j];
      ASSERT_TRUE(p.WaitLayer(j).ok());
      o.weights.emplace_back(n);
      o.exp_avg.emplace_back(n);
      o.exp_avg_sq.emplace_back(n);
      ASSERT_TRUE(p.ReadWeights(j, o.weights.back().data()).ok());
      ASSERT_TRUE(
          p.ReadState(j, StatePart::kExpAvg, o.exp_avg.back().data()).ok());
      ASSERT_TRUE(
          p.ReadState(j, StatePart::kExpAvgSq, o.exp_avg_sq.back().data())
              .ok());
      if (GetParam().streamed) {
        o.weight16.emplace_back(n);
        ASSERT_TRUE(p.ReadWeight16(j, o.weight16.back().data()).ok());
      } else {
        o.weight16.push_back(out_[k][j]);
      }
    }
  }

  // One iteration of job `k`, ended with `global` (nullopt: its own sum).
  Outcome Run(int k, const Gradients& g, float grad_scale,
              const ClipOptions& clip, std::optional<double> global) {
    Outcome o;
    Backward(k, g, grad_scale, clip);
    if (HasFatalFailure()) return o;
    absl::StatusOr<IterationReport> report = jobs_[k]->EndIteration(global);
    EXPECT_TRUE(report.ok()) << report.status();
    if (!report.ok()) return o;
    o.report = *report;
    Collect(k, o);
    return o;
  }

  // The whole model on its own sum, the halves on the sum of both: every
  // outcome and every bit of their states agree. Returns the low half's
  // report, with the high half's in `high`.
  IterationReport RunAll(uint32_t seed, const ClipOptions& clip,
                         float grad_scale = 1.0f, int nan_layer = -1,
                         IterationReport* high = nullptr) {
    const Gradients g = MakeGradients(layout_, seed, grad_scale, nan_layer);
    double global = 0.0;
    for (double s : g.sum_squares) global += s;
    Outcome o[kJobs];
    o[kWhole] = Run(kWhole, g, grad_scale, clip, std::nullopt);
    o[kLow] = Run(kLow, g, grad_scale, clip, global);
    o[kHigh] = Run(kHigh, g, grad_scale, clip, global);
    // The whole model's own norm is the given one's: the oracle holds.
    EXPECT_PRED2(SameDouble, o[kWhole].report.global_norm, std::sqrt(global));
    const IterationReport& whole = o[kWhole].report;
    for (int k : {kLow, kHigh}) {
      const IterationReport& r = o[k].report;
      EXPECT_TRUE(SameDouble(r.global_norm, whole.global_norm))
          << "job " << k << ": " << r.global_norm << " vs "
          << whole.global_norm;
      EXPECT_EQ(r.clipped, whole.clipped) << "job " << k;
      EXPECT_EQ(r.skipped, whole.skipped) << "job " << k;
      EXPECT_EQ(r.nonfinite, whole.nonfinite) << "job " << k;
      EXPECT_EQ(r.iteration, whole.iteration) << "job " << k;
      EXPECT_EQ(0, std::memcmp(&r.clip_scale, &whole.clip_scale, 8))
          << "job " << k;
      for (size_t j = 0; j < Count(k) && j < o[k].weights.size(); ++j) {
        const size_t l = First(k) + j;
        const size_t n = layout_.layer_elements[l];
        if (o[kWhole].weights.size() <= l) break;
        EXPECT_EQ(0, std::memcmp(o[k].weights[j].data(),
                                 o[kWhole].weights[l].data(), 4 * n))
            << "fp32 weights of layer " << l;
        EXPECT_EQ(0, std::memcmp(o[k].exp_avg[j].data(),
                                 o[kWhole].exp_avg[l].data(), 4 * n))
            << "exp_avg of layer " << l;
        EXPECT_EQ(0, std::memcmp(o[k].exp_avg_sq[j].data(),
                                 o[kWhole].exp_avg_sq[l].data(), 4 * n))
            << "exp_avg_sq of layer " << l;
        EXPECT_EQ(o[k].weight16[j], o[kWhole].weight16[l])
            << "16-bit copy of layer " << l;
      }
    }
    if (high != nullptr) *high = o[kHigh].report;
    return o[kLow].report;
  }

  // The exact sums of squares of each half's own gradients.
  double HalfSum(const Gradients& g, int k) const {
    double sum = 0.0;
    for (size_t j = 0; j < Count(k); ++j) sum += g.sum_squares[First(k) + j];
    return sum;
  }

  bool Eager() const { return GetParam().schedule != Schedule::kAfterBackward; }

  ModelLayout layout_;
  std::vector<std::vector<float>> initial_;  // By the whole model's layer.
  size_t first_[kJobs] = {};
  size_t count_[kJobs] = {};
  std::unique_ptr<JobPipeline> jobs_[kJobs];
  std::vector<std::vector<uint16_t>> out_[kJobs];
};

TEST_P(ShardedNormTest, HalvesGivenTheGlobalSumCommitWhatTheWholeModelDoes) {
  // Unclipped.
  RunAll(1, ClipOptions{.max_grad_norm = 1e9});
  // Clipped though neither half's own norm reaches the limit: the updates
  // each half made during backward are redone with the clip scale.
  const Gradients g = MakeGradients(layout_, 2, 0.5f);
  const double low = HalfSum(g, kLow), high = HalfSum(g, kHigh);
  const double limit = std::sqrt(std::max(low, high) + std::min(low, high) / 2);
  IterationReport high_report;
  IterationReport low_report =
      RunAll(2, ClipOptions{.max_grad_norm = limit}, 0.5f, -1, &high_report);
  EXPECT_TRUE(low_report.clipped);
  for (const IterationReport* r : {&low_report, &high_report}) {
    if (Eager()) {  // Nothing was certain from the own sum: all eager.
      EXPECT_EQ(r->deferred_chunks, 0u);
      EXPECT_GT(r->redone_chunks, 0u);
      EXPECT_EQ(r->redone_chunks, r->eager_chunks);
    }
  }
  // Clipped far below every norm (each half's own sum certain at once),
  // then unclipped again.
  RunAll(3, ClipOptions{.max_grad_norm = 1e-3});
  const IterationReport last = RunAll(4, ClipOptions{.max_grad_norm = 1e9});
  EXPECT_FALSE(last.clipped);
  EXPECT_EQ(last.iteration, 4u);
}

TEST_P(ShardedNormTest, AnInfInOneHalfSkipsBoth) {
  // A limit no finite norm here reaches: only the NaN decides.
  const ClipOptions clip{.max_grad_norm = 1e9, .skip_nonfinite = true};
  RunAll(5, clip);
  // The NaN is in layer 3 (the high half's): the low half's own gradients
  // are finite, its updates ran, and it skips all the same.
  IterationReport high;
  const IterationReport low = RunAll(6, clip, 1.0f, /*nan_layer=*/3, &high);
  EXPECT_TRUE(low.skipped);
  EXPECT_TRUE(low.nonfinite);
  EXPECT_TRUE(std::isnan(low.global_norm));
  EXPECT_TRUE(high.skipped);
  EXPECT_EQ(low.iteration, 1u);
  if (Eager()) {
    EXPECT_GT(low.eager_chunks, 0u);
  }
  // And the next iteration goes on from the same states everywhere.
  EXPECT_EQ(RunAll(7, clip).iteration, 2u);
}

TEST_P(ShardedNormTest, AGivenSumBelowTheOwnCommitsUnclipped) {
  // The own sum makes clipping certain from the first chunk (the updates
  // wait, kDeferWhenCertain), but the given sum (as rounding at the limit
  // may put it) says no clip: the job commits its gradients unclipped, as
  // a job without a limit does.
  const Gradients g = MakeGradients(layout_, 8, 1.0f);
  const double own = HalfSum(g, kLow);
  const double limit = std::sqrt(own) / 4;
  const double given = limit * limit / 4;  // norm limit / 2
  // The reference: the same layers and initial weights, clipping off.
  ASSERT_NO_FATAL_FAILURE(Open(kHigh, "reference", 0, kSplit));
  const Outcome clipped_off = Run(kHigh, g, 1.0f, ClipOptions{}, std::nullopt);
  const Outcome given_low =
      Run(kLow, g, 1.0f, ClipOptions{.max_grad_norm = limit}, given);
  EXPECT_FALSE(given_low.report.clipped);
  EXPECT_EQ(given_low.report.global_norm, std::sqrt(given));
  EXPECT_EQ(given_low.report.clip_scale, 1.0);
  EXPECT_EQ(given_low.report.iteration, 1u);
  if (GetParam().clip_schedule == ClipSchedule::kDeferWhenCertain) {
    EXPECT_EQ(given_low.report.eager_chunks, 0u);
    EXPECT_GT(given_low.report.deferred_chunks, 0u);
  }
  ASSERT_EQ(clipped_off.weights.size(), Count(kLow));
  ASSERT_EQ(given_low.weights.size(), Count(kLow));
  for (size_t j = 0; j < Count(kLow); ++j) {
    const size_t n = layout_.layer_elements[j];
    EXPECT_EQ(0, std::memcmp(given_low.weights[j].data(),
                             clipped_off.weights[j].data(), 4 * n))
        << "fp32 weights of layer " << j;
    EXPECT_EQ(0, std::memcmp(given_low.exp_avg_sq[j].data(),
                             clipped_off.exp_avg_sq[j].data(), 4 * n))
        << "exp_avg_sq of layer " << j;
    EXPECT_EQ(given_low.weight16[j], clipped_off.weight16[j])
        << "16-bit copy of layer " << j;
  }
}

TEST_P(ShardedNormTest, ANegativeSumIsRefusedAndTheIterationGoesOn) {
  const ClipOptions clip{.max_grad_norm = 1.0};
  const Gradients g = MakeGradients(layout_, 9, 1.0f);
  ASSERT_NO_FATAL_FAILURE(Backward(kLow, g, 1.0f, clip));
  for (double negative :
       {-1.0, -0.0, -std::numeric_limits<double>::infinity()}) {
    absl::StatusOr<IterationReport> refused =
        jobs_[kLow]->EndIteration(negative);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
        << negative;
    EXPECT_NE(refused.status().message().find("negative"), std::string::npos)
        << refused.status();
  }
  EXPECT_EQ(jobs_[kLow]->iteration(), 0u);
  // Still in progress: no new one begins, and it ends as it would have.
  EXPECT_EQ(jobs_[kLow]->BeginIteration().code(),
            absl::StatusCode::kFailedPrecondition);
  double global = 0.0;
  for (double s : g.sum_squares) global += s;
  absl::StatusOr<IterationReport> ended = jobs_[kLow]->EndIteration(global);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->global_norm, std::sqrt(global));
  EXPECT_EQ(ended->iteration, 1u);
  Outcome low;
  ASSERT_NO_FATAL_FAILURE(Collect(kLow, low));
  Outcome whole = Run(kWhole, g, 1.0f, clip, std::nullopt);
  ASSERT_EQ(whole.weights.size(), kLayers);
  for (size_t j = 0; j < Count(kLow); ++j) {
    EXPECT_EQ(0, std::memcmp(low.weights[j].data(), whole.weights[j].data(),
                             4 * layout_.layer_elements[j]))
        << "fp32 weights of layer " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ShardedNormTest,
    ::testing::Values(Variant{ClipSchedule::kDeferWhenCertain,
                              Schedule::kPipelined, DType::kBFloat16, false},
                      Variant{ClipSchedule::kRedoAll, Schedule::kPipelined,
                              DType::kBFloat16, false},
                      Variant{ClipSchedule::kDeferWhenCertain,
                              Schedule::kPipelined, DType::kFloat32, true},
                      Variant{ClipSchedule::kRedoAll, Schedule::kPipelined,
                              DType::kFloat32, true},
                      Variant{ClipSchedule::kDeferWhenCertain,
                              Schedule::kAfterBackward, DType::kBFloat16,
                              false},
                      Variant{ClipSchedule::kDeferWhenCertain,
                              Schedule::kPipelined, DType::kBFloat16, false,
                              /*settle=*/true}));

}  // namespace
}  // namespace lohan
