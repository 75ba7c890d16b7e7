#ifndef LOHAN_PLUGINS_LIBTORCH_TEST_DAEMON_H_
#define LOHAN_PLUGINS_LIBTORCH_TEST_DAEMON_H_

#include <sys/types.h>

#include <string>

namespace lohan::torch_plugin {

// A real lohand from the test's runfiles, with tests/harness's standard
// flags (a 64 MiB host pool, one 64 MiB SSD path) in a fresh directory
// under /tmp, ready (it answers a connect through the C ABI) once the
// constructor returns. Killed and its directory removed on destruction.
// tests/harness/daemon_process.h does the same over the C++ control
// client, which cannot share a process with liblohan_client.so (both
// register proto/lohan.proto with one protobuf runtime); this one uses
// the C ABI only. Throws std::runtime_error, with the daemon's log, if it
// does not start.
class TestDaemon {
 public:
  TestDaemon();
  ~TestDaemon();
  TestDaemon(const TestDaemon&) = delete;
  TestDaemon& operator=(const TestDaemon&) = delete;

  const std::string& socket() const { return socket_; }
  std::string Log() const;

 private:
  std::string dir_;
  std::string socket_;
  pid_t pid_ = 0;
};

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_TEST_DAEMON_H_
