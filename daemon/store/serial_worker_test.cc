#include "daemon/store/serial_worker.h"

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(SerialWorkerTest, RunsTasksInOrderOffThePostingThread) {
  absl::Mutex mu;
  std::vector<int> ran;
  std::vector<std::thread::id> threads;
  {
    SerialWorker worker;
    for (int i = 0; i < 100; ++i) {
      worker.Post([&, i] {
        absl::MutexLock lock(&mu);
        ran.push_back(i);
        threads.push_back(std::this_thread::get_id());
      });
    }
  }
  ASSERT_EQ(ran.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(ran[i], i);
  for (const std::thread::id& id : threads) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, threads[0]);
  }
}

// The destructor runs what was posted before it, even tasks queued behind
// one that is still running when it begins.
TEST(SerialWorkerTest, DestructorRunsEveryTaskPostedBeforeIt) {
  absl::Notification first_started, release_first;
  int later_ran = 0;
  std::thread releaser;
  {
    SerialWorker worker;
    worker.Post([&] {
      first_started.Notify();
      release_first.WaitForNotification();
    });
    for (int i = 0; i < 5; ++i) worker.Post([&] { ++later_ran; });
    first_started.WaitForNotification();
    EXPECT_EQ(later_ran, 0);  // queued behind the held task
    releaser = std::thread([&] { release_first.Notify(); });
  }
  releaser.join();
  EXPECT_EQ(later_ran, 5);
}

TEST(SerialWorkerTest, TasksPostedFromManyThreadsAllRun) {
  absl::Mutex mu;
  int ran = 0;
  {
    SerialWorker worker;
    std::vector<std::thread> posters;
    for (int t = 0; t < 4; ++t) {
      posters.emplace_back([&] {
        for (int i = 0; i < 250; ++i) {
          worker.Post([&] {
            absl::MutexLock lock(&mu);
            ++ran;
          });
        }
      });
    }
    for (std::thread& p : posters) p.join();
  }
  EXPECT_EQ(ran, 1000);
}

}  // namespace
}  // namespace lohan
