#include "daemon/pool/slot_allocator.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace lohan {
namespace {

constexpr uint64_t kPage = 4096;

TEST(SlotAllocatorTest, AlignsAndRoundsUp) {
  SlotAllocator slots(64 * kPage);
  auto a = slots.Allocate(1, SlotKind::kGradient);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->offset, 0u);
  EXPECT_EQ(a->length, kPage);
  auto b = slots.Allocate(kPage + 1, SlotKind::kWeight);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->offset, kPage);
  EXPECT_EQ(b->length, 2 * kPage);
  EXPECT_EQ(b->kind, SlotKind::kWeight);
  EXPECT_EQ(slots.GetStats().used_bytes, 3 * kPage);
  EXPECT_EQ(slots.Allocate(0, SlotKind::kWeight).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SlotAllocatorTest, ExhaustionAndFragmentation) {
  SlotAllocator slots(8 * kPage);
  std::vector<Slot> live;
  for (int i = 0; i < 8; ++i) {
    auto slot = slots.Allocate(kPage, SlotKind::kActivation);
    ASSERT_TRUE(slot.ok());
    live.push_back(*slot);
  }
  auto full = slots.Allocate(kPage, SlotKind::kActivation);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);

  // Free every other slot: 4 pages free, but no 2-page block.
  for (int i = 0; i < 8; i += 2) ASSERT_TRUE(slots.Free(live[i].offset).ok());
  EXPECT_EQ(slots.GetStats().free_bytes, 4 * kPage);
  EXPECT_EQ(slots.GetStats().largest_free_block, kPage);
  auto big = slots.Allocate(2 * kPage, SlotKind::kWeight);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("largest block 4096"),
            std::string::npos)
      << big.status();

  // Freeing slot 1 merges 0,1,2 into one 3-page block.
  ASSERT_TRUE(slots.Free(live[1].offset).ok());
  EXPECT_EQ(slots.GetStats().largest_free_block, 3 * kPage);
  big = slots.Allocate(3 * kPage, SlotKind::kWeight);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->offset, 0u);
}

TEST(SlotAllocatorTest, CoalescesBackToOneBlock) {
  SlotAllocator slots(256 * kPage);
  std::mt19937_64 random(42);
  std::vector<Slot> live;
  for (int round = 0; round < 2000; ++round) {
    if (live.empty() || random() % 3 != 0) {
      auto slot = slots.Allocate((random() % 8 + 1) * kPage - random() % 100,
                                 SlotKind::kActivation);
      if (slot.ok()) live.push_back(*slot);
    } else {
      const size_t i = random() % live.size();
      ASSERT_TRUE(slots.Free(live[i].offset).ok());
      live.erase(live.begin() + i);
    }
    // Live slots never overlap and stay inside the arena.
    uint64_t used = 0;
    for (const Slot& slot : live) used += slot.length;
    ASSERT_EQ(slots.GetStats().used_bytes, used);
  }
  for (const Slot& slot : live) ASSERT_TRUE(slots.Free(slot.offset).ok());
  SlotAllocator::Stats stats = slots.GetStats();
  EXPECT_EQ(stats.free_blocks, 1u);
  EXPECT_EQ(stats.largest_free_block, 256 * kPage);
  EXPECT_EQ(stats.live_slots, 0u);
}

TEST(SlotAllocatorTest, DoubleFreeAndUnknownOffset) {
  SlotAllocator slots(8 * kPage);
  auto slot = slots.Allocate(kPage, SlotKind::kGradient);
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ(slots.Free(slot->offset + 1).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(slots.Free(slot->offset).ok());
  EXPECT_EQ(slots.Free(slot->offset).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(slots.FindSlot(slot->offset).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SlotAllocatorTest, CheckRange) {
  SlotAllocator slots(16 * kPage);
  auto grad = slots.Allocate(2 * kPage, SlotKind::kGradient);  // [0, 8K)
  auto weight = slots.Allocate(kPage, SlotKind::kWeight);      // [8K, 12K)
  ASSERT_TRUE(grad.ok() && weight.ok());
  EXPECT_TRUE(slots.CheckRange(0, 2 * kPage, SlotKind::kGradient).ok());
  EXPECT_TRUE(slots.CheckRange(100, 50, SlotKind::kGradient).ok());
  EXPECT_TRUE(slots.CheckRange(2 * kPage, kPage, SlotKind::kWeight).ok());
  // Spans two slots.
  EXPECT_EQ(slots.CheckRange(kPage, 2 * kPage, SlotKind::kGradient).code(),
            absl::StatusCode::kNotFound);
  // Wrong kind.
  EXPECT_EQ(slots.CheckRange(0, 10, SlotKind::kWeight).code(),
            absl::StatusCode::kFailedPrecondition);
  // Free space, beyond the arena, empty, overflow.
  EXPECT_EQ(slots.CheckRange(4 * kPage, 10, SlotKind::kGradient).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(slots.CheckRange(16 * kPage, 1, SlotKind::kGradient).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(slots.CheckRange(0, 0, SlotKind::kGradient).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(slots.CheckRange(UINT64_MAX - 5, 10, SlotKind::kGradient).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(slots.CheckRange(8, UINT64_MAX, SlotKind::kGradient).code(),
            absl::StatusCode::kInvalidArgument);
  // After free the range is no longer live.
  ASSERT_TRUE(slots.Free(grad->offset).ok());
  EXPECT_EQ(slots.CheckRange(0, 10, SlotKind::kGradient).code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lohan
