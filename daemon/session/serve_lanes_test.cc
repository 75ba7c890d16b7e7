#include "daemon/session/serve_lanes.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using Lane = ServeLanes::Lane;

TEST(ServeLanes, AnUrgentTaskIsNotQueuedBehindABusyBulkLane) {
  ServeLanes lanes(/*in_order=*/false);
  absl::Notification release_bulk, urgent_ran;
  lanes.Post(Lane::kBulk, [&] { release_bulk.WaitForNotification(); });
  lanes.Post(Lane::kUrgent, [&] { urgent_ran.Notify(); });
  // The bulk lane is stuck; the urgent task runs anyway.
  urgent_ran.WaitForNotification();
  release_bulk.Notify();
  lanes.Drain();
}

TEST(ServeLanes, EachLaneKeepsItsOrderAndDrainWaitsForBoth) {
  ServeLanes lanes(/*in_order=*/false);
  std::vector<int> bulk, urgent;
  for (int i = 0; i < 1000; ++i) {
    lanes.Post(Lane::kBulk, [&bulk, i] { bulk.push_back(i); });
    lanes.Post(Lane::kUrgent, [&urgent, i] { urgent.push_back(i); });
  }
  lanes.Drain();
  ASSERT_EQ(bulk.size(), 1000u);
  ASSERT_EQ(urgent.size(), 1000u);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(bulk[i], i);
    EXPECT_EQ(urgent[i], i);
  }
}

TEST(ServeLanes, AnOrderedTaskRunsBetweenWhatCameBeforeAndAfterIt) {
  ServeLanes lanes(/*in_order=*/false);
  absl::Notification release_bulk;
  absl::Mutex mu;
  std::vector<std::string> order;
  auto record = [&](const char* what) {
    absl::MutexLock lock(&mu);
    order.push_back(what);
  };
  lanes.Post(Lane::kBulk, [&] {
    release_bulk.WaitForNotification();
    record("bulk before");
  });
  lanes.Post(Lane::kUrgent, [&] { record("urgent before"); });
  lanes.Post(Lane::kOrdered, [&] { record("ordered"); });
  lanes.Post(Lane::kUrgent, [&] { record("urgent after"); });
  lanes.Post(Lane::kBulk, [&] { record("bulk after"); });
  absl::SleepFor(absl::Milliseconds(50));
  {
    // The urgent task before the barrier ran beside the stuck bulk one;
    // nothing else did.
    absl::MutexLock lock(&mu);
    EXPECT_EQ(order, (std::vector<std::string>{"urgent before"}));
  }
  release_bulk.Notify();
  lanes.Drain();
  ASSERT_EQ(order.size(), 5u);
  EXPECT_EQ(order[1], "bulk before");
  EXPECT_EQ(order[2], "ordered");
}

TEST(ServeLanes, WaitOrderedReturnsOnceTheOrderedTasksHaveRun) {
  ServeLanes lanes(/*in_order=*/false);
  std::atomic<int> ran{0};
  absl::Notification release_bulk;
  lanes.Post(Lane::kBulk, [&] { release_bulk.WaitForNotification(); });
  for (int i = 0; i < 3; ++i) lanes.Post(Lane::kOrdered, [&] { ++ran; });
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(20));
    release_bulk.Notify();
  });
  lanes.WaitOrdered();
  EXPECT_EQ(ran.load(), 3);
  releaser.join();
}

TEST(ServeLanes, InOrderRunsEachTaskAtOnceOnTheCaller) {
  ServeLanes lanes(/*in_order=*/true);
  std::vector<int> order;
  lanes.Post(Lane::kBulk, [&] { order.push_back(1); });
  lanes.Post(Lane::kUrgent, [&] { order.push_back(2); });
  lanes.Post(Lane::kOrdered, [&] { order.push_back(3); });
  lanes.WaitOrdered();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  lanes.Drain();
}

TEST(ServeLanes, DestroyingDropsWhatHasNotBegunAndJoins) {
  std::atomic<int> ran{0};
  absl::Notification started, release;
  {
    ServeLanes lanes(/*in_order=*/false);
    lanes.Post(Lane::kBulk, [&] {
      started.Notify();
      release.WaitForNotification();
      ++ran;
    });
    for (int i = 0; i < 10; ++i) lanes.Post(Lane::kBulk, [&] { ++ran; });
    started.WaitForNotification();
    std::thread releaser([&] {
      absl::SleepFor(absl::Milliseconds(20));
      release.Notify();
    });
    releaser.detach();
  }
  EXPECT_EQ(ran.load(), 1);  // the running one finished; the rest dropped
}

}  // namespace
}  // namespace lohan
