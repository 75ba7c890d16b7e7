#include "plan/working_set.h"

#include <cstdint>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/model_counts.h"
#include "plan/model_shape.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;

ModelCounts Counts(RecomputeUnit recompute, ParamUnit params) {
  ModelCounts counts = CountModel(*PresetShape("gpt-13b"), 128, 1024);
  counts.recompute_unit = recompute;
  counts.param_unit = params;
  return counts;
}

uint64_t Bytes(const ModelCounts& c, RecomputeUnit recompute,
               ParamUnit params) {
  return WorkingSetOf(c, recompute, params).bytes();
}

// Each finer unit needs less, so the first that fits is the coarsest that
// fits: whole blocks where they fit, then a sublayer-at-a-time backward,
// then weights a sublayer at a time too; the finest when none fits.
TEST(ChooseUnits, TheCoarsestUnitsThatFit) {
  const ModelCounts c = Counts(RecomputeUnit::kAuto, ParamUnit::kAuto);
  const uint64_t whole = Bytes(c, RecomputeUnit::kBlock, ParamUnit::kBlock);
  const uint64_t backward =
      Bytes(c, RecomputeUnit::kSublayer, ParamUnit::kBlock);
  const uint64_t weights =
      Bytes(c, RecomputeUnit::kSublayer, ParamUnit::kSublayer);
  ASSERT_GT(whole, backward);
  ASSERT_GT(backward, weights);
  const struct {
    uint64_t device;
    RecomputeUnit recompute;
    ParamUnit params;
  } cases[] = {
      {whole, RecomputeUnit::kBlock, ParamUnit::kBlock},
      {whole - 1, RecomputeUnit::kSublayer, ParamUnit::kBlock},
      {backward - 1, RecomputeUnit::kSublayer, ParamUnit::kSublayer},
      {1 * kGiB, RecomputeUnit::kSublayer, ParamUnit::kSublayer},
  };
  for (const auto& expected : cases) {
    absl::StatusOr<Units> units = ChooseUnits(c, expected.device);
    ASSERT_TRUE(units.ok()) << units.status();
    EXPECT_EQ(units->recompute, expected.recompute) << expected.device;
    EXPECT_EQ(units->params, expected.params) << expected.device;
  }
}

// A unit the counts name is kept, fitting or not; kAuto of the other
// chooses among what goes with it.
TEST(ChooseUnits, AUnitGivenIsKept) {
  ModelCounts c = Counts(RecomputeUnit::kBlock, ParamUnit::kAuto);
  absl::StatusOr<Units> units = ChooseUnits(c, 1 * kGiB);
  ASSERT_TRUE(units.ok()) << units.status();
  EXPECT_EQ(units->recompute, RecomputeUnit::kBlock);
  EXPECT_EQ(units->params, ParamUnit::kBlock);
  c = Counts(RecomputeUnit::kAuto, ParamUnit::kSublayer);
  units = ChooseUnits(c, 1024 * kGiB);
  ASSERT_TRUE(units.ok()) << units.status();
  EXPECT_EQ(units->recompute, RecomputeUnit::kSublayer);
  EXPECT_EQ(units->params, ParamUnit::kSublayer);
}

TEST(ChooseUnits, WeightsASublayerAtATimeNeedItsBackwardAndItsSublayers) {
  ModelCounts c = Counts(RecomputeUnit::kBlock, ParamUnit::kSublayer);
  EXPECT_THAT(ChooseUnits(c, kGiB).status().message(),
              HasSubstr("need a backward a sublayer at a time"));
  c = Counts(RecomputeUnit::kAuto, ParamUnit::kSublayer);
  c.sublayer_parameters.clear();
  EXPECT_THAT(ChooseUnits(c, kGiB).status().message(),
              HasSubstr("sublayers' parameters"));
  // Without them auto streams whole blocks.
  c.param_unit = ParamUnit::kAuto;
  absl::StatusOr<Units> units = ChooseUnits(c, 1);
  ASSERT_TRUE(units.ok()) << units.status();
  EXPECT_EQ(units->params, ParamUnit::kBlock);
}

// Weights a sublayer at a time: two sublayers' weights and two blocks'
// own always, one sublayer's gradients (and the block's own) in a block's
// backward.
TEST(WorkingSetOf, WeightsASublayerAtATime) {
  const ModelCounts c = Counts(RecomputeUnit::kAuto, ParamUnit::kAuto);
  ASSERT_EQ(c.sublayer_parameters.size(), 2u);
  const uint64_t attention = c.sublayer_parameters[0];
  const uint64_t mlp = c.sublayer_parameters[1];
  const uint64_t own = c.block_parameters - attention - mlp;
  const DeviceWorkingSet blocks =
      WorkingSetOf(c, RecomputeUnit::kSublayer, ParamUnit::kBlock);
  const DeviceWorkingSet units =
      WorkingSetOf(c, RecomputeUnit::kSublayer, ParamUnit::kSublayer);
  EXPECT_EQ(blocks.always - units.always,
            2 * (2 * c.block_parameters) - 2 * (2 * own + attention + mlp));
  EXPECT_EQ(blocks.block_backward - units.block_backward,
            2 * c.block_parameters - 2 * (own + mlp));
  EXPECT_EQ(blocks.loss, units.loss);
  EXPECT_EQ(ParametersCrossingAgain(c), attention);
}

}  // namespace
}  // namespace lohan
