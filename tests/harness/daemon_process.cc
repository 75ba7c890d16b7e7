#include "tests/harness/daemon_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/control_client.h"
#include "tests/harness/subprocess.h"

extern char** environ;

namespace lohan::testing {
namespace {

// Only bounds a hung start; a healthy daemon answers in milliseconds.
constexpr auto kStartBound = std::chrono::seconds(60);

}  // namespace

std::vector<std::string> DaemonProcess::Flags(const std::string& dir) {
  return {"--socket", dir + "/lohand.sock", "--state-dir", dir + "/state",
          "--ssd-path", dir + "/ssd0", "--ssd-capacity", "64MiB",
          "--host-pool-size", "64MiB",
          // A small measurement of the SSD for the planner, and the
          // optimizer's default tuning rather than seconds of timing: tests
          // start hundreds of daemons (the calibration has tests of its
          // own).
          "--profile-probe", "4MiB", "--optimizer-tuning", "default"};
}

std::vector<std::string> DaemonProcess::Command(
    const std::string& dir, const std::vector<std::string>& extra_args) {
  std::vector<std::string> argv = {Runfile("daemon/main/lohand")};
  for (const std::string& flag : Flags(dir)) argv.push_back(flag);
  for (const std::string& arg : extra_args) argv.push_back(arg);
  return argv;
}

DaemonProcess::DaemonProcess(pid_t pid, std::string socket,
                             std::string log_path)
    : pid_(pid), socket_(std::move(socket)), log_path_(std::move(log_path)) {}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Spawn(
    const std::string& dir, const std::vector<std::string>& extra_args,
    const std::vector<std::string>& extra_env) {
  mkdir((dir + "/ssd0").c_str(), 0755);
  std::vector<std::string> argv = Command(dir, {"--log-level=debug"});
  for (const std::string& arg : extra_args) argv.push_back(arg);
  const std::string log_path = dir + "/lohand.log";
  // Built before fork: the child only execs.
  std::vector<std::string> env_strings(extra_env);
  for (char** e = environ; *e != nullptr; ++e) env_strings.push_back(*e);
  std::vector<char*> env;
  for (std::string& entry : env_strings) env.push_back(entry.data());
  env.push_back(nullptr);
  std::vector<char*> args;
  for (std::string& arg : argv) args.push_back(arg.data());
  args.push_back(nullptr);

  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(log, 1);
    dup2(log, 2);
    execve(args[0], args.data(), env.data());
    _exit(127);
  }
  return std::unique_ptr<DaemonProcess>(
      new DaemonProcess(pid, dir + "/lohand.sock", log_path));
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(
    const std::string& dir, const std::vector<std::string>& extra_args,
    const std::vector<std::string>& extra_env) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> spawned =
      Spawn(dir, extra_args, extra_env);
  if (!spawned.ok()) return spawned.status();
  std::unique_ptr<DaemonProcess> daemon = *std::move(spawned);
  const pid_t pid = daemon->pid_;
  const auto deadline = std::chrono::steady_clock::now() + kStartBound;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      daemon->pid_ = 0;
      return absl::FailedPreconditionError(
          absl::StrCat("lohand exited during start: ", daemon->Log()));
    }
    auto client =
        ControlClient::Connect({.socket_path = daemon->socket_,
                                .client_name = "test-harness",
                                .timeout = std::chrono::milliseconds(1000)});
    if (client.ok()) return daemon;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("lohand did not answer: ", daemon->Log()));
}

int DaemonProcess::Stop(int signal) {
  if (pid_ == 0) return -1;
  return KillAndWait(std::exchange(pid_, 0), signal);
}

DaemonProcess::~DaemonProcess() {
  if (pid_ != 0) Stop(SIGKILL);
}

std::string DaemonProcess::Log() const {
  std::ifstream file(log_path_);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace lohan::testing
