#include "daemon/common/test_point.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(TestPoint, RunsTheHookOfItsNameWhileInstalled) {
  int a = 0, b = 0;
  TestPoint("a");  // no hook: nothing
  {
    ScopedTestPointHook hook_a("a", [&] { ++a; });
    ScopedTestPointHook hook_b("b", [&] { ++b; });
    TestPoint("a");
    TestPoint("a");
    TestPoint("b");
    TestPoint("c");
  }
  TestPoint("a");
  EXPECT_EQ(a, 2);
  EXPECT_EQ(b, 1);
}

// A hook holds the thread that reached the point until the test lets it go.
TEST(TestPoint, AHookHoldsTheThreadThatReachedIt) {
  absl::Notification reached, release;
  bool passed = false;
  ScopedTestPointHook hook("hold", [&] {
    reached.Notify();
    release.WaitForNotification();
  });
  std::thread thread([&] {
    TestPoint("hold");
    passed = true;
  });
  reached.WaitForNotification();
  EXPECT_FALSE(passed);  // held: it cannot have passed before release
  release.Notify();
  thread.join();
  EXPECT_TRUE(passed);
}

}  // namespace
}  // namespace lohan
