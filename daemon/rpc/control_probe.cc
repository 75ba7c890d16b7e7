#include "daemon/rpc/control_probe.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "proto/lohan.grpc.pb.h"

namespace lohan {

absl::Status ProbeControlPlane(const std::string& socket_path,
                               absl::Duration deadline) {
  grpc::ChannelArguments arguments;
  // A connection of its own, never one shared with another channel: each
  // probe goes through the accept thread.
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Root's status names every job (64 MiB: the clients' bound).
  arguments.SetMaxReceiveMessageSize(64 << 20);
  std::unique_ptr<v1::Lohan::Stub> stub = v1::Lohan::NewStub(
      grpc::CreateCustomChannel(absl::StrCat("unix:", socket_path),
                                grpc::InsecureChannelCredentials(), arguments));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  v1::GetStatusResponse response;
  const grpc::Status status =
      stub->GetStatus(&context, v1::GetStatusRequest(), &response);
  if (status.ok()) return absl::OkStatus();
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat("GetStatus on ", socket_path, ": ", status.error_message()));
}

}  // namespace lohan
