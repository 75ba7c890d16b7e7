#include "client/device_guard.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace lohan::cuda {
namespace {

// Stands in for a machine's GPUs: which device is current on "the thread"
// (none: no context bound, what the runtime would call device 0), which devices
// have a primary context, and every call made, so a test can see that no
// context was created where it must not be.
class FakeProbe : public DeviceProbe {
 public:
  absl::StatusOr<int> Current() override {
    calls.push_back("Current");
    return bound ? current : kNoCurrentContext;
  }
  absl::StatusOr<bool> HasContext(int device) override {
    calls.push_back(absl::StrCat("HasContext(", device, ")"));
    return contexts.count(device) > 0;
  }
  absl::Status Set(int device) override {
    calls.push_back(absl::StrCat("Set(", device, ")"));
    if (fail_set) return absl::InternalError("cudaSetDevice failed");
    contexts.insert(device);  // as cudaSetDevice does since CUDA 12
    current = device;
    bound = true;
    return absl::OkStatus();
  }
  absl::Status Clear() override {
    calls.push_back("Clear");
    bound = false;
    return absl::OkStatus();
  }

  int current = 0;
  bool bound = false;  // a context is current on the thread
  std::set<int> contexts;
  bool fail_set = false;
  std::vector<std::string> calls;
};

TEST(DeviceGuardTest, SwitchesAndSetsBackAPreviousDeviceWithAContext) {
  FakeProbe probe;
  probe.contexts = {0, 2};
  probe.current = 0;
  probe.bound = true;
  {
    DeviceGuard guard(probe);
    ASSERT_TRUE(guard.Enter(2).ok());
    EXPECT_EQ(probe.current, 2);
  }
  EXPECT_EQ(probe.current, 0);
  EXPECT_TRUE(probe.bound);
  EXPECT_EQ(probe.contexts, (std::set<int>{0, 2}));
}

TEST(DeviceGuardTest, NoSwitchWhenAlreadyThere) {
  FakeProbe probe;
  probe.contexts = {3};
  probe.current = 3;
  probe.bound = true;
  {
    DeviceGuard guard(probe);
    ASSERT_TRUE(guard.Enter(3).ok());
  }
  EXPECT_EQ(probe.calls, (std::vector<std::string>{"Current"}));
  EXPECT_EQ(probe.current, 3);
}

TEST(DeviceGuardTest, NeverCreatesAContextOnAPreviousDeviceThatHadNone) {
  // A thread that never used CUDA (torch on cuda:1 without set_device):
  // the runtime says 0, device 0 has no context.
  FakeProbe probe;
  {
    DeviceGuard guard(probe);
    ASSERT_TRUE(guard.Enter(1).ok());
    EXPECT_EQ(probe.current, 1);
    EXPECT_TRUE(probe.bound);
  }
  EXPECT_EQ(probe.contexts, (std::set<int>{1}));  // none on device 0
  EXPECT_FALSE(probe.bound);                      // as before the guard
  for (const std::string& call : probe.calls) EXPECT_NE(call, "Set(0)");
}

TEST(DeviceGuardTest, AClearedThreadIsSwitchedAndClearedAgainEachTime) {
  // After a guard Cleared the thread, the next call on the same device must
  // bind it again (nothing is current) and clear it again afterwards,
  // rather than leave the job's device current on torch's thread.
  FakeProbe probe;
  for (int round = 0; round < 2; ++round) {
    DeviceGuard guard(probe);
    ASSERT_TRUE(guard.Enter(1).ok());
    EXPECT_TRUE(probe.bound);
    EXPECT_EQ(probe.current, 1);
  }
  EXPECT_FALSE(probe.bound);
  EXPECT_EQ(probe.calls,
            (std::vector<std::string>{"Current", "Set(1)", "Clear", "Current",
                                      "Set(1)", "Clear"}));
}

TEST(DeviceGuardTest, APreviousDeviceWhosePrimaryContextIsInactiveIsCleared) {
  // Bound to device 0 but its primary context not active (e.g. released
  // under us): setting it back would create one; clear instead.
  FakeProbe probe;
  probe.bound = true;
  probe.current = 0;
  {
    DeviceGuard guard(probe);
    ASSERT_TRUE(guard.Enter(2).ok());
  }
  EXPECT_FALSE(probe.bound);
  EXPECT_EQ(probe.contexts, (std::set<int>{2}));
}

TEST(DeviceGuardTest, NestedGuardsRestoreInTurn) {
  FakeProbe probe;
  probe.contexts = {0};
  probe.current = 0;
  probe.bound = true;
  {
    DeviceGuard outer(probe);
    ASSERT_TRUE(outer.Enter(1).ok());
    {
      DeviceGuard inner(probe);
      ASSERT_TRUE(inner.Enter(2).ok());
      EXPECT_EQ(probe.current, 2);
      {
        DeviceGuard same(probe);
        ASSERT_TRUE(same.Enter(2).ok());
      }
      EXPECT_EQ(probe.current, 2);
    }
    EXPECT_EQ(probe.current, 1);  // the inner one set back the outer's
  }
  EXPECT_EQ(probe.current, 0);
  EXPECT_TRUE(probe.bound);
}

TEST(DeviceGuardTest, NestedFromAThreadWithoutContextEndsCleared) {
  FakeProbe probe;
  {
    DeviceGuard outer(probe);
    ASSERT_TRUE(outer.Enter(1).ok());
    {
      DeviceGuard inner(probe);
      ASSERT_TRUE(inner.Enter(2).ok());
    }
    EXPECT_EQ(probe.current, 1);  // device 1 has a context by now
    EXPECT_TRUE(probe.bound);
  }
  EXPECT_FALSE(probe.bound);
  EXPECT_EQ(probe.contexts.count(0), 0u);
}

TEST(DeviceGuardTest, AFailedSwitchRestoresNothing) {
  FakeProbe probe;
  probe.contexts = {0};
  probe.bound = true;
  probe.fail_set = true;
  {
    DeviceGuard guard(probe);
    EXPECT_EQ(guard.Enter(1).code(), absl::StatusCode::kInternal);
  }
  EXPECT_EQ(probe.calls,
            (std::vector<std::string>{"Current", "HasContext(0)", "Set(1)"}));
}

TEST(DeviceGuardTest, RejectsANegativeDeviceAndASecondEnter) {
  FakeProbe probe;
  DeviceGuard guard(probe);
  EXPECT_EQ(guard.Enter(-1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(probe.calls.empty());
  ASSERT_TRUE(guard.Enter(1).ok());
  EXPECT_EQ(guard.Enter(2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(probe.current, 1);
}

}  // namespace
}  // namespace lohan::cuda
