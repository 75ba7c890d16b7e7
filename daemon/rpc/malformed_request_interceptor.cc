#include "daemon/rpc/malformed_request_interceptor.h"

#include <string>

namespace lohan {
namespace {

using grpc::experimental::InterceptionHookPoints;

class MalformedRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit MalformedRequestInterceptor(const char* method)
      : method_(method == nullptr ? "?" : method) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      // A message arrived (or the stream ended) but did not deserialize.
      malformed_ = true;
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS) &&
        malformed_ &&
        methods->GetSendStatus().error_code() == grpc::StatusCode::INTERNAL) {
      methods->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          "the request to " + method_ +
              " is not a valid message of that method (a client of another "
              "lohan version, or not a lohan client)"));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool malformed_ = false;
};

}  // namespace

grpc::experimental::Interceptor*
MalformedRequestInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  // gRPC owns and deletes the interceptor.
  return new MalformedRequestInterceptor(info->method());
}

}  // namespace lohan
