#include "daemon/main/watchdog.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

// Bounds only a broken watchdog: a healthy one is done in milliseconds.
constexpr absl::Duration kPatience = absl::Seconds(60);

// Records pings and their times.
class Pings {
 public:
  void Ping() {
    absl::MutexLock lock(&mu_);
    times_.push_back(absl::Now());
  }
  // Waits for `count` pings (false after kPatience).
  bool WaitFor(size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return times_.size() >= count;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kPatience);
  }
  std::vector<absl::Time> times() {
    absl::MutexLock lock(&mu_);
    return times_;
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::Time> times_ ABSL_GUARDED_BY(mu_);
};

TEST(WatchdogTest, PingsAfterEachPassingCheckEveryHalfInterval) {
  const absl::Duration interval = absl::Milliseconds(400);
  Pings pings;
  absl::Mutex mu;
  std::vector<absl::Time> checks;
  std::vector<absl::Duration> deadlines;
  std::unique_ptr<Watchdog> watchdog = Watchdog::Start(
      interval,
      [&](absl::Duration deadline) {
        absl::MutexLock lock(&mu);
        checks.push_back(absl::Now());
        deadlines.push_back(deadline);
        return absl::OkStatus();
      },
      [&] { pings.Ping(); });
  ASSERT_TRUE(pings.WaitFor(4));
  watchdog->Stop();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(watchdog->pings(), pings.times().size());
  EXPECT_EQ(checks.size(), pings.times().size());
  for (absl::Duration deadline : deadlines) {
    EXPECT_EQ(deadline, interval / 4);
  }
  // Checks paced by the half interval, not run as fast as they pass (no
  // upper bound: a loaded machine may be late; the slack below is for the
  // thread being preempted between its clock and the check's).
  for (size_t i = 1; i < checks.size(); ++i) {
    EXPECT_GE(checks[i] - checks[i - 1], interval / 4) << i;
  }
}

TEST(WatchdogTest, AFailingCheckIsNeverPingedAndIsRetried) {
  Pings pings;
  std::atomic<int> checks{0};
  absl::Notification retried;
  std::unique_ptr<Watchdog> watchdog = Watchdog::Start(
      absl::Milliseconds(200),
      [&](absl::Duration) {
        if (++checks == 3) retried.Notify();
        return absl::UnavailableError("no answer");
      },
      [&] { pings.Ping(); });
  ASSERT_TRUE(retried.WaitForNotificationWithTimeout(kPatience));
  watchdog->Stop();
  EXPECT_TRUE(pings.times().empty());
  EXPECT_EQ(watchdog->pings(), 0u);
}

TEST(WatchdogTest, ACheckThatAnswersTooLateIsNotPinged) {
  Pings pings;
  std::atomic<int> checks{0};
  absl::Notification late_twice;
  std::unique_ptr<Watchdog> watchdog = Watchdog::Start(
      absl::Milliseconds(40),
      [&](absl::Duration deadline) {
        // Past its 10 ms, as a daemon stopped mid-check would be.
        absl::SleepFor(deadline * 3);
        if (++checks == 2) late_twice.Notify();
        return absl::OkStatus();
      },
      [&] { pings.Ping(); });
  ASSERT_TRUE(late_twice.WaitForNotificationWithTimeout(kPatience));
  watchdog->Stop();
  EXPECT_TRUE(pings.times().empty());
}

TEST(WatchdogTest, StopWakesTheWaitAndNothingIsPingedAfterIt) {
  Pings pings;
  // Half an hour between checks: only Stop can end the wait in time.
  std::unique_ptr<Watchdog> watchdog = Watchdog::Start(
      absl::Hours(1), [](absl::Duration) { return absl::OkStatus(); },
      [&] { pings.Ping(); });
  ASSERT_TRUE(pings.WaitFor(1));
  const absl::Time stopping = absl::Now();
  watchdog->Stop();
  EXPECT_LT(absl::Now() - stopping, kPatience);
  watchdog->Stop();  // idempotent
  EXPECT_EQ(pings.times().size(), 1u);
}

TEST(WatchdogTest, StopWaitsForACheckUnderWayThenPingsNothing) {
  Pings pings;
  absl::Notification checking;
  absl::Notification release;
  std::unique_ptr<Watchdog> watchdog = Watchdog::Start(
      absl::Hours(1),
      [&](absl::Duration) {
        checking.Notify();
        release.WaitForNotification();
        return absl::OkStatus();
      },
      [&] { pings.Ping(); });
  ASSERT_TRUE(checking.WaitForNotificationWithTimeout(kPatience));
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    watchdog->Stop();
    stopped = true;
  });
  // Stop cannot return while the check runs; give it time to ask.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(stopped.load());
  release.Notify();
  stopper.join();
  EXPECT_TRUE(stopped.load());
  // Whether Stop asked before the check returned or not, a ping after
  // Stop returned is impossible, and the destructor joins nothing twice.
  const size_t pinged = pings.times().size();
  EXPECT_LE(pinged, 1u);
  watchdog.reset();
  EXPECT_EQ(pings.times().size(), pinged);
}

}  // namespace
}  // namespace lohan
