#include "daemon/common/process_identity.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(ProcessIdentity, SelfIsRunning) {
  absl::StatusOr<ProcessIdentity> self = IdentifyProcess(getpid());
  ASSERT_TRUE(self.ok()) << self.status();
  EXPECT_GT(self->start_ticks, 0u);
  EXPECT_EQ(CheckRunning(*self), ProcessState::kRunning);
  ProcessIdentity reused = *self;
  reused.start_ticks += 1;  // same pid, another process
  EXPECT_EQ(CheckRunning(reused), ProcessState::kGone);
}

TEST(ProcessIdentity, ExitedChildIsGone) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  absl::StatusOr<ProcessIdentity> identity = IdentifyProcess(child);
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_EQ(CheckRunning(*identity), ProcessState::kRunning);
  kill(child, SIGKILL);
  // A zombie counts as gone even before it is reaped.
  for (int i = 0; i < 1000 && CheckRunning(*identity) != ProcessState::kGone;
       ++i) {
    usleep(1000);
  }
  EXPECT_EQ(CheckRunning(*identity), ProcessState::kGone);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(CheckRunning(*identity), ProcessState::kGone);
  EXPECT_EQ(IdentifyProcess(-1).status().code(), absl::StatusCode::kNotFound);
}

// A daemon out of file descriptors cannot read /proc; that must not make a
// live client look dead.
TEST(ProcessIdentity, NoFileDescriptorsLeftIsUnknownNotGone) {
  absl::StatusOr<ProcessIdentity> self = IdentifyProcess(getpid());
  ASSERT_TRUE(self.ok()) << self.status();
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  std::vector<int> held;
  rlimit tight = saved;
  tight.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  for (int fd; (fd = dup(0)) >= 0;) held.push_back(fd);
  const ProcessState state = CheckRunning(*self);
  const absl::Status status = IdentifyProcess(getpid()).status();
  for (int fd : held) close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_EQ(state, ProcessState::kUnknown);
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_NE(status.message().find("/proc/"), std::string::npos) << status;
}

}  // namespace
}  // namespace lohan
