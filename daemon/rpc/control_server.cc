#include "daemon/rpc/control_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>

#include <chrono>

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
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) {
    return absl::InternalError("cannot start the gRPC server");
  }
  grpc::Server* grpc_server = server->server_.get();
  PeerTable* peers = &server->peers_;
  server->listener_->Start(
      [grpc_server, peers](UniqueFd connection, const Caller& caller) {
        peers->Register(connection.get(), caller);
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
