#ifndef LOHAN_TESTS_HARNESS_DAEMON_PROCESS_H_
#define LOHAN_TESTS_HARNESS_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lohan::testing {

// A real lohand, started from the test's runfiles on a socket in `dir`:
// socket dir/lohand.sock, state dir/state, one SSD path dir/ssd0, a 64 MiB
// host pool. Killed (SIGKILL) on destruction if still running.
class DaemonProcess {
 public:
  // Starts lohand with the standard flags plus `extra_args`, its
  // environment the test's plus `extra_env` ("KEY=VALUE", these win), and
  // waits until it serves Hello. On failure the status holds the daemon's
  // stderr.
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(
      const std::string& dir, const std::vector<std::string>& extra_args = {},
      const std::vector<std::string>& extra_env = {});
  // The same without waiting: returns once lohand is started, serving or
  // not (for tests that hold its start up, e.g. at a notification).
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Spawn(
      const std::string& dir, const std::vector<std::string>& extra_args = {},
      const std::vector<std::string>& extra_env = {});

  ~DaemonProcess();

  // Standard flags for a daemon living in `dir`.
  static std::vector<std::string> Flags(const std::string& dir);
  // The lohand binary, then Flags(dir), then `extra_args` (later flags win).
  static std::vector<std::string> Command(
      const std::string& dir, const std::vector<std::string>& extra_args = {});

  // Sends `signal` and waits; returns the exit code (128 + signal if killed).
  int Stop(int signal);

  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }
  // What the daemon wrote to stderr so far.
  std::string Log() const;

 private:
  DaemonProcess(pid_t pid, std::string socket, std::string log_path);

  pid_t pid_;
  const std::string socket_;
  const std::string log_path_;
};

}  // namespace lohan::testing

#endif  // LOHAN_TESTS_HARNESS_DAEMON_PROCESS_H_
