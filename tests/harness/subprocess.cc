#include "tests/harness/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace lohan::testing {
namespace {

// Bounds a hung command only; every command here normally ends in seconds.
constexpr auto kRunBound = std::chrono::minutes(2);

// Starts argv[0] with stdin from /dev/null, stdout on `out_fd` and (when
// >= 0) stderr on `err_fd`; the environment plus `extra_env`. Returns the
// pid, or -errno.
pid_t Spawn(const std::vector<std::string>& argv,
            const std::vector<std::string>& extra_env, int out_fd, int err_fd) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  if (err_fd >= 0) posix_spawn_file_actions_adddup2(&actions, err_fd, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const std::string& arg : argv) {
    args.push_back(const_cast<char*>(arg.c_str()));
  }
  args.push_back(nullptr);
  std::vector<std::string> env_strings(extra_env);
  for (char** e = environ; *e != nullptr; ++e) env_strings.push_back(*e);
  std::vector<char*> env;
  for (std::string& entry : env_strings) env.push_back(entry.data());
  env.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr,
                                  args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  return spawned == 0 ? pid : -spawned;
}

}  // namespace

int KillAndWait(pid_t pid, int signal) {
  kill(pid, signal);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

RunResult RunCommand(const std::vector<std::string>& argv,
                     const std::vector<std::string>& extra_env) {
  RunResult result;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    result.err = "pipe failed";
    return result;
  }
  const pid_t pid = Spawn(argv, extra_env, out_pipe[1], err_pipe[1]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  const int spawned = pid < 0 ? -pid : 0;
  if (spawned != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    result.err = std::string("spawn failed: ") + std::strerror(spawned);
    return result;
  }
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_streams = 2;
  const auto deadline = std::chrono::steady_clock::now() + kRunBound;
  while (open_streams > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(pid, SIGKILL);
      result.err += "\n[harness: killed after the run bound]";
      break;
    }
    if (poll(fds, 2, static_cast<int>(left.count())) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, n);
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_streams;
      }
    }
  }
  for (pollfd& fd : fds) {
    if (fd.fd >= 0) close(fd.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

absl::StatusOr<std::unique_ptr<BackgroundProcess>> BackgroundProcess::Start(
    const std::vector<std::string>& argv,
    const std::vector<std::string>& extra_env) {
  int out_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  const pid_t pid = Spawn(argv, extra_env, out_pipe[1], -1);
  close(out_pipe[1]);
  const int spawned = pid < 0 ? -pid : 0;
  if (spawned != 0) {
    close(out_pipe[0]);
    return absl::InternalError(std::string("spawn: ") + std::strerror(spawned));
  }
  std::string line;
  char c;
  while (read(out_pipe[0], &c, 1) == 1 && c != '\n') line.push_back(c);
  close(out_pipe[0]);
  std::unique_ptr<BackgroundProcess> process(new BackgroundProcess(pid, line));
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) {
    process->pid_ = 0;
    return absl::FailedPreconditionError("exited early after printing: " +
                                         line);
  }
  return process;
}

int BackgroundProcess::Stop(int signal) {
  if (pid_ == 0) return -1;
  return KillAndWait(std::exchange(pid_, 0), signal);
}

BackgroundProcess::~BackgroundProcess() {
  if (pid_ != 0) Stop(SIGKILL);
}

std::string Runfile(const std::string& relative) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return relative;
  return std::string(srcdir) + "/" + (workspace ? workspace : "lohan") + "/" +
         relative;
}

std::vector<std::string> AsNobody(const std::vector<std::string>& argv) {
  return AsUser(65534, argv);
}

std::vector<std::string> AsUser(uid_t uid,
                                const std::vector<std::string>& argv) {
  if (uid == 0) return argv;
  std::vector<std::string> wrapped = {
      "/usr/bin/setpriv", absl::StrCat("--reuid=", uid),
      absl::StrCat("--regid=", uid), "--clear-groups"};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

std::string CopyForOtherUsers(const std::string& relative,
                              const std::string& dir) {
  const std::string source = Runfile(relative);
  const std::string copy = dir + source.substr(source.rfind('/'));
  if (RunCommand({"/bin/cp", source, copy}).exit_code != 0) return "";
  return copy;
}

PublicTempDir::PublicTempDir() {
  std::string templ = "/tmp/lohan-test-XXXXXX";
  if (mkdtemp(templ.data()) != nullptr) {
    path_ = templ;
    chmod(path_.c_str(), 0755);
  }
}

PublicTempDir::~PublicTempDir() {
  if (path_.empty()) return;
  RunCommand({"/bin/rm", "-rf", path_});
}

}  // namespace lohan::testing
