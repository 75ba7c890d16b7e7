#include "daemon/store/extent_allocator.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(ExtentAllocatorTest, AllocatesFirstFitAndCoalesces) {
  ExtentAllocator a(16 * 4096, 4096);
  auto x = a.Allocate(4 * 4096);
  auto y = a.Allocate(4 * 4096);
  auto z = a.Allocate(8 * 4096);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 4 * 4096u);
  EXPECT_EQ(*z, 8 * 4096u);
  EXPECT_EQ(a.used(), 16 * 4096u);
  EXPECT_EQ(a.Allocate(4096).status().code(),
            absl::StatusCode::kResourceExhausted);
  a.Free(*x, 4 * 4096);
  a.Free(*z, 8 * 4096);
  EXPECT_EQ(a.largest_free_run(), 8 * 4096u);
  a.Free(*y, 4 * 4096);
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.largest_free_run(), 16 * 4096u);
}

TEST(ExtentAllocatorTest, ReserveSplitsAndRejectsOverlap) {
  ExtentAllocator a(16 * 4096, 4096);
  ASSERT_TRUE(a.Reserve(4 * 4096, 4 * 4096).ok());
  EXPECT_EQ(a.Reserve(6 * 4096, 4 * 4096).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(a.Reserve(15 * 4096, 2 * 4096).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(a.Reserve(100, 4096).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(a.used(), 4 * 4096u);
  auto x = a.Allocate(4 * 4096);
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(*x, 0u);
  auto y = a.Allocate(8 * 4096);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(*y, 8 * 4096u);
}

TEST(ExtentAllocatorTest, DoubleFreeAborts) {
  ExtentAllocator a(4 * 4096, 4096);
  auto x = a.Allocate(4096);
  ASSERT_TRUE(x.ok());
  a.Free(*x, 4096);
  EXPECT_DEATH(a.Free(*x, 4096), "LOHAN_CHECK");
}

}  // namespace
}  // namespace lohan
