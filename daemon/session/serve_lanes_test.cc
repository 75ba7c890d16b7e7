#include "daemon/session/serve_lanes.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
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

TEST(ServeLanes, InOrderRunsEachTaskAtOnceOnTheCaller) {
  ServeLanes lanes(/*in_order=*/true);
  std::vector<int> order;
  lanes.Post(Lane::kBulk, [&] { order.push_back(1); });
  lanes.Post(Lane::kUrgent, [&] { order.push_back(2); });
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
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
