#ifndef LOHAN_DAEMON_IPC_UNIX_LISTENER_H_
#define LOHAN_DAEMON_IPC_UNIX_LISTENER_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/common/caller.h"
#include "wire/unique_fd.h"

namespace lohan {

// Owns the daemon's unix socket: binds it, accepts connections on its own
// thread and reads each peer's credentials (SO_PEERCRED) before handing the
// connection on. A lock file beside the socket ("<path>.lock", flock) proves
// which daemon owns the path, so a socket file left by a dead daemon is
// replaced and one held by a live daemon is refused.
class UnixListener {
 public:
  using ConnectionHandler = std::function<void(UniqueFd, const Caller&)>;

  // Creates the parent directory if missing (0755), takes the lock, replaces
  // a stale socket file and binds `path`, readable and writable by every
  // local user. FAILED_PRECONDITION naming the path and the holder's pid when
  // another daemon holds it.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(
      const std::string& path);

  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;
  // Stops accepting and removes the socket file.
  ~UnixListener();

  // Starts the accept thread. Each connection arrives non-blocking and
  // close-on-exec. REQUIRES: called once.
  void Start(ConnectionHandler handler);

  // Stops and joins the accept thread, closes the socket and removes its
  // file. Idempotent.
  void Stop();

  const std::string& path() const { return path_; }

 private:
  UnixListener(std::string path, UniqueFd lock, UniqueFd listen_fd,
               UniqueFd stop_event);
  void AcceptLoop(ConnectionHandler handler);

  const std::string path_;
  UniqueFd lock_fd_;
  UniqueFd listen_fd_;
  UniqueFd stop_event_;  // eventfd: wakes the accept thread to stop
  std::thread accept_thread_;
  bool stopped_ = false;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_IPC_UNIX_LISTENER_H_
