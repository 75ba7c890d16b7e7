#ifndef LOHAN_DAEMON_RPC_PEER_TABLE_H_
#define LOHAN_DAEMON_RPC_PEER_TABLE_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/common/caller.h"

namespace lohan {

// Who is on the other end of each connection the daemon handed to gRPC.
// gRPC names such a connection's peer "fd:<N>"; this maps it back to the
// credentials read when the connection was accepted. An fd number is reused
// only after gRPC closed it, and Register overwrites the entry before the new
// connection carries any call. Thread-safe.
class PeerTable {
 public:
  void Register(int fd, const Caller& caller);

  // UNAUTHENTICATED for a peer string this table does not know: the daemon
  // serves no connection it did not accept itself.
  absl::StatusOr<Caller> Lookup(const std::string& grpc_peer) const;

 private:
  mutable absl::Mutex mu_;
  std::map<int, Caller> callers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_RPC_PEER_TABLE_H_
