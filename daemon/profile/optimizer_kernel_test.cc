#include "daemon/profile/optimizer_kernel.h"

#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

class OptimizerKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool = WorkerPool::Create({2, true});
    ASSERT_TRUE(pool.ok());
    pool_ = *std::move(pool);
  }

  // "auto" timed small: real steps, a fraction of a second.
  KernelChoiceOptions Auto() const {
    KernelChoiceOptions options;
    options.state_dir = dir_.path();
    options.tuning = "auto";
    options.calibration.tensor_parameters = 16384;
    options.calibration.working_set_bytes = std::size_t{4} << 20;
    options.calibration.rounds = 1;
    return options;
  }

  std::string CachePath() const {
    return dir_.path() + "/optimizer_calibration.pb";
  }

  testing_util::TempDir dir_;
  std::unique_ptr<WorkerPool> pool_;
};

TEST_F(OptimizerKernelTest, AutoTimesOnceThenUsesTheCache) {
  absl::StatusOr<KernelChoice> first =
      ChooseOptimizerKernel(pool_.get(), Auto());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->source, "calibrated");
  ASSERT_TRUE(first->calibration.has_value());
  EXPECT_EQ(first->calibration->key(), CalibrationKey(2, std::nullopt));
  EXPECT_EQ(first->calibration->tuning(), TuningName(first->tuning));
  EXPECT_EQ(first->calibration->isa(), IsaName(first->isa));
  EXPECT_EQ(static_cast<std::size_t>(first->calibration->candidates_size()),
            CandidateTunings(2).size() * CalibrationIsas(std::nullopt).size());
  EXPECT_TRUE(CpuSupportsIsa(first->isa));

  absl::StatusOr<KernelChoice> second =
      ChooseOptimizerKernel(pool_.get(), Auto());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->source, "calibrated earlier");
  EXPECT_EQ(second->isa, first->isa);
  EXPECT_EQ(second->tuning, first->tuning);
  EXPECT_EQ(second->calibration->measured_unix_seconds(),
            first->calibration->measured_unix_seconds());

  KernelChoiceOptions again = Auto();
  again.recalibrate = true;
  absl::StatusOr<KernelChoice> third =
      ChooseOptimizerKernel(pool_.get(), again);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->source, "calibrated");
}

TEST_F(OptimizerKernelTest, AnotherThreadCountOrForcedIsaTimesAgain) {
  ASSERT_TRUE(ChooseOptimizerKernel(pool_.get(), Auto()).ok());
  absl::StatusOr<KernelChoice> one_thread =
      ChooseOptimizerKernel(nullptr, Auto());
  ASSERT_TRUE(one_thread.ok());
  EXPECT_EQ(one_thread->source, "calibrated");
  KernelChoiceOptions scalar = Auto();
  scalar.forced_isa = Isa::kScalar;
  absl::StatusOr<KernelChoice> forced = ChooseOptimizerKernel(nullptr, scalar);
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(forced->source, "calibrated");
  EXPECT_EQ(forced->isa, Isa::kScalar);
  for (const v1::CalibrationCandidate& c : forced->calibration->candidates()) {
    EXPECT_EQ(c.isa(), "scalar");
  }
}

TEST_F(OptimizerKernelTest, DamagedOrForeignCachesAreTimedAgain) {
  for (const std::string& content :
       {std::string("\xff\xff not a proto"), std::string()}) {
    std::ofstream(CachePath(), std::ios::binary | std::ios::trunc) << content;
    absl::StatusOr<KernelChoice> choice =
        ChooseOptimizerKernel(pool_.get(), Auto());
    ASSERT_TRUE(choice.ok());
    EXPECT_EQ(choice->source, "calibrated");
  }
  // A record with the right key naming a kernel that does not parse.
  v1::OptimizerCalibration bad;
  bad.set_key(CalibrationKey(2, std::nullopt));
  bad.set_isa("avx1024");
  bad.set_tuning("prefetch=1024,stream=on,chunks=1");
  {
    std::ofstream out(CachePath(), std::ios::binary | std::ios::trunc);
    ASSERT_TRUE(bad.SerializeToOstream(&out));
  }
  absl::StatusOr<KernelChoice> choice =
      ChooseOptimizerKernel(pool_.get(), Auto());
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->source, "calibrated");
  EXPECT_NE(choice->calibration->isa(), "avx1024");
}

TEST_F(OptimizerKernelTest, ACalibrationThatFailsLeavesTheDefault) {
  KernelChoiceOptions options = Auto();
  options.calibration.working_set_bytes = std::size_t{1} << 60;
  absl::StatusOr<KernelChoice> choice =
      ChooseOptimizerKernel(pool_.get(), options);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->source, "default");
  EXPECT_EQ(choice->tuning, KernelTuning{});
  EXPECT_EQ(choice->isa, BestIsa());
  EXPECT_FALSE(choice->calibration.has_value());
  // Nothing cached: the next start tries again.
  EXPECT_FALSE(std::ifstream(CachePath()).good());
}

TEST_F(OptimizerKernelTest, ConfiguredAndDefaultAreNotTimed) {
  KernelChoiceOptions options = Auto();
  options.tuning = "prefetch=0,stream=off,chunks=4";
  options.forced_isa = Isa::kScalar;
  absl::StatusOr<KernelChoice> configured =
      ChooseOptimizerKernel(pool_.get(), options);
  ASSERT_TRUE(configured.ok());
  EXPECT_EQ(configured->source, "configured");
  EXPECT_EQ(configured->isa, Isa::kScalar);
  EXPECT_EQ(configured->tuning, (KernelTuning{0, false, 4}));
  options.tuning = "default";
  options.forced_isa.reset();
  absl::StatusOr<KernelChoice> plain =
      ChooseOptimizerKernel(pool_.get(), options);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->source, "default");
  EXPECT_EQ(plain->isa, BestIsa());
  EXPECT_FALSE(std::ifstream(CachePath()).good());
  options.tuning = "prefetch=lots";
  EXPECT_EQ(ChooseOptimizerKernel(pool_.get(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lohan
