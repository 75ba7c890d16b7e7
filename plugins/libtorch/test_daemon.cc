#include "plugins/libtorch/test_daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "lohan/lohan_client.h"

namespace lohan::torch_plugin {
namespace {

// Only bounds a hung start; a healthy daemon answers in milliseconds.
constexpr std::chrono::seconds kStartBound(60);

std::string Runfile(const std::string& relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return relative;
  return std::string(srcdir) + "/" + (workspace ? workspace : "lohan") + "/" +
         relative;
}

}  // namespace

TestDaemon::TestDaemon() {
  std::string templ = "/tmp/lohan-test-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    throw std::runtime_error("mkdtemp failed");
  }
  dir_ = templ;
  chmod(dir_.c_str(), 0755);
  mkdir((dir_ + "/ssd0").c_str(), 0755);
  socket_ = dir_ + "/lohand.sock";
  std::vector<std::string> argv = {Runfile("daemon/main/lohand"),
                                   "--socket",
                                   socket_,
                                   "--state-dir",
                                   dir_ + "/state",
                                   "--ssd-path",
                                   dir_ + "/ssd0",
                                   "--ssd-capacity",
                                   "64MiB",
                                   "--host-pool-size",
                                   "64MiB",
                                   "--profile-probe",
                                   "4MiB",
                                   "--optimizer-tuning",
                                   "default",
                                   "--log-level=debug"};
  const std::string log_path = dir_ + "/lohand.log";
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(log, 1);
    dup2(log, 2);
    std::vector<char*> args;
    for (std::string& arg : argv) args.push_back(arg.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + kStartBound;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      throw std::runtime_error("lohand exited during start: " + Log());
    }
    lohan_client* client = nullptr;
    if (lohan_client_connect(socket_.c_str(), &client) == LOHAN_OK) {
      lohan_client_destroy(client);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw std::runtime_error("lohand did not answer within 60 s: " + Log());
}

TestDaemon::~TestDaemon() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string TestDaemon::Log() const {
  std::ifstream log(dir_ + "/lohand.log");
  std::stringstream text;
  text << log.rdbuf();
  return text.str();
}

}  // namespace lohan::torch_plugin
