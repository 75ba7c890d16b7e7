// The planner's model of lohand's state tier: optimizer states held in
// host memory cross the SSDs only at durable commits.
#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/planner.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;

// The lab server: an RTX 4090-class card, 256 GiB of host memory
// and three NVMe SSDs.
Machine LabServer() {
  return Machine{.device_bytes = 24 * kGiB,
                 .device_flops = 165e12,
                 .host_to_device = 25e9,
                 .device_to_host = 25e9,
                 .host_bytes = 256 * kGiB,
                 .ssds = 3,
                 .ssd_read = 6.5e9,
                 .ssd_write = 3.4e9};
}

absl::StatusOr<Plan> Plan13B(const Machine& machine) {
  return MakePlan(*PresetShape("gpt-13b"), 4, 1024, machine);
}

TEST(PlannerStateTier, WithoutATierEveryStateCrossesTheSsdsBothWays) {
  absl::StatusOr<Plan> plan = Plan13B(LabServer());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const double p = static_cast<double>(plan->counts.parameters);
  EXPECT_EQ(plan->resident_state_bytes, 0u);
  EXPECT_EQ(plan->state_ssd_read_bytes, 12 * p);
  EXPECT_EQ(plan->state_ssd_write_bytes, 12 * p);
  EXPECT_EQ(plan->pool_bytes, 256 * kGiB);
  // The figure: about 23 s of the SSDs' time per iteration for
  // the states alone (12 B/param read at 19.5 GB/s, written at 10.2).
  EXPECT_NEAR(12 * p / 19.5e9 + 12 * p / 10.2e9, 23, 1.5);
}

TEST(PlannerStateTier, ResidentStatesAreWrittenOnlyAtDurableCommits) {
  Machine machine = LabServer();
  absl::StatusOr<Plan> none = Plan13B(machine);
  ASSERT_TRUE(none.ok()) << none.status();
  const double p = static_cast<double>(none->counts.parameters);
  machine.state_tier_bytes = 200 * kGiB;  // more than the states
  for (uint32_t interval : {1u, 4u}) {
    machine.commit_interval = interval;
    absl::StatusOr<Plan> all = Plan13B(machine);
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_DOUBLE_EQ(static_cast<double>(all->resident_state_bytes), 12 * p);
    EXPECT_EQ(all->state_ssd_read_bytes, 0);
    EXPECT_DOUBLE_EQ(all->state_ssd_write_bytes, 12 * p / interval);
    EXPECT_LT(all->estimate.backward.ssd, none->estimate.backward.ssd);
    EXPECT_LE(all->estimate.seconds(), none->estimate.seconds());
    EXPECT_LT(all->estimate.tail, none->estimate.tail);
  }
  // Half the states in the tier: the whole chunks that fit it, from the
  // first; the others read and written, the resident ones written every
  // 4th iteration.
  machine.commit_interval = 4;
  machine.state_tier_bytes = static_cast<uint64_t>(6 * p);
  absl::StatusOr<Plan> half = Plan13B(machine);
  ASSERT_TRUE(half.ok()) << half.status();
  const std::vector<uint64_t>& chunks = half->layout_bytes.chunk_elements;
  double resident = 0;
  for (size_t c = 0; 12 * (resident + chunks[c]) <= 6 * p; ++c) {
    resident += static_cast<double>(chunks[c]);
  }
  EXPECT_GT(resident, 0.45 * p);
  EXPECT_EQ(half->resident_state_bytes, static_cast<uint64_t>(12 * resident));
  EXPECT_DOUBLE_EQ(half->state_ssd_read_bytes, 12 * (p - resident));
  EXPECT_DOUBLE_EQ(half->state_ssd_write_bytes,
                   12 * (p - resident) + 12 * resident / 4);
}

// lohand's tier holds whole chunks: a tier one byte short of the first
// chunk's states holds nothing.
TEST(PlannerStateTier, TheTierHoldsWholeChunks) {
  Machine machine = LabServer();
  absl::StatusOr<Plan> none = Plan13B(machine);
  ASSERT_TRUE(none.ok()) << none.status();
  const uint64_t first = none->layout_bytes.chunk_elements.at(0);
  machine.state_tier_bytes = 12 * first - 1;
  absl::StatusOr<Plan> short_of_one = Plan13B(machine);
  ASSERT_TRUE(short_of_one.ok()) << short_of_one.status();
  EXPECT_EQ(short_of_one->resident_state_bytes, 0u);
  machine.state_tier_bytes = 12 * first;
  absl::StatusOr<Plan> one = Plan13B(machine);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->resident_state_bytes, 12 * first);
  uint64_t sum = 0;
  for (uint64_t chunk : none->layout_bytes.chunk_elements) sum += chunk;
  EXPECT_EQ(sum, none->counts.parameters);
}

TEST(PlannerStateTier, SplittingTheHostKeepsThe13BStatesInRam) {
  Machine machine = LabServer();
  machine.split_host_memory = true;
  machine.commit_interval = 4;
  absl::StatusOr<Plan> split = Plan13B(machine);
  ASSERT_TRUE(split.ok()) << split.status();
  const double p = static_cast<double>(split->counts.parameters);
  // 156 GB of states fit beside lohan's layout and the activations.
  EXPECT_DOUBLE_EQ(static_cast<double>(split->resident_state_bytes), 12 * p);
  EXPECT_EQ(split->pool_bytes + split->state_tier_bytes, 256 * kGiB);
  EXPECT_EQ(split->state_ssd_read_bytes, 0);
  EXPECT_DOUBLE_EQ(split->state_ssd_write_bytes, 3 * p);
  machine.split_host_memory = false;
  absl::StatusOr<Plan> none = Plan13B(machine);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_LT(split->estimate.seconds(), none->estimate.seconds());
}

// The split is the fastest of those it tries, each end included: never
// slower than a tier of nothing or of everything the host can give.
TEST(PlannerStateTier, TheSplitIsNeverSlowerThanEitherEnd) {
  const ModelShape shape = *PresetShape("gpt-13b");
  int compared = 0;
  for (uint64_t host_gib : {96, 160, 256}) {
    for (uint64_t batch : {1, 4, 16}) {
      Machine machine = LabServer();
      machine.host_bytes = host_gib * kGiB;
      machine.split_host_memory = true;
      absl::StatusOr<Plan> split = MakePlan(shape, batch, 1024, machine);
      machine.split_host_memory = false;
      absl::StatusOr<Plan> none = MakePlan(shape, batch, 1024, machine);
      if (!none.ok()) continue;  // lohan's layout alone does not fit
      ASSERT_TRUE(split.ok()) << split.status();
      EXPECT_LE(split->estimate.seconds(), none->estimate.seconds() * 1.0001)
          << host_gib << " GiB, batch " << batch;
      const double states = 12.0 * static_cast<double>(none->counts.parameters);
      const uint64_t most = static_cast<uint64_t>(
          std::min(states, static_cast<double>(machine.host_bytes)));
      machine.state_tier_bytes = most;
      machine.host_bytes -= most;
      absl::StatusOr<Plan> all = MakePlan(shape, batch, 1024, machine);
      if (all.ok()) {
        EXPECT_LE(split->estimate.seconds(), all->estimate.seconds() * 1.0001)
            << host_gib << " GiB, batch " << batch;
        ++compared;
      }
      EXPECT_EQ(split->pool_bytes + split->state_tier_bytes, host_gib * kGiB);
    }
  }
  // Most of the cases compare both ends: none is skipped silently.
  EXPECT_GE(compared, 6);
}

TEST(PlannerStateTier, ACommitIntervalOfZeroIsRefused) {
  Machine machine = LabServer();
  machine.commit_interval = 0;
  absl::StatusOr<Plan> plan = Plan13B(machine);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("commit interval"));
}

}  // namespace
}  // namespace lohan
