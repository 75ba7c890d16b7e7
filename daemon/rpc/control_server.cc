#include "daemon/rpc/control_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "daemon/rpc/malformed_request_interceptor.h"
#include "spdlog/spdlog.h"

namespace lohan {
namespace {

// Calls still running after this long at shutdown are cancelled.
constexpr auto kShutdownGrace = std::chrono::seconds(2);

}  // namespace

ControlServer::ControlServer(const DaemonParts& parts,
                             std::unique_ptr<UnixListener> listener)
    : service_(parts, &peers_), listener_(std::move(listener)) {}

absl::StatusOr<std::unique_ptr<ControlServer>> ControlServer::Start(
    const DaemonParts& parts, std::unique_ptr<UnixListener> listener) {
  std::unique_ptr<ControlServer> server(
      new ControlServer(parts, std::move(listener)));
  grpc::ServerBuilder builder;
  builder.RegisterService(&server->service_);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      std::make_unique<MalformedRequestInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // A connection that carries no call is closed after a while: nobody can
  // hold the daemon's file descriptors with idle connections for good.
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_IDLE_MS,
      static_cast<int>(parts.config->control_idle_timeout_seconds * 1000));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) {
    return absl::InternalError("cannot start the gRPC server");
  }
  grpc::Server* grpc_server = server->server_.get();
  ControlServer* self = server.get();
  const QuotaTable* quotas = parts.quotas;
  server->listener_->Start([grpc_server, self, quotas](UniqueFd connection,
                                                       const Caller& caller) {
    // lohand's own connections (its watchdog's probe) count against no
    // user's limit: root's clients must not starve the daemon's liveness.
    absl::Status admitted = self->peers_.Admit(
        connection.get(), caller,
        caller.pid == getpid() ? 0
                               : quotas->For(caller.uid).control_connections);
    if (!admitted.ok()) {
      // Closed unserved: the client sees the connection reset.
      if (std::optional<uint64_t> dropped =
              self->log_limiter_.Admit(absl::StrCat(caller.uid))) {
        spdlog::warn(
            "control connection refused to pid {} (uid {}): {}{}", caller.pid,
            caller.uid, std::string(admitted.message()),
            *dropped == 0
                ? ""
                : absl::StrCat(" (", *dropped, " more refusals not logged)"));
      }
      return;
    }
    spdlog::debug("connection fd {} from uid {} pid {}", connection.get(),
                  caller.uid, caller.pid);
    // gRPC takes ownership of the fd.
    grpc::AddInsecureChannelFromFd(grpc_server, connection.release());
  });
  return server;
}

void ControlServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  listener_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  server_->Wait();
}

ControlServer::~ControlServer() { Shutdown(); }

}  // namespace lohan
