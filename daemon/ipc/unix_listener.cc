#include "daemon/ipc/unix_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "wire/errno_status.h"
#include "wire/fd_passing.h"

namespace lohan {
namespace {

constexpr int kListenBacklog = 128;

absl::Status MakeParentDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return absl::OkStatus();
  const std::string parent = path.substr(0, slash);
  struct stat info {};
  if (stat(parent.c_str(), &info) == 0) return absl::OkStatus();
  if (absl::Status status = MakeParentDirectory(parent); !status.ok()) {
    return status;
  }
  if (mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("creating directory ", parent));
  }
  return absl::OkStatus();
}

std::string ReadHolderPid(const std::string& lock_path) {
  std::ifstream file(lock_path);
  std::string pid;
  std::getline(file, pid);
  return pid.empty() ? "unknown" : pid;
}

}  // namespace

UnixListener::UnixListener(std::string path, UniqueFd lock, UniqueFd listen_fd,
                           UniqueFd stop_event)
    : path_(std::move(path)),
      lock_fd_(std::move(lock)),
      listen_fd_(std::move(listen_fd)),
      stop_event_(std::move(stop_event)) {}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(
    const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path '", path, "' must be 1 to ",
                     sizeof(address.sun_path) - 1, " characters"));
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  if (absl::Status status = MakeParentDirectory(path); !status.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket '", path, "': ", status.message()));
  }

  // Never through a symlink, and only a plain file of ours: what sits at
  // the lock's name must not make lohand write someone else's file.
  const std::string lock_path = absl::StrCat(path, ".lock");
  UniqueFd lock(
      open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!lock) {
    return absl::FailedPreconditionError(absl::StrCat(
        ErrnoToStatus(errno, absl::StrCat("socket lock ", lock_path)).message(),
        errno == ELOOP ? " (it is a symlink: remove it)" : ""));
  }
  struct stat lock_info {};
  if (fstat(lock.get(), &lock_info) != 0 || !S_ISREG(lock_info.st_mode) ||
      lock_info.st_uid != geteuid() || lock_info.st_nlink != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "socket lock ", lock_path,
        " is not a plain file of lohand's own (owner uid ", lock_info.st_uid,
        ", ", lock_info.st_nlink,
        " links): someone else made it; remove it and start lohand again"));
  }
  if (flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("socket '", path, "' is held by a running lohand (pid ",
                       ReadHolderPid(lock_path),
                       "); stop it first or choose another socket (--socket)"));
    }
    return absl::FailedPreconditionError(
        ErrnoToStatus(errno, absl::StrCat("locking ", lock_path)).message());
  }
  const std::string pid_text = absl::StrCat(getpid(), "\n");
  if (ftruncate(lock.get(), 0) != 0 ||
      pwrite(lock.get(), pid_text.data(), pid_text.size(), 0) !=
          static_cast<ssize_t>(pid_text.size())) {
    spdlog::warn("cannot record the pid in {}: {}", lock_path,
                 std::strerror(errno));
  }

  // We hold the lock, so whatever sits at the path was left by a dead daemon.
  struct stat info {};
  if (lstat(path.c_str(), &info) == 0) {
    if (!S_ISSOCK(info.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "socket path '", path,
          "' exists and is not a socket; remove it or choose another"));
    }
    spdlog::info("replacing stale socket {} left by a previous daemon", path);
    if (unlink(path.c_str()) != 0) {
      return absl::FailedPreconditionError(
          ErrnoToStatus(errno, absl::StrCat("removing stale socket ", path))
              .message());
    }
  }

  UniqueFd listen_fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listen_fd) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  // Any local user may connect; calls are authorized by peer credentials.
  // The mode comes with the name (bind under a umask), never by a chmod
  // of the name afterwards, which a renamed entry could redirect. The
  // umask is the process's: lohand binds before it starts other threads
  // that create files, and a moment of 0111 only withholds execute bits.
  const mode_t umask_before = umask(0111);
  const int bound =
      bind(listen_fd.get(), reinterpret_cast<const sockaddr*>(&address),
           sizeof(address));
  const int bind_errno = errno;
  umask(umask_before);
  if (bound != 0) {
    return absl::FailedPreconditionError(
        ErrnoToStatus(bind_errno, absl::StrCat("binding ", path)).message());
  }
  if (listen(listen_fd.get(), kListenBacklog) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("listen on ", path));
  }
  UniqueFd stop_event(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_event) return ErrnoToStatus(errno, "eventfd");
  return std::unique_ptr<UnixListener>(new UnixListener(
      path, std::move(lock), std::move(listen_fd), std::move(stop_event)));
}

UnixListener::~UnixListener() { Stop(); }

void UnixListener::Start(ConnectionHandler handler) {
  accept_thread_ = std::thread(
      [this, handler = std::move(handler)] { AcceptLoop(handler); });
}

void UnixListener::AcceptLoop(ConnectionHandler handler) {
  pollfd fds[2] = {{.fd = listen_fd_.get(), .events = POLLIN},
                   {.fd = stop_event_.get(), .events = POLLIN}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("poll on {} failed: {}", path_, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    // gRPC's event engine needs the fd non-blocking, or calls hang.
    UniqueFd connection(accept4(listen_fd_.get(), nullptr, nullptr,
                                SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!connection) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        spdlog::warn("accept on {} failed: {}", path_, std::strerror(errno));
        // Out of fds: back off instead of spinning.
        if (errno == EMFILE || errno == ENFILE) usleep(100 * 1000);
      }
      continue;
    }
    absl::StatusOr<PeerCredentials> credentials =
        ReadPeerCredentials(connection.get());
    if (!credentials.ok()) {
      spdlog::warn("dropping a connection: {}",
                   std::string(credentials.status().message()));
      continue;
    }
    handler(std::move(connection),
            Caller{.uid = credentials->uid, .pid = credentials->pid});
  }
}

void UnixListener::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (accept_thread_.joinable()) {
    const uint64_t one = 1;
    if (write(stop_event_.get(), &one, sizeof(one)) != sizeof(one)) {
      spdlog::error("cannot wake the accept thread: {}", std::strerror(errno));
    }
    accept_thread_.join();
  }
  listen_fd_.reset();
  unlink(path_.c_str());
  // The lock file stays; removing it would race with a starting daemon.
  lock_fd_.reset();
}

}  // namespace lohan
