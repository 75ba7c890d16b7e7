#include "daemon/rpc/peer_table.h"

#include <sys/socket.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/common/log_text.h"

namespace lohan {
namespace {

// The socket's cookie, unique for the kernel's uptime; 0 when `fd` is not
// an open socket.
uint64_t SocketCookie(int fd) {
  uint64_t cookie = 0;
  socklen_t length = sizeof(cookie);
  if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &length) != 0) return 0;
  return cookie;
}

}  // namespace

void PeerTable::DropClosedLocked() {
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (SocketCookie(it->first) != it->second.cookie) {
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status PeerTable::Admit(int fd, const Caller& caller, uint32_t limit) {
  absl::MutexLock lock(&mu_);
  peers_.erase(fd);  // that number's old connection is closed
  DropClosedLocked();
  if (limit != 0) {
    uint32_t held = 0;
    for (const auto& [open_fd, peer] : peers_) {
      if (peer.caller.uid == caller.uid) ++held;
    }
    if (held >= limit) {
      return absl::ResourceExhaustedError(
          absl::StrCat("uid ", caller.uid, " has ", held,
                       " control connections open and the quota is ", limit,
                       " ([quotas] control_connections in lohand.toml)"));
    }
  }
  peers_[fd] = Peer{.caller = caller, .cookie = SocketCookie(fd)};
  return absl::OkStatus();
}

absl::StatusOr<Caller> PeerTable::Lookup(const std::string& grpc_peer) const {
  absl::string_view peer = grpc_peer;
  int fd = -1;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &fd)) {
    return absl::UnauthenticatedError(
        absl::StrCat("unrecognised peer '", LogSafe(grpc_peer, 64), "'"));
  }
  absl::MutexLock lock(&mu_);
  auto found = peers_.find(fd);
  if (found == peers_.end()) {
    return absl::UnauthenticatedError(
        absl::StrCat("no credentials for peer '", grpc_peer, "'"));
  }
  return found->second.caller;
}

size_t PeerTable::ConnectionsOf(uid_t uid) {
  absl::MutexLock lock(&mu_);
  DropClosedLocked();
  size_t held = 0;
  for (const auto& [fd, peer] : peers_) {
    if (peer.caller.uid == uid) ++held;
  }
  return held;
}

}  // namespace lohan
