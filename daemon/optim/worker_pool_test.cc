#include "daemon/optim/worker_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(WorkerPoolTest, RejectsBadThreadCounts) {
  EXPECT_FALSE(WorkerPool::Create({0, false}).ok());
  EXPECT_FALSE(WorkerPool::Create({-3, false}).ok());
  EXPECT_FALSE(WorkerPool::Create({257, false}).ok());
}

TEST(WorkerPoolTest, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 3, 7}) {
    auto pool = WorkerPool::Create({threads, true});
    ASSERT_TRUE(pool.ok());
    EXPECT_EQ((*pool)->num_threads(), threads);
    for (std::size_t tasks : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(tasks);
      (*pool)->ParallelFor(tasks, [&](std::size_t i) { hits[i]++; });
      for (std::size_t i = 0; i < tasks; ++i) EXPECT_EQ(hits[i].load(), 1);
    }
  }
}

TEST(WorkerPoolTest, UsesSeveralThreads) {
  auto pool = WorkerPool::Create({2, false});
  ASSERT_TRUE(pool.ok());
  // Two tasks that each wait for the other: only finishes if two threads
  // run them at once.
  std::atomic<int> arrived{0};
  (*pool)->ParallelFor(2, [&](std::size_t) {
    arrived++;
    while (arrived.load() < 2) std::this_thread::yield();
  });
  EXPECT_EQ(arrived.load(), 2);
}

TEST(WorkerPoolTest, PinsWhereThePlatformAllows) {
  auto pool = WorkerPool::Create({2, true});
  ASSERT_TRUE(pool.ok());
  (*pool)->ParallelFor(4, [](std::size_t) {});  // threads have started
  EXPECT_GE((*pool)->num_pinned(), 0);
  EXPECT_LE((*pool)->num_pinned(), 2);
  auto unpinned = WorkerPool::Create({2, false});
  ASSERT_TRUE(unpinned.ok());
  (*unpinned)->ParallelFor(4, [](std::size_t) {});
  EXPECT_EQ((*unpinned)->num_pinned(), 0);
}

TEST(WorkerPoolTest, ConcurrentCallersAreSerialized) {
  auto pool = WorkerPool::Create({3, false});
  ASSERT_TRUE(pool.ok());
  std::atomic<long> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        (*pool)->ParallelFor(64, [&](std::size_t i) { total += i; });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4L * 50 * (63 * 64 / 2));
}

TEST(WorkerPoolTest, CleanShutdown) {
  // Destroy idle pools, never-used pools and pools right after work, many
  // times: the destructor must wake and join every thread.
  for (int round = 0; round < 100; ++round) {
    auto pool = WorkerPool::Create({1 + round % 7, round % 2 == 0});
    ASSERT_TRUE(pool.ok());
    if (round % 3 != 0) {
      std::atomic<int> n{0};
      (*pool)->ParallelFor(round, [&](std::size_t) { n++; });
      EXPECT_EQ(n.load(), round);
    }
  }
}

}  // namespace
}  // namespace lohan
