#include "daemon/optim/adam.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "daemon/optim/calibration.h"
#include "daemon/optim/half.h"
#include "daemon/optim/test_util.h"
#include "daemon/optim/worker_pool.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using optim_test::MakeGrad;
using optim_test::RandomFloats;
using optim_test::RandomPositive;
using optim_test::RefAdam;
using optim_test::TestGrad;

// Tolerance against the float64 reference after K steps, per element
// (u = 2^-24, float's unit roundoff; every step rounds a handful of times):
//   m:    |m - m_ref| <= 1e-6 |m_ref| + 4u K m_mag   (m_mag: m's recurrence
//         over |g|; m itself may cancel to ~0)
//   v:    |v - v_ref| <= 1e-5 |v_ref|                (no cancellation)
//   w:    |w - w_ref| <= 4u K w_mag + 1e-5 lr K      (w_mag: max |w| seen;
//         each step moves w by about lr, with a relative error of ~1e-6)
constexpr double kU = 0x1p-24;

// The fp32 state of one tensor plus its reference twin.
struct AdamCase {
  std::vector<float> w, m, v, vmax;
  RefAdam ref;
  AdamTensor tensor;

  AdamCase(std::size_t n, uint32_t seed, DType moments = DType::kFloat32) {
    w = RandomFloats(n, seed, 0.5f);
    m = RandomFloats(n, seed + 1, 0.01f);
    v = RandomPositive(n, seed + 2, 1e-4f);
    vmax = v;
    ref.w = optim_test::ToDouble(w);
    ref.m = optim_test::ToDouble(m);
    ref.v = optim_test::ToDouble(v);
    ref.vmax = optim_test::ToDouble(vmax);
    tensor.size = n;
    tensor.weight = w.data();
    tensor.exp_avg = m.data();
    tensor.exp_avg_sq = v.data();
    tensor.max_exp_avg_sq = vmax.data();
    tensor.moment_dtype = moments;
  }

  void ExpectNearReference(const AdamOptions& o, int steps) const {
    int failures = 0;
    for (std::size_t i = 0; i < w.size() && failures < 5; ++i) {
      const double tol_w = 4 * kU * steps * ref.w_mag[i] + 1e-5 * o.lr * steps;
      if (!(std::abs(w[i] - ref.w[i]) <= tol_w)) {
        ++failures;
        ADD_FAILURE() << "w[" << i << "] = " << w[i] << " want " << ref.w[i]
                      << " (tol " << tol_w << ")";
      }
      const double tol_m =
          1e-6 * std::abs(ref.m[i]) + 4 * kU * steps * ref.m_mag[i];
      if (!(std::abs(m[i] - ref.m[i]) <= tol_m)) {
        ++failures;
        ADD_FAILURE() << "m[" << i << "] = " << m[i] << " want " << ref.m[i];
      }
      const double tol_v = 1e-5 * std::abs(ref.v[i]) + 1e-30;
      if (!(std::abs(v[i] - ref.v[i]) <= tol_v)) {
        ++failures;
        ADD_FAILURE() << "v[" << i << "] = " << v[i] << " want " << ref.v[i];
      }
      if (o.amsgrad) {
        const double tol = 1e-5 * std::abs(ref.vmax[i]) + 1e-30;
        if (!(std::abs(vmax[i] - ref.vmax[i]) <= tol)) {
          ++failures;
          ADD_FAILURE() << "vmax[" << i << "] = " << vmax[i] << " want "
                        << ref.vmax[i];
        }
      }
    }
  }
};

class AdamIsaTest : public testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    LOHAN_SKIP_IF_CPU_LACKS(GetParam());
    absl::StatusOr<AdamUpdater> u = AdamUpdater::Create(nullptr, GetParam());
    ASSERT_TRUE(u.ok()) << u.status();
    updater_ = std::make_unique<AdamUpdater>(*u);
  }

  // Runs `steps` steps with fresh random gradients on both sides and checks
  // the result against the reference.
  void RunAgainstReference(std::size_t n, const AdamOptions& o, DType gdt,
                           float inv_scale = 1.0f, int steps = 5,
                           float grad_stddev = 1e-2f) {
    AdamCase c(n, 100 + static_cast<uint32_t>(n));
    for (int s = 0; s < steps; ++s) {
      std::vector<float> raw = RandomFloats(n, 1000 + s, grad_stddev);
      if (inv_scale != 1.0f) {
        for (float& x : raw) x /= inv_scale;  // the scaled gradient
      }
      const TestGrad g = MakeGrad(raw, gdt);
      absl::StatusOr<StepStats> stats =
          updater_->Step(o, c.tensor, GradientView{g.data(), gdt, inv_scale});
      ASSERT_TRUE(stats.ok()) << stats.status();
      const std::vector<double> unscaled =
          optim_test::Scaled(g.values, inv_scale);
      c.ref.Step(o, unscaled);
      double want_sq = 0;
      for (double x : unscaled) want_sq += x * x;
      EXPECT_NEAR(stats->grad_sum_squares, want_sq, 1e-6 * want_sq + 1e-300);
      EXPECT_FALSE(stats->grad_nonfinite);
      EXPECT_EQ(c.tensor.step, s + 1);
    }
    c.ExpectNearReference(o, steps);
  }

  std::unique_ptr<AdamUpdater> updater_;
};

TEST_P(AdamIsaTest, AdamWMatchesFloat64AcrossSizesAndGradTypes) {
  AdamOptions o;
  o.lr = 1e-3;
  o.weight_decay = 0.01;
  for (std::size_t n : {1, 7, 15, 16, 17, 31, 33, 1023, 16384 + 17}) {
    for (DType gdt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(testing::Message()
                   << "n=" << n << " grad " << DTypeName(gdt));
      RunAgainstReference(n, o, gdt);
    }
  }
}

TEST_P(AdamIsaTest, AdamWithL2WeightDecay) {
  AdamOptions o;
  o.lr = 2e-3;
  o.weight_decay = 0.1;
  o.decoupled_weight_decay = false;
  RunAgainstReference(1023, o, DType::kFloat32);
  RunAgainstReference(17, o, DType::kBFloat16);
}

TEST_P(AdamIsaTest, WeightDecayZero) {
  AdamOptions o;
  o.weight_decay = 0.0;
  RunAgainstReference(1023, o, DType::kFloat32);
  o.decoupled_weight_decay = false;
  RunAgainstReference(1023, o, DType::kFloat32);
}

TEST_P(AdamIsaTest, TinyAndLargeLearningRates) {
  AdamOptions o;
  o.weight_decay = 0.01;
  for (double lr : {1e-10, 1e-6, 1.0, 10.0}) {
    SCOPED_TRACE(testing::Message() << "lr=" << lr);
    o.lr = lr;
    RunAgainstReference(1023, o, DType::kFloat32, 1.0f, 10);
  }
}

TEST_P(AdamIsaTest, AmsGrad) {
  AdamOptions o;
  o.amsgrad = true;
  o.weight_decay = 0.01;
  RunAgainstReference(1023, o, DType::kFloat32, 1.0f, 10);
  RunAgainstReference(17, o, DType::kBFloat16, 1.0f, 10);
}

// DeepSpeed's bias_correction=False: the reference leaves out both
// 1 - beta^t factors too (test_util.h).
TEST_P(AdamIsaTest, WithoutBiasCorrection) {
  AdamOptions o;
  o.bias_correction = false;
  o.weight_decay = 0.01;
  RunAgainstReference(1023, o, DType::kFloat32, 1.0f, 10);
  RunAgainstReference(17, o, DType::kBFloat16, 1.0f, 10);
}

TEST_P(AdamIsaTest, Fp16GradientsWithUnscale) {
  AdamOptions o;
  o.weight_decay = 0.01;
  RunAgainstReference(1023, o, DType::kFloat16, 1.0f / 1024.0f);
  RunAgainstReference(15, o, DType::kFloat16, 1.0f / 65536.0f, 5, 1e-4f);
}

TEST_P(AdamIsaTest, ManyStepsStayNearReference) {
  AdamOptions o;
  o.weight_decay = 0.01;
  RunAgainstReference(1023, o, DType::kFloat32, 1.0f, 100);
}

TEST_P(AdamIsaTest, ZeroGradientLeavesWeightsWithoutDecay) {
  AdamCase c(1023, 5);
  std::fill(c.m.begin(), c.m.end(), 0.0f);
  std::fill(c.v.begin(), c.v.end(), 0.0f);
  const std::vector<float> before = c.w;
  const std::vector<float> zeros(1023, 0.0f);
  AdamOptions o;  // weight_decay 0
  absl::StatusOr<StepStats> stats = updater_->Step(
      o, c.tensor, GradientView{zeros.data(), DType::kFloat32, 1.0f});
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->grad_sum_squares, 0.0);
  EXPECT_FALSE(stats->grad_nonfinite);
  EXPECT_EQ(c.w, before);
  for (std::size_t i = 0; i < c.m.size(); ++i) {
    EXPECT_EQ(c.m[i], 0.0f);
    EXPECT_EQ(c.v[i], 0.0f);
  }
}

TEST_P(AdamIsaTest, NonFiniteGradientsAreFlagged) {
  const float kInf = std::numeric_limits<float>::infinity();
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  for (DType gdt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (float bad : {kInf, -kInf, kNan}) {
      for (std::size_t where : {0, 5, 16, 1022}) {
        SCOPED_TRACE(testing::Message()
                     << DTypeName(gdt) << " " << bad << " at " << where);
        AdamCase c(1023, 9);
        std::vector<float> raw = RandomFloats(1023, 3, 1e-2f);
        raw[where] = bad;
        const TestGrad g = MakeGrad(raw, gdt);
        absl::StatusOr<StepStats> stats = updater_->Step(
            AdamOptions{}, c.tensor, GradientView{g.data(), gdt, 1.0f});
        ASSERT_TRUE(stats.ok());
        EXPECT_TRUE(stats->grad_nonfinite);
        EXPECT_FALSE(std::isfinite(stats->grad_sum_squares));
      }
    }
  }
  // A finite fp16 gradient that overflows float once unscaled.
  AdamCase c(17, 9);
  std::vector<uint16_t> g(17, FloatToFp16(60000.0f));
  absl::StatusOr<StepStats> stats = updater_->Step(
      AdamOptions{}, c.tensor, GradientView{g.data(), DType::kFloat16, 1e36f});
  ASSERT_TRUE(stats.ok());
  EXPECT_TRUE(stats->grad_nonfinite);
}

TEST_P(AdamIsaTest, WritesRoundedHalfCopies) {
  for (DType out_dt : {DType::kBFloat16, DType::kFloat16}) {
    AdamCase c(1023, 11);
    const TestGrad g =
        MakeGrad(RandomFloats(1023, 12, 1e-2f), DType::kBFloat16);
    std::vector<uint16_t> out(1023, 0xDEAD);
    ASSERT_TRUE(updater_
                    ->Step(AdamOptions{}, c.tensor,
                           GradientView{g.data(), DType::kBFloat16, 1.0f},
                           HalfOutput{out.data(), out_dt})
                    .ok());
    for (std::size_t i = 0; i < out.size(); ++i) {
      const uint16_t want = out_dt == DType::kBFloat16 ? FloatToBf16(c.w[i])
                                                       : FloatToFp16(c.w[i]);
      ASSERT_EQ(out[i], want) << i;
    }
  }
}

TEST_P(AdamIsaTest, Bf16MomentsAccuracyCostVersusFp32) {
  // Same start, same gradients; one tensor keeps fp32 moments, the other
  // bf16. Prints how far the weights drift apart (the cost of halving the
  // moments' I/O) and bounds it loosely.
  constexpr std::size_t kN = 4096;
  constexpr int kSteps = 200;
  AdamOptions o;
  o.lr = 1e-3;
  o.weight_decay = 0.01;
  AdamCase fp32(kN, 21);
  std::fill(fp32.m.begin(), fp32.m.end(), 0.0f);
  std::fill(fp32.v.begin(), fp32.v.end(), 0.0f);
  std::vector<float> w16 = fp32.w;
  std::vector<uint16_t> m16(kN, 0), v16(kN, 0);
  AdamTensor t16;
  t16.size = kN;
  t16.weight = w16.data();
  t16.exp_avg = m16.data();
  t16.exp_avg_sq = v16.data();
  t16.moment_dtype = DType::kBFloat16;
  const std::vector<float> start = fp32.w;
  for (int s = 0; s < kSteps; ++s) {
    // A gradient with a persistent direction plus noise.
    std::vector<float> raw = RandomFloats(kN, 500 + s, 1e-2f);
    for (std::size_t i = 0; i < kN; ++i) raw[i] += 5e-3f * (i % 2 ? 1 : -1);
    const TestGrad g = MakeGrad(raw, DType::kBFloat16);
    const GradientView view{g.data(), DType::kBFloat16, 1.0f};
    ASSERT_TRUE(updater_->Step(o, fp32.tensor, view).ok());
    ASSERT_TRUE(updater_->Step(o, t16, view).ok());
  }
  double max_diff = 0, sum_diff_sq = 0, sum_move_sq = 0;
  for (std::size_t i = 0; i < kN; ++i) {
    const double d = static_cast<double>(w16[i]) - fp32.w[i];
    const double move = static_cast<double>(fp32.w[i]) - start[i];
    max_diff = std::max(max_diff, std::abs(d));
    sum_diff_sq += d * d;
    sum_move_sq += move * move;
  }
  const double relative = std::sqrt(sum_diff_sq / sum_move_sq);
  std::printf(
      "[%s] bf16 moments vs fp32 after %d AdamW steps (lr %g): max |dw| = "
      "%.3g, ||dw|| / ||w - w0|| = %.3g\n",
      std::string(IsaName(GetParam())).c_str(), kSteps, o.lr, max_diff,
      relative);
  RecordProperty("bf16_moment_relative_divergence", std::to_string(relative));
  EXPECT_LT(relative, 0.1);
}

TEST_P(AdamIsaTest, RejectsBadArguments) {
  AdamCase c(7, 1);
  std::vector<float> g(7, 0.1f);
  const GradientView grad{g.data(), DType::kFloat32, 1.0f};
  AdamOptions o;
  o.beta1 = 1.0;
  EXPECT_EQ(updater_->Step(o, c.tensor, grad).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = AdamOptions{};
  o.lr = -1;
  EXPECT_FALSE(updater_->Step(o, c.tensor, grad).ok());
  o = AdamOptions{};
  o.eps = std::nan("");
  EXPECT_FALSE(updater_->Step(o, c.tensor, grad).ok());
  o = AdamOptions{};
  o.amsgrad = true;
  AdamTensor no_max = c.tensor;
  no_max.max_exp_avg_sq = nullptr;
  EXPECT_FALSE(updater_->Step(o, no_max, grad).ok());
  AdamTensor null_w = c.tensor;
  null_w.weight = nullptr;
  EXPECT_FALSE(updater_->Step(AdamOptions{}, null_w, grad).ok());
  EXPECT_FALSE(updater_
                   ->Step(AdamOptions{}, c.tensor,
                          GradientView{nullptr, DType::kFloat32, 1.0f})
                   .ok());
  EXPECT_FALSE(updater_
                   ->Step(AdamOptions{}, c.tensor,
                          GradientView{g.data(), static_cast<DType>(7), 1.0f})
                   .ok());
  EXPECT_FALSE(updater_
                   ->Step(AdamOptions{}, c.tensor,
                          GradientView{g.data(), DType::kFloat32,
                                       std::numeric_limits<float>::infinity()})
                   .ok());
  AdamTensor fp16_moments = c.tensor;
  fp16_moments.moment_dtype = DType::kFloat16;
  EXPECT_FALSE(updater_->Step(AdamOptions{}, fp16_moments, grad).ok());
  std::vector<float> out(7);
  EXPECT_FALSE(updater_
                   ->Step(AdamOptions{}, c.tensor, grad,
                          HalfOutput{out.data(), DType::kFloat32})
                   .ok());
  // Nothing was touched by the failed calls.
  EXPECT_EQ(c.tensor.step, 0);
  EXPECT_EQ(c.w, std::vector<float>(c.ref.w.begin(), c.ref.w.end()));
  // An empty tensor is fine and counts its step.
  AdamTensor empty;
  absl::StatusOr<StepStats> s = updater_->Step(
      AdamOptions{}, empty, GradientView{nullptr, DType::kFloat32, 1.0f});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(empty.step, 1);
  EXPECT_EQ(s->grad_sum_squares, 0.0);
}

TEST_P(AdamIsaTest, GradSumSquaresIsStepsSumBitForBit) {
  // The scheduler learns the global norm from GradSumSquares before it
  // updates, and clips with it: it must be exactly the sum Step computes.
  const float kInf = std::numeric_limits<float>::infinity();
  auto pool = WorkerPool::Create({3, true});
  ASSERT_TRUE(pool.ok());
  absl::StatusOr<AdamUpdater> pooled =
      AdamUpdater::Create(pool->get(), GetParam());
  ASSERT_TRUE(pooled.ok());
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{17},
        std::size_t{1023}, 3 * optim_internal::kChunkElements + 77}) {
    for (DType gdt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (float inv_scale : {1.0f, 0.37f, 1.0f / 65536.0f}) {
        for (bool poison : {false, true}) {
          if (poison && n == 0) continue;
          SCOPED_TRACE(testing::Message()
                       << "n=" << n << " " << DTypeName(gdt) << " scale "
                       << inv_scale << (poison ? " with inf" : ""));
          std::vector<float> raw = RandomFloats(n, 70 + n, 3e-2f);
          if (poison) raw[n / 2] = kInf;
          const TestGrad g = MakeGrad(raw, gdt);
          const GradientView view{g.data(), gdt, inv_scale};
          AdamCase c(n, 5);
          absl::StatusOr<StepStats> stats =
              updater_->Step(AdamOptions{}, c.tensor, view);
          ASSERT_TRUE(stats.ok()) << stats.status();
          for (const AdamUpdater* u : {updater_.get(), &*pooled}) {
            absl::StatusOr<double> sum = u->GradSumSquares(view, n);
            ASSERT_TRUE(sum.ok()) << sum.status();
            if (std::isnan(stats->grad_sum_squares)) {
              EXPECT_TRUE(std::isnan(*sum));
            } else {
              EXPECT_EQ(optim_test::FirstBitDifference(
                            &*sum, &stats->grad_sum_squares, 1, 8),
                        -1)
                  << *sum << " vs " << stats->grad_sum_squares;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(
      updater_->GradSumSquares(GradientView{nullptr, DType::kBFloat16, 1}, 4)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  float one = 1.0f;
  EXPECT_EQ(updater_
                ->GradSumSquares(
                    GradientView{&one, DType::kFloat32,
                                 std::numeric_limits<float>::quiet_NaN()},
                    1)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, AdamIsaTest,
                         testing::ValuesIn(optim_test::AllIsas()),
                         optim_test::IsaTestName);

// ---- across ISAs and thread counts

struct Snapshot {
  std::vector<float> w, m, v, vmax;
  std::vector<uint16_t> out;
  std::vector<double> sums;
};

// Runs a few AdamW steps (AMSGrad, bf16 gradients, bf16 output) on a
// multi-chunk, ragged tensor and returns everything it produced. The output
// starts `out_misalign` elements past a 64-byte boundary (0: streaming
// stores apply).
Snapshot RunFixedWorkload(Isa isa, WorkerPool* pool, DType moments,
                          DType grad_dtype, std::size_t n,
                          const KernelTuning& tuning = KernelTuning{},
                          std::size_t out_misalign = 0) {
  absl::StatusOr<AdamUpdater> created = AdamUpdater::Create(pool, isa);
  EXPECT_TRUE(created.ok()) << created.status();
  const std::optional<AdamUpdater> u = created->WithTuning(tuning);
  EXPECT_EQ(u->tuning(), tuning);
  Snapshot s;
  s.w = RandomFloats(n, 1, 0.5f);
  const std::size_t msize = moments == DType::kFloat32 ? 4 : 2;
  std::vector<char> m(n * msize, 0), v(n * msize, 0), vmax(n * msize, 0);
  std::vector<uint16_t> out_storage(n + 64, 0);
  uint16_t* out = out_storage.data();
  while (reinterpret_cast<uintptr_t>(out) % 64 != 0) ++out;
  out += out_misalign;
  AdamTensor t;
  t.size = n;
  t.weight = s.w.data();
  t.exp_avg = m.data();
  t.exp_avg_sq = v.data();
  t.max_exp_avg_sq = vmax.data();
  t.moment_dtype = moments;
  AdamOptions o;
  o.amsgrad = true;
  o.weight_decay = 0.05;
  for (int step = 0; step < 4; ++step) {
    const TestGrad g = MakeGrad(RandomFloats(n, 50 + step, 1e-2f), grad_dtype);
    absl::StatusOr<StepStats> st =
        u->Step(o, t, GradientView{g.data(), grad_dtype, 0.5f},
                HalfOutput{out, DType::kBFloat16});
    EXPECT_TRUE(st.ok()) << st.status();
    s.sums.push_back(st.ok() ? st->grad_sum_squares : -1);
  }
  s.out.assign(out, out + n);
  auto to_floats = [&](const std::vector<char>& raw) {
    std::vector<float> f(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (moments == DType::kFloat32) {
        std::memcpy(&f[i], raw.data() + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, raw.data() + 2 * i, 2);
        f[i] = Bf16ToFloat(h);
      }
    }
    return f;
  };
  s.m = to_floats(m);
  s.v = to_floats(v);
  s.vmax = to_floats(vmax);
  return s;
}

void ExpectSameBits(const Snapshot& a, const Snapshot& b, bool sums_too) {
  const std::size_t n = a.w.size();
  EXPECT_EQ(optim_test::FirstBitDifference(a.w.data(), b.w.data(), n, 4), -1);
  EXPECT_EQ(optim_test::FirstBitDifference(a.m.data(), b.m.data(), n, 4), -1);
  EXPECT_EQ(optim_test::FirstBitDifference(a.v.data(), b.v.data(), n, 4), -1);
  EXPECT_EQ(optim_test::FirstBitDifference(a.vmax.data(), b.vmax.data(), n, 4),
            -1);
  EXPECT_EQ(optim_test::FirstBitDifference(a.out.data(), b.out.data(), n, 2),
            -1);
  if (sums_too) {
    EXPECT_EQ(optim_test::FirstBitDifference(a.sums.data(), b.sums.data(),
                                             a.sums.size(), 8),
              -1);
  } else {
    for (std::size_t i = 0; i < a.sums.size(); ++i) {
      EXPECT_NEAR(a.sums[i], b.sums[i], 1e-12 * a.sums[i]);
    }
  }
}

TEST(AdamDeterminismTest, BitIdenticalAcrossThreadCounts) {
  constexpr std::size_t kN = 7 * optim_internal::kChunkElements + 1001;
  for (Isa isa : optim_test::AllIsas()) {
    if (!CpuSupportsIsa(isa)) continue;
    for (DType moments : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(testing::Message()
                   << IsaName(isa) << " moments " << DTypeName(moments));
      const Snapshot base =
          RunFixedWorkload(isa, nullptr, moments, DType::kBFloat16, kN);
      for (int threads : {1, 2, 3, 7}) {
        SCOPED_TRACE(testing::Message() << threads << " threads");
        auto pool = WorkerPool::Create({threads, true});
        ASSERT_TRUE(pool.ok());
        ExpectSameBits(
            base,
            RunFixedWorkload(isa, pool->get(), moments, DType::kBFloat16, kN),
            /*sums_too=*/true);
      }
    }
  }
}

TEST(AdamDeterminismTest, BitIdenticalUnderEveryTuning) {
  // Prefetch distance, streaming stores and per-thread runs move memory
  // differently but compute the same: every tuning gives the default's
  // bits, sums of squares included, aligned or not, pooled or not.
  constexpr std::size_t kN = 9 * optim_internal::kChunkElements + 517;
  std::vector<KernelTuning> tunings = CandidateTunings(3);
  tunings.push_back({1, true, 3});
  tunings.push_back({std::size_t{1} << 20, false, 4096});
  auto pool = WorkerPool::Create({3, true});
  ASSERT_TRUE(pool.ok());
  for (Isa isa : optim_test::AllIsas()) {
    if (!CpuSupportsIsa(isa)) continue;
    for (std::size_t misalign : {0, 3}) {
      const Snapshot base = RunFixedWorkload(
          isa, nullptr, DType::kFloat32, DType::kBFloat16, kN, {}, misalign);
      for (const KernelTuning& tuning : tunings) {
        for (WorkerPool* p : {static_cast<WorkerPool*>(nullptr), pool->get()}) {
          SCOPED_TRACE(testing::Message()
                       << IsaName(isa) << " " << TuningName(tuning)
                       << " misalign " << misalign << (p ? " pool" : ""));
          ExpectSameBits(
              base,
              RunFixedWorkload(isa, p, DType::kFloat32, DType::kBFloat16, kN,
                               tuning, misalign),
              /*sums_too=*/true);
        }
      }
    }
  }
}

TEST(AdamDeterminismTest, GradSumSquaresMatchesStepUnderEveryTuning) {
  constexpr std::size_t kN = 3 * optim_internal::kChunkElements + 9;
  const TestGrad g = MakeGrad(RandomFloats(kN, 4, 1e-2f), DType::kFloat32);
  auto pool = WorkerPool::Create({2, true});
  ASSERT_TRUE(pool.ok());
  for (Isa isa : optim_test::AllIsas()) {
    if (!CpuSupportsIsa(isa)) continue;
    absl::StatusOr<AdamUpdater> created = AdamUpdater::Create(pool->get(), isa);
    ASSERT_TRUE(created.ok());
    const absl::StatusOr<double> reference = created->GradSumSquares(
        GradientView{g.data(), DType::kFloat32, 1.0f}, kN);
    ASSERT_TRUE(reference.ok());
    for (const KernelTuning& tuning : CandidateTunings(2)) {
      SCOPED_TRACE(TuningName(tuning));
      const absl::StatusOr<double> sum =
          created->WithTuning(tuning).GradSumSquares(
              GradientView{g.data(), DType::kFloat32, 1.0f}, kN);
      ASSERT_TRUE(sum.ok());
      EXPECT_EQ(*sum, *reference);
    }
  }
}

TEST(AdamDeterminismTest, SameBitsOnEveryIsa) {
  // Weights, moments and 16-bit copies are bit-identical across ISAs (same
  // float operations); only the sum of squares may differ in its last bits.
  for (std::size_t n : {1, 7, 15, 17, 1023, 16384 + 33}) {
    for (DType gdt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (DType moments : {DType::kFloat32, DType::kBFloat16}) {
        SCOPED_TRACE(testing::Message()
                     << "n=" << n << " grad " << DTypeName(gdt) << " moments "
                     << DTypeName(moments));
        const Snapshot scalar =
            RunFixedWorkload(Isa::kScalar, nullptr, moments, gdt, n);
        for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
          if (!CpuSupportsIsa(isa)) continue;
          SCOPED_TRACE(IsaName(isa));
          ExpectSameBits(scalar,
                         RunFixedWorkload(isa, nullptr, moments, gdt, n),
                         /*sums_too=*/false);
        }
      }
    }
  }
}

}  // namespace
}  // namespace lohan
