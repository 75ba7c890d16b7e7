#include "daemon/sched/weight_handoff.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace lohan {
namespace {

std::vector<uint8_t> Bytes(size_t n, uint8_t first) {
  std::vector<uint8_t> bytes(n);
  std::iota(bytes.begin(), bytes.end(), first);
  return bytes;
}

TEST(WeightHandoffTest, ATakenChunkIsTheKeptCopyAndIsTakenOnce) {
  WeightHandoff handoff(/*slots=*/2, /*slot_bytes=*/64);
  std::vector<uint8_t> weights = Bytes(48, 7);
  ASSERT_TRUE(handoff.Keep(3, weights));
  weights[0] = 0;  // The handoff holds its own copy.
  std::vector<uint8_t> out(48);
  ASSERT_TRUE(handoff.Take(3, absl::MakeSpan(out), handoff.generation()));
  EXPECT_EQ(out, Bytes(48, 7));
  EXPECT_FALSE(handoff.Take(3, absl::MakeSpan(out), handoff.generation()));
  EXPECT_FALSE(handoff.Take(4, absl::MakeSpan(out), handoff.generation()));
  EXPECT_EQ(handoff.chunks_kept(), 0u);
}

TEST(WeightHandoffTest, ATakeOfAnotherSizeLeavesTheOutputAndTheCopy) {
  WeightHandoff handoff(1, 64);
  ASSERT_TRUE(handoff.Keep(0, Bytes(32, 1)));
  std::vector<uint8_t> out(16, 0xee);
  EXPECT_FALSE(handoff.Take(0, absl::MakeSpan(out), handoff.generation()));
  EXPECT_EQ(out, std::vector<uint8_t>(16, 0xee));
  std::vector<uint8_t> whole(32);
  EXPECT_TRUE(handoff.Take(0, absl::MakeSpan(whole), handoff.generation()));
}

TEST(WeightHandoffTest, KeepsNoMoreThanItsSlotsAndReusesFreedOnes) {
  WeightHandoff handoff(2, 64);
  EXPECT_TRUE(handoff.Keep(0, Bytes(64, 0)));
  EXPECT_TRUE(handoff.Keep(1, Bytes(64, 1)));
  EXPECT_FALSE(handoff.Keep(2, Bytes(64, 2)));
  EXPECT_FALSE(handoff.Keep(3, Bytes(65, 3)));  // larger than a slot
  EXPECT_EQ(handoff.chunks_kept(), 2u);
  EXPECT_EQ(handoff.bytes_allocated(), 128u);
  std::vector<uint8_t> out(64);
  ASSERT_TRUE(handoff.Take(0, absl::MakeSpan(out), handoff.generation()));
  EXPECT_TRUE(handoff.Keep(2, Bytes(64, 2)));
  EXPECT_EQ(handoff.bytes_allocated(), 128u);  // the freed slot, reused
  ASSERT_TRUE(handoff.Take(2, absl::MakeSpan(out), handoff.generation()));
  EXPECT_EQ(out, Bytes(64, 2));
}

TEST(WeightHandoffTest, WhenFullTheChunkFetchedLastGivesWay) {
  WeightHandoff handoff(2, 64);
  // In backward order, as eager updates write them.
  ASSERT_TRUE(handoff.Keep(9, Bytes(64, 9)));
  ASSERT_TRUE(handoff.Keep(8, Bytes(64, 8)));
  EXPECT_TRUE(handoff.Keep(4, Bytes(64, 4)));   // 9 gives way
  EXPECT_TRUE(handoff.Keep(6, Bytes(64, 6)));   // 8 gives way
  EXPECT_FALSE(handoff.Keep(7, Bytes(64, 7)));  // fetched after 4 and 6
  std::vector<uint8_t> out(64);
  EXPECT_FALSE(handoff.Take(9, absl::MakeSpan(out), handoff.generation()));
  EXPECT_FALSE(handoff.Take(8, absl::MakeSpan(out), handoff.generation()));
  EXPECT_FALSE(handoff.Take(7, absl::MakeSpan(out), handoff.generation()));
  ASSERT_TRUE(handoff.Take(4, absl::MakeSpan(out), handoff.generation()));
  EXPECT_EQ(out, Bytes(64, 4));
  ASSERT_TRUE(handoff.Take(6, absl::MakeSpan(out), handoff.generation()));
  EXPECT_EQ(out, Bytes(64, 6));
  EXPECT_EQ(handoff.bytes_allocated(), 128u);
}

TEST(WeightHandoffTest, ANewVersionReplacesTheKeptOneOrDropsIt) {
  WeightHandoff handoff(1, 64);
  ASSERT_TRUE(handoff.Keep(5, Bytes(64, 1)));
  ASSERT_TRUE(handoff.Keep(5, Bytes(64, 9)));  // its own slot, reused
  std::vector<uint8_t> out(64);
  ASSERT_TRUE(handoff.Take(5, absl::MakeSpan(out), handoff.generation()));
  EXPECT_EQ(out, Bytes(64, 9));
  // A version that cannot be kept leaves no older one behind to be taken.
  ASSERT_TRUE(handoff.Keep(5, Bytes(64, 1)));
  EXPECT_FALSE(handoff.Keep(5, Bytes(80, 2)));
  EXPECT_FALSE(handoff.Take(5, absl::MakeSpan(out), handoff.generation()));
}

TEST(WeightHandoffTest, DropForgetsOneChunk) {
  WeightHandoff handoff(2, 64);
  ASSERT_TRUE(handoff.Keep(0, Bytes(64, 0)));
  ASSERT_TRUE(handoff.Keep(1, Bytes(64, 1)));
  handoff.Drop(0);
  handoff.Drop(7);  // none kept: nothing to do
  std::vector<uint8_t> out(64);
  EXPECT_FALSE(handoff.Take(0, absl::MakeSpan(out), handoff.generation()));
  EXPECT_TRUE(handoff.Take(1, absl::MakeSpan(out), handoff.generation()));
}

TEST(WeightHandoffTest, ATakeForAnEarlierGenerationTakesNothing) {
  WeightHandoff handoff(1, 64);
  const uint64_t before = handoff.generation();
  handoff.Clear();
  ASSERT_TRUE(handoff.Keep(0, Bytes(64, 0)));
  std::vector<uint8_t> out(64);
  EXPECT_FALSE(handoff.Take(0, absl::MakeSpan(out), before));
  EXPECT_TRUE(handoff.Take(0, absl::MakeSpan(out), handoff.generation()));
}

TEST(WeightHandoffTest, ClearForgetsEveryChunkAndKeepsTheMemory) {
  WeightHandoff handoff(2, 64);
  ASSERT_TRUE(handoff.Keep(0, Bytes(64, 0)));
  ASSERT_TRUE(handoff.Keep(1, Bytes(64, 1)));
  handoff.Clear();
  std::vector<uint8_t> out(64);
  EXPECT_FALSE(handoff.Take(0, absl::MakeSpan(out), handoff.generation()));
  EXPECT_FALSE(handoff.Take(1, absl::MakeSpan(out), handoff.generation()));
  EXPECT_EQ(handoff.bytes_allocated(), 128u);
  EXPECT_TRUE(handoff.Keep(2, Bytes(64, 2)));
  EXPECT_TRUE(handoff.Keep(3, Bytes(64, 3)));
  EXPECT_EQ(handoff.bytes_allocated(), 128u);
}

TEST(WeightHandoffTest, NoSlotsKeepNothing) {
  WeightHandoff handoff(0, 64);
  EXPECT_FALSE(handoff.Keep(0, Bytes(8, 0)));
  EXPECT_EQ(handoff.capacity_bytes(), 0u);
}

}  // namespace
}  // namespace lohan
