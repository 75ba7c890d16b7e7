#include "daemon/pool/host_pool.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

HostPool::Options Budget(uint64_t bytes) {
  HostPool::Options options;
  options.capacity_bytes = bytes;
  return options;
}

TEST(HostPoolTest, AccountsAndReturnsBytes) {
  HostPool pool(Budget(4 * kMiB));
  auto a = pool.CreateArena("job-a", kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = pool.CreateArena("job-b", 2 * kMiB);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*a)->job_id(), "job-a");
  EXPECT_EQ((*b)->arena().size(), 2 * kMiB);

  HostPool::Stats stats = pool.GetStats();
  EXPECT_EQ(stats.capacity_bytes, 4 * kMiB);
  EXPECT_EQ(stats.used_bytes, 3 * kMiB);
  ASSERT_EQ(stats.jobs.size(), 2u);
  EXPECT_EQ(stats.jobs[0].job_id, "job-a");
  EXPECT_EQ(stats.jobs[0].bytes, kMiB);
  EXPECT_EQ(stats.jobs[1].job_id, "job-b");

  // 2 MiB does not fit in the 1 MiB left; the message says what is free.
  auto c = pool.CreateArena("job-c", 2 * kMiB);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("only 1.0 MiB of 4.0 MiB is free"),
            std::string::npos)
      << c.status();
  EXPECT_EQ(pool.GetStats().used_bytes, 3 * kMiB);

  // Releasing b's arena returns its bytes; now c fits.
  b->reset();
  EXPECT_EQ(pool.GetStats().used_bytes, kMiB);
  c = pool.CreateArena("job-c", 2 * kMiB);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(pool.GetStats().used_bytes, 3 * kMiB);
}

TEST(HostPoolTest, OneArenaPerJobAndBadRequests) {
  HostPool pool(Budget(4 * kMiB));
  auto a = pool.CreateArena("job-a", kMiB);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(pool.CreateArena("job-a", kMiB).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(pool.CreateArena("", kMiB).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.CreateArena("job-x", 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.GetStats().used_bytes, kMiB);
}

TEST(HostPoolTest, ConcurrentCreatesNeverExceedTheBudget) {
  HostPool pool(Budget(8 * 64 * 1024));
  std::vector<std::unique_ptr<PooledArena>> arenas(16);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&pool, &arenas, i] {
      for (int j = 0; j < 4; ++j) {
        auto arena =
            pool.CreateArena(absl::StrCat("job-", i, "-", j), 64 * 1024);
        if (arena.ok()) arenas[i * 4 + j] = std::move(*arena);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  int created = 0;
  for (const auto& arena : arenas) created += arena != nullptr;
  EXPECT_EQ(created, 8);
  EXPECT_EQ(pool.GetStats().used_bytes, 8 * 64 * 1024u);
  arenas.clear();
  EXPECT_EQ(pool.GetStats().used_bytes, 0u);
  EXPECT_TRUE(pool.GetStats().jobs.empty());
}

}  // namespace
}  // namespace lohan
