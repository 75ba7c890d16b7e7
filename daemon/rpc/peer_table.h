#ifndef LOHAN_DAEMON_RPC_PEER_TABLE_H_
#define LOHAN_DAEMON_RPC_PEER_TABLE_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/common/caller.h"

namespace lohan {

// Who is on the other end of each connection the daemon handed to gRPC, and
// how many each user holds. gRPC names such a connection's peer "fd:<N>";
// this maps it back to the credentials read when the connection was
// accepted. gRPC closes connections without telling us, so each entry also
// keeps the socket's kernel cookie (SO_COOKIE): an fd that no longer names
// that very socket (closed, or its number reused) is a closed connection.
// Thread-safe.
class PeerTable {
 public:
  // Registers the connection `fd` for `caller`, or RESOURCE_EXHAUSTED
  // (registering nothing) when the caller's uid already holds `limit` live
  // connections (0: no limit). Entries of closed connections are dropped
  // first. A reused fd number's entry is replaced.
  absl::Status Admit(int fd, const Caller& caller, uint32_t limit)
      ABSL_LOCKS_EXCLUDED(mu_);

  // UNAUTHENTICATED for a peer string this table does not know: the daemon
  // serves no connection it did not accept itself.
  absl::StatusOr<Caller> Lookup(const std::string& grpc_peer) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Live connections of `uid`.
  size_t ConnectionsOf(uid_t uid) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Peer {
    Caller caller;
    uint64_t cookie = 0;
  };
  void DropClosedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<int, Peer> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_RPC_PEER_TABLE_H_
