// ArenaPinning's bookkeeping without a GPU: waiting for callbacks, and a
// registration that CUDA refuses leaving the arena unpinned.
#include "client/arena_pinning.h"

#include <thread>

#include "client/data_plane.h"
#include "client/fake_daemon_test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(ArenaPinning, AwaitCallbacksWaitsForTheLastOne) {
  FakeDaemon daemon(64, /*echo=*/true);
  auto plane = daemon.Plane();
  ArenaPinning pinning(*plane);
  EXPECT_TRUE(pinning.AwaitCallbacks(absl::ZeroDuration()));
  pinning.callbacks_pending().fetch_add(2);
  EXPECT_FALSE(pinning.AwaitCallbacks(absl::Milliseconds(20)));
  EXPECT_EQ(pinning.callbacks_left(), 2);
  std::thread callbacks([&] {
    absl::SleepFor(absl::Milliseconds(50));
    pinning.callbacks_pending().fetch_sub(1);
    pinning.callbacks_pending().fetch_sub(1);
  });
  EXPECT_TRUE(pinning.AwaitCallbacks(absl::Seconds(30)));
  EXPECT_EQ(pinning.callbacks_left(), 0);
  callbacks.join();
}

TEST(ArenaPinning, ARefusedRegistrationLeavesItUnpinned) {
  if (cuda::Available().ok()) GTEST_SKIP() << "CUDA works here";
  FakeDaemon daemon(64, /*echo=*/true);
  auto plane = daemon.Plane();
  ArenaPinning pinning(*plane);
  const absl::Status first = pinning.Register(0, "test");
  EXPECT_FALSE(first.ok());
  // Not registered: a second try on another device is CUDA's refusal
  // again, not "already registered".
  const absl::Status second = pinning.Register(1, "test");
  EXPECT_EQ(second.code(), first.code());
  EXPECT_EQ(second.message().find("already registered"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace lohan
