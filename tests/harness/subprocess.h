#ifndef LOHAN_TESTS_HARNESS_SUBPROCESS_H_
#define LOHAN_TESTS_HARNESS_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lohan::testing {

struct RunResult {
  int exit_code = -1;  // 128 + signal when killed by a signal
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs argv[0] (a path) to completion with extra "KEY=VALUE" environment
// entries, capturing both streams. A command still running after two minutes
// is killed (exit_code 128 + SIGKILL), so a test that wrongly starts a daemon
// fails instead of hanging.
RunResult RunCommand(const std::vector<std::string>& argv,
                     const std::vector<std::string>& extra_env = {});

// Sends `signal` to `pid` and reaps it; its exit code (128 + signal if
// killed by one).
int KillAndWait(pid_t pid, int signal);

// A command left running in the background, e.g. a client that holds a job.
// Killed (SIGKILL) on destruction if still running.
class BackgroundProcess {
 public:
  // Starts argv[0] (a path) and returns once it has printed its first line
  // on stdout; an error (with what it printed) when it exits first.
  static absl::StatusOr<std::unique_ptr<BackgroundProcess>> Start(
      const std::vector<std::string>& argv,
      const std::vector<std::string>& extra_env = {});
  ~BackgroundProcess();
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& first_line() const { return first_line_; }
  // Sends `signal`, waits, and returns the exit code (128 + signal if
  // killed by one).
  int Stop(int signal);

 private:
  BackgroundProcess(pid_t pid, std::string first_line)
      : pid_(pid), first_line_(std::move(first_line)) {}
  pid_t pid_;
  const std::string first_line_;
};

// The absolute path of a file in the test's runfiles, e.g.
// "daemon/main/lohand".
std::string Runfile(const std::string& relative);

// `argv` to run as uid and gid 65534 (nobody) with no groups, through
// setpriv: a real second user. REQUIRES: the test runs as root.
std::vector<std::string> AsNobody(const std::vector<std::string>& argv);
// The same as `uid` (and gid `uid`): 0 runs `argv` as it is, 1 (daemon)
// is a real third user beside root and nobody.
std::vector<std::string> AsUser(uid_t uid,
                                const std::vector<std::string>& argv);

// Copies runfile `relative` into `dir` (nobody cannot reach Bazel's output
// tree; a PublicTempDir it can) and returns the copy's path; empty when the
// copy fails.
std::string CopyForOtherUsers(const std::string& relative,
                              const std::string& dir);

// A fresh directory under /tmp (not the test's private tmp: other uids must
// reach sockets in it), removed with everything in it on destruction.
class PublicTempDir {
 public:
  PublicTempDir();
  ~PublicTempDir();
  PublicTempDir(const PublicTempDir&) = delete;
  PublicTempDir& operator=(const PublicTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace lohan::testing

#endif  // LOHAN_TESTS_HARNESS_SUBPROCESS_H_
