#include "daemon/rpc/peer_table.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace lohan {

void PeerTable::Register(int fd, const Caller& caller) {
  absl::MutexLock lock(&mu_);
  callers_[fd] = caller;
}

absl::StatusOr<Caller> PeerTable::Lookup(const std::string& grpc_peer) const {
  absl::string_view peer = grpc_peer;
  int fd = -1;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &fd)) {
    return absl::UnauthenticatedError(
        absl::StrCat("unrecognised peer '", grpc_peer, "'"));
  }
  absl::MutexLock lock(&mu_);
  auto found = callers_.find(fd);
  if (found == callers_.end()) {
    return absl::UnauthenticatedError(
        absl::StrCat("no credentials for peer '", grpc_peer, "'"));
  }
  return found->second;
}

}  // namespace lohan
