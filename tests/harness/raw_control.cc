#include "tests/harness/raw_control.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>

#include "proto/lohan.grpc.pb.h"

namespace lohan::testing {

absl::Status RegisterModelPastTheClientChecks(
    const std::string& socket, const v1::RegisterModelRequest& request) {
  std::unique_ptr<v1::Lohan::Stub> stub =
      v1::Lohan::NewStub(grpc::CreateChannel(
          "unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::minutes(1));
  v1::RegisterModelResponse response;
  const grpc::Status status = stub->RegisterModel(&context, request, &response);
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace lohan::testing
