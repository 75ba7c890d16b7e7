#include "daemon/sched/buffer_pool.h"

#include <cstdint>
#include <set>
#include <thread>

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(BufferPoolTest, HandsOutEachAlignedBufferOnceUntilReleased) {
  BufferPool pool(3, 10000, 4096);
  EXPECT_EQ(pool.count(), 3u);
  EXPECT_EQ(pool.buffer_bytes(), 10000u);
  std::set<uint8_t*> seen;
  for (int i = 0; i < 3; ++i) {
    uint8_t* b = pool.Acquire();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 4096, 0u);
    EXPECT_TRUE(seen.insert(b).second);
  }
  // A fourth waits until one comes back.
  uint8_t* fourth = nullptr;
  std::thread waiter([&] { fourth = pool.Acquire(); });
  uint8_t* back = *seen.begin();
  pool.Release(back);
  waiter.join();
  EXPECT_EQ(fourth, back);
}

TEST(BufferPoolTest, CloseWakesAWaiterWithNull) {
  BufferPool pool(1, 64, 64);
  ASSERT_NE(pool.Acquire(), nullptr);
  uint8_t* got = reinterpret_cast<uint8_t*>(1);
  std::thread waiter([&] { got = pool.Acquire(); });
  pool.Close();
  waiter.join();
  EXPECT_EQ(got, nullptr);
}

}  // namespace
}  // namespace lohan
