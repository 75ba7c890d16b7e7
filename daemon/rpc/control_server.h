#ifndef LOHAN_DAEMON_RPC_CONTROL_SERVER_H_
#define LOHAN_DAEMON_RPC_CONTROL_SERVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/common/log_limiter.h"
#include "daemon/config/config.h"
#include "daemon/ipc/unix_listener.h"
#include "daemon/jobs/job_registry.h"
#include "daemon/rpc/control_service.h"
#include "daemon/rpc/peer_table.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace lohan {

// The control plane: a gRPC server with no listening port of its own, fed the
// connections that `listener` accepts (with their peer credentials noted).
class ControlServer {
 public:
  // REQUIRES: everything in `parts` outlives the server.
  static absl::StatusOr<std::unique_ptr<ControlServer>> Start(
      const DaemonParts& parts, std::unique_ptr<UnixListener> listener);

  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;
  ~ControlServer();

  // Stops accepting, finishes or cancels calls in flight (after a grace
  // period), joins every thread and removes the socket file. Idempotent.
  void Shutdown();

  // What GetStatus answers `caller` (ControlService::StatusFor), for the
  // daemon's own use (its metrics). Thread-safe.
  v1::GetStatusResponse Status(const Caller& caller) {
    return service_.StatusFor(caller);
  }

 private:
  ControlServer(const DaemonParts& parts,
                std::unique_ptr<UnixListener> listener);

  PeerTable peers_;
  LogLimiter log_limiter_{5, absl::Seconds(10)};
  ControlService service_;
  std::unique_ptr<UnixListener> listener_;
  std::unique_ptr<grpc::Server> server_;
  bool shut_down_ = false;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_RPC_CONTROL_SERVER_H_
