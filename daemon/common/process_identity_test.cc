#include "daemon/common/process_identity.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(ProcessIdentity, SelfIsRunning) {
  absl::StatusOr<ProcessIdentity> self = IdentifyProcess(getpid());
  ASSERT_TRUE(self.ok()) << self.status();
  EXPECT_GT(self->start_ticks, 0u);
  EXPECT_TRUE(IsRunning(*self));
  ProcessIdentity reused = *self;
  reused.start_ticks += 1;  // same pid, another process
  EXPECT_FALSE(IsRunning(reused));
}

TEST(ProcessIdentity, ExitedChildIsNotRunning) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  absl::StatusOr<ProcessIdentity> identity = IdentifyProcess(child);
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_TRUE(IsRunning(*identity));
  kill(child, SIGKILL);
  // A zombie counts as gone even before it is reaped.
  for (int i = 0; i < 1000 && IsRunning(*identity); ++i) usleep(1000);
  EXPECT_FALSE(IsRunning(*identity));
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(IsRunning(*identity));
  EXPECT_EQ(IdentifyProcess(-1).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lohan
