#ifndef LOHAN_DAEMON_RPC_MALFORMED_REQUEST_INTERCEPTOR_H_
#define LOHAN_DAEMON_RPC_MALFORMED_REQUEST_INTERCEPTOR_H_

#include <grpcpp/support/server_interceptor.h>

namespace lohan {

// gRPC answers a request whose bytes do not parse as the method's message
// with INTERNAL and no text, as if the daemon were broken. This turns that
// answer into what it is: INVALID_ARGUMENT naming the method. Everything
// else passes unchanged.
class MalformedRequestInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_RPC_MALFORMED_REQUEST_INTERCEPTOR_H_
