#include "daemon/sched/bounded_queue.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(BoundedQueueTest, FifoAcrossThreadsWithABoundOfOne) {
  BoundedQueue<int> q(1);
  std::thread producer([&] {
    for (int i = 0; i < 1000; ++i) ASSERT_TRUE(q.Push(i));
  });
  for (int i = 0; i < 1000; ++i) {
    std::optional<int> v = q.Pop();
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(*v, i);
    EXPECT_LE(q.size(), 1u);
  }
  producer.join();
}

TEST(BoundedQueueTest, CloseWakesBlockedProducersAndConsumers) {
  BoundedQueue<int> full(1);
  ASSERT_TRUE(full.Push(1));
  BoundedQueue<int> empty(1);
  bool pushed = true;
  bool popped = true;
  std::thread producer([&] { pushed = full.Push(2); });
  std::thread consumer([&] { popped = empty.Pop().has_value(); });
  full.Close();
  empty.Close();
  producer.join();
  consumer.join();
  EXPECT_FALSE(pushed);
  EXPECT_FALSE(popped);
  EXPECT_FALSE(full.Pop().has_value());  // Closed: queued items dropped.
  EXPECT_FALSE(full.Push(3));
}

}  // namespace
}  // namespace lohan
