#include "daemon/optim/sgd.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "daemon/optim/calibration.h"
#include "daemon/optim/test_util.h"
#include "daemon/optim/worker_pool.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using optim_test::MakeGrad;
using optim_test::RandomFloats;
using optim_test::RefSgd;
using optim_test::TestGrad;

class SgdIsaTest : public testing::TestWithParam<Isa> {
 protected:
  void SetUp() override { LOHAN_SKIP_IF_CPU_LACKS(GetParam()); }

  // K steps against the float64 reference. Tolerance per element, with
  // u = 2^-24 and the magnitudes RefSgd tracks (buf may cancel to ~0):
  //   |buf - buf_ref| <= 1e-6 |buf_ref| + 4u K g_mag
  //   |w - w_ref|     <= 4u K w_mag + 8u K lr g_mag (1 + momentum)
  void Run(std::size_t n, const SgdOptions& o, DType gdt, float inv_scale,
           WorkerPool* pool, int steps = 10) {
    absl::StatusOr<SgdUpdater> u = SgdUpdater::Create(pool, GetParam());
    ASSERT_TRUE(u.ok()) << u.status();
    std::vector<float> w = RandomFloats(n, 3, 0.5f);
    std::vector<float> buf(n, 123.0f);  // garbage: step 0 must overwrite it
    RefSgd ref;
    ref.w = optim_test::ToDouble(w);
    ref.buf.assign(n, 0.0);
    SgdTensor t;
    t.size = n;
    t.weight = w.data();
    t.momentum_buffer = buf.data();
    for (int s = 0; s < steps; ++s) {
      std::vector<float> raw = RandomFloats(n, 40 + s, 1e-2f);
      for (float& x : raw) x /= inv_scale;
      const TestGrad g = MakeGrad(raw, gdt);
      absl::StatusOr<StepStats> st =
          u->Step(o, t, GradientView{g.data(), gdt, inv_scale});
      ASSERT_TRUE(st.ok()) << st.status();
      EXPECT_FALSE(st->grad_nonfinite);
      ref.Step(o, optim_test::Scaled(g.values, inv_scale));
    }
    EXPECT_EQ(t.step, steps);
    for (std::size_t i = 0; i < n; ++i) {
      constexpr double kU = 0x1p-24;
      const double tol = 4 * kU * steps * ref.w_mag[i] + 8 * kU * steps * o.lr *
                                                             ref.g_mag[i] *
                                                             (1 + o.momentum);
      ASSERT_NEAR(w[i], ref.w[i], tol) << i;
      if (o.momentum != 0) {
        ASSERT_NEAR(buf[i], ref.buf[i],
                    1e-6 * std::abs(ref.buf[i]) + 4 * kU * steps * ref.g_mag[i])
            << i;
      }
    }
  }
};

TEST_P(SgdIsaTest, PlainMomentumNesterovDampeningWeightDecay) {
  for (std::size_t n : {1, 7, 15, 17, 1023}) {
    SgdOptions o;
    o.lr = 0.1;
    Run(n, o, DType::kFloat32, 1.0f, nullptr);
    o.momentum = 0.9;
    Run(n, o, DType::kFloat32, 1.0f, nullptr);
    o.dampening = 0.1;
    o.weight_decay = 1e-3;
    Run(n, o, DType::kBFloat16, 1.0f, nullptr);
    o.dampening = 0;
    o.nesterov = true;
    Run(n, o, DType::kFloat16, 1.0f / 256, nullptr);
  }
}

TEST_P(SgdIsaTest, BitIdenticalAcrossThreadCounts) {
  constexpr std::size_t kN = 5 * optim_internal::kChunkElements + 77;
  absl::StatusOr<SgdUpdater> base_updater =
      SgdUpdater::Create(nullptr, GetParam());
  ASSERT_TRUE(base_updater.ok());
  SgdOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.weight_decay = 1e-4;
  const TestGrad g = MakeGrad(RandomFloats(kN, 8, 1e-2f), DType::kBFloat16);
  auto run = [&](const SgdUpdater& u, std::vector<float>& w,
                 std::vector<uint16_t>& out) {
    w = RandomFloats(kN, 9);
    std::vector<float> buf(kN);
    out.assign(kN, 0);
    SgdTensor t{kN, w.data(), buf.data(), 0};
    double sums = 0;
    for (int s = 0; s < 3; ++s) {
      auto st = u.Step(o, t, GradientView{g.data(), DType::kBFloat16, 1.0f},
                       HalfOutput{out.data(), DType::kFloat16});
      EXPECT_TRUE(st.ok());
      sums += st->grad_sum_squares;
    }
    return sums;
  };
  std::vector<float> w0;
  std::vector<uint16_t> out0;
  const double sum0 = run(*base_updater, w0, out0);
  for (int threads : {1, 2, 3, 7}) {
    auto pool = WorkerPool::Create({threads, true});
    ASSERT_TRUE(pool.ok());
    absl::StatusOr<SgdUpdater> u = SgdUpdater::Create(pool->get(), GetParam());
    ASSERT_TRUE(u.ok());
    // Every tuning moves memory differently and computes the same bits.
    for (const KernelTuning& tuning : CandidateTunings(threads)) {
      SCOPED_TRACE(testing::Message()
                   << threads << " threads, " << TuningName(tuning));
      std::vector<float> w;
      std::vector<uint16_t> out;
      EXPECT_EQ(run(u->WithTuning(tuning), w, out), sum0);
      EXPECT_EQ(optim_test::FirstBitDifference(w.data(), w0.data(), kN, 4), -1);
      EXPECT_EQ(optim_test::FirstBitDifference(out.data(), out0.data(), kN, 2),
                -1);
    }
  }
}

TEST_P(SgdIsaTest, FlagsNonFiniteAndRejectsBadOptions) {
  absl::StatusOr<SgdUpdater> u = SgdUpdater::Create(nullptr, GetParam());
  ASSERT_TRUE(u.ok());
  std::vector<float> w(17, 1.0f), buf(17), g(17, 0.5f);
  g[16] = std::numeric_limits<float>::quiet_NaN();
  SgdTensor t{17, w.data(), buf.data(), 0};
  SgdOptions o;
  o.momentum = 0.9;
  auto st = u->Step(o, t, GradientView{g.data(), DType::kFloat32, 1.0f});
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->grad_nonfinite);
  o.nesterov = true;
  o.dampening = 0.5;
  EXPECT_FALSE(
      u->Step(o, t, GradientView{g.data(), DType::kFloat32, 1.0f}).ok());
  SgdTensor no_buf{17, w.data(), nullptr, 0};
  EXPECT_FALSE(u->Step(SgdOptions{0.1, 0.9}, no_buf,
                       GradientView{g.data(), DType::kFloat32, 1.0f})
                   .ok());
  // Without momentum no buffer is needed.
  EXPECT_TRUE(u->Step(SgdOptions{0.1}, no_buf,
                      GradientView{g.data(), DType::kFloat32, 1.0f})
                  .ok());
}

INSTANTIATE_TEST_SUITE_P(AllIsas, SgdIsaTest,
                         testing::ValuesIn(optim_test::AllIsas()),
                         optim_test::IsaTestName);

}  // namespace
}  // namespace lohan
