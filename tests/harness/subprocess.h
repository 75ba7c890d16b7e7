#ifndef LOHAN_TESTS_HARNESS_SUBPROCESS_H_
#define LOHAN_TESTS_HARNESS_SUBPROCESS_H_

#include <string>
#include <vector>

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

// The absolute path of a file in the test's runfiles, e.g.
// "daemon/main/lohand".
std::string Runfile(const std::string& relative);

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
