#include "daemon/sched/memory_shares.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(MemoryShares, ALoneFlowMayTakeItAllAndNoMore) {
  MemoryShares shares(8 * kMiB);
  shares.Join("a", "uid 1", 1);
  EXPECT_EQ(shares.ShareOf("a"), 8 * kMiB);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(shares.TryTake("a", kMiB)) << i;
  EXPECT_FALSE(shares.TryTake("a", kMiB));
  shares.Give("a", kMiB);
  EXPECT_TRUE(shares.TryTake("a", kMiB));
  EXPECT_FALSE(shares.TryTake("stranger", 1));  // never joined
}

TEST(MemoryShares, WeightsSplitTheCapacityAndAGroupSplitsItsShare) {
  MemoryShares shares(12 * kMiB);
  shares.Join("root-a", "uid 0", 2);
  shares.Join("root-b", "uid 0", 2);
  shares.Join("nobody", "uid 65534", 1);
  // Root 8 MiB (2 of 3) over two jobs, nobody 4 MiB.
  EXPECT_EQ(shares.ShareOf("root-a"), 4 * kMiB);
  EXPECT_EQ(shares.ShareOf("root-b"), 4 * kMiB);
  EXPECT_EQ(shares.ShareOf("nobody"), 4 * kMiB);
  EXPECT_TRUE(shares.TryTake("root-a", 4 * kMiB));
  EXPECT_FALSE(shares.TryTake("root-a", 1));
  EXPECT_TRUE(shares.TryTake("nobody", 4 * kMiB));
  EXPECT_FALSE(shares.TryTake("nobody", 1));
  EXPECT_TRUE(shares.TryTake("root-b", 4 * kMiB));
}

TEST(MemoryShares, AJoiningFlowShrinksTheOthersWhoGiveBackTheirExcess) {
  MemoryShares shares(8 * kMiB);
  shares.Join("greedy", "", 1);
  ASSERT_TRUE(shares.TryTake("greedy", 8 * kMiB));
  shares.Join("late", "", 1);
  // The memory is all held: the newcomer waits for the excess to come back.
  EXPECT_FALSE(shares.TryTake("late", kMiB));
  EXPECT_EQ(shares.Excess("greedy"), 4 * kMiB);
  EXPECT_EQ(shares.Excess("late"), 0u);
  shares.Give("greedy", shares.Excess("greedy"));
  EXPECT_FALSE(shares.TryTake("greedy", 1));
  EXPECT_TRUE(shares.TryTake("late", 4 * kMiB));
  // Leaving gives back what is held; the one left may take it all again.
  shares.Leave("late");
  EXPECT_EQ(shares.Held("late"), 0u);
  EXPECT_TRUE(shares.TryTake("greedy", 4 * kMiB));
  EXPECT_EQ(shares.Held("greedy"), 8 * kMiB);
}

TEST(MemoryShares, JoiningTwiceChangesNothing) {
  MemoryShares shares(6 * kMiB);
  shares.Join("a", "u", 1);
  shares.Join("a", "u", 1);
  shares.Join("b", "v", 2);
  EXPECT_EQ(shares.ShareOf("a"), 2 * kMiB);
  EXPECT_EQ(shares.ShareOf("b"), 4 * kMiB);
}

TEST(MemoryShares, AGroupsLimitCapsItAndTheRestGoesToTheOthers) {
  MemoryShares shares(12 * kMiB);
  // Three users of equal weight; one may hold 2 MiB at most.
  shares.Join("capped", "uid 1", 1, 2 * kMiB);
  shares.Join("a", "uid 2", 1);
  shares.Join("b", "uid 3", 1);
  EXPECT_EQ(shares.ShareOf("capped"), 2 * kMiB);
  EXPECT_EQ(shares.ShareOf("a"), 5 * kMiB);
  EXPECT_EQ(shares.ShareOf("b"), 5 * kMiB);
  EXPECT_TRUE(shares.TryTake("capped", 2 * kMiB));
  EXPECT_FALSE(shares.TryTake("capped", 1));
  // Alone, the capped user still holds no more than its limit; a limit
  // above its share changes nothing.
  shares.Leave("a");
  shares.Leave("b");
  EXPECT_EQ(shares.ShareOf("capped"), 2 * kMiB);
  shares.Join("roomy", "uid 4", 1, 100 * kMiB);
  EXPECT_EQ(shares.ShareOf("roomy"), 10 * kMiB);
}

}  // namespace
}  // namespace lohan
