#include "daemon/sched/grad_scratch.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "daemon/sched/memory_shares.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

constexpr uint64_t kChunk = 64 << 10;

TEST(GradScratchTest, OffOrWithoutATierItHoldsNothing) {
  MemoryShares shares(8 * kChunk);
  shares.Join("job", "", 1.0);
  GradScratch off("job", {kChunk, kChunk}, StateTierMemory{&shares}, false);
  off.Fit(8 * kChunk);
  EXPECT_EQ(off.Take(0), nullptr);
  GradScratch no_tier("job", {kChunk}, StateTierMemory{}, true);
  EXPECT_FALSE(no_tier.enabled());
  no_tier.Fit(8 * kChunk);
  EXPECT_EQ(no_tier.Take(0), nullptr);
  EXPECT_EQ(shares.Held("job"), 0u);
}

TEST(GradScratchTest, TakesWithinTheRoomAndKeepsRegionsAcrossIterations) {
  MemoryShares shares(8 * kChunk);
  shares.Join("job", "", 1.0);
  GradScratch scratch("job", {kChunk, kChunk, kChunk}, StateTierMemory{&shares},
                      true);
  EXPECT_EQ(scratch.Take(0), nullptr);  // no room before the first Fit
  scratch.Fit(2 * kChunk);
  uint8_t* first = scratch.Take(0);
  ASSERT_NE(first, nullptr);
  std::memset(first, 7, kChunk);
  ASSERT_NE(scratch.Take(1), nullptr);
  EXPECT_EQ(scratch.Take(2), nullptr);  // beyond the room: the store's
  EXPECT_EQ(scratch.Find(2), nullptr);
  EXPECT_EQ(scratch.bytes_held(), 2 * kChunk);
  EXPECT_EQ(shares.Held("job"), 2 * kChunk);
  // The next iteration, the same room: the same memory, nothing remapped.
  scratch.Fit(2 * kChunk);
  EXPECT_EQ(scratch.Take(0), first);
  EXPECT_EQ(scratch.Find(0), first);
  EXPECT_EQ(first[kChunk - 1], 7);
  // Less room (the states took more, another job joined): given back from
  // the end.
  scratch.Fit(kChunk);
  EXPECT_EQ(scratch.Find(0), first);
  EXPECT_EQ(scratch.Find(1), nullptr);
  EXPECT_EQ(shares.Held("job"), kChunk);
  scratch.Fit(0);
  EXPECT_EQ(scratch.Find(0), nullptr);
  EXPECT_EQ(shares.Held("job"), 0u);
}

TEST(GradScratchTest, NeverBeyondTheJobsShare) {
  MemoryShares shares(2 * kChunk);
  shares.Join("job", "alice", 1.0);
  shares.Join("other", "bob", 1.0);  // the job's share: one chunk
  GradScratch scratch("job", {kChunk, kChunk}, StateTierMemory{&shares}, true);
  scratch.Fit(2 * kChunk);  // a room the shares do not give
  EXPECT_NE(scratch.Take(0), nullptr);
  EXPECT_EQ(scratch.Take(1), nullptr);
  EXPECT_EQ(shares.Held("job"), kChunk);
}

TEST(GradScratchTest, GivesWayToTheMachinesFloor) {
  MemoryShares shares(8 * kChunk);
  shares.Join("job", "", 1.0);
  uint64_t available = 100 * kChunk;
  StateTierMemory memory{&shares};
  memory.keep_available_bytes = 10 * kChunk;
  memory.available_bytes = [&available] { return available; };
  GradScratch scratch("job", {kChunk, kChunk}, memory, true);
  scratch.Fit(2 * kChunk);
  ASSERT_NE(scratch.Take(0), nullptr);
  available = 10 * kChunk;  // a chunk more would cross the floor
  EXPECT_EQ(scratch.Take(1), nullptr);
  scratch.Fit(2 * kChunk);  // at the floor: what it holds stays
  EXPECT_NE(scratch.Find(0), nullptr);
  available = 9 * kChunk;  // below it: everything goes back
  scratch.Fit(2 * kChunk);
  EXPECT_EQ(scratch.Find(0), nullptr);
  EXPECT_EQ(shares.Held("job"), 0u);
}

TEST(GradScratchTest, GivesEverythingBackWhenDestroyed) {
  MemoryShares shares(8 * kChunk);
  shares.Join("job", "", 1.0);
  {
    GradScratch scratch("job", {kChunk, kChunk}, StateTierMemory{&shares},
                        true);
    scratch.Fit(2 * kChunk);
    ASSERT_NE(scratch.Take(0), nullptr);
    ASSERT_NE(scratch.Take(1), nullptr);
    EXPECT_EQ(shares.Held("job"), 2 * kChunk);
  }
  EXPECT_EQ(shares.Held("job"), 0u);
}

}  // namespace
}  // namespace lohan
