#include "daemon/ipc/arena_access.h"

#include "absl/strings/str_cat.h"

namespace lohan {

absl::Status AuthorizeArenaAccess(const Caller& peer, uid_t owner) {
  if (peer.is_root() || peer.uid == owner) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("uid ", peer.uid, " (pid ", peer.pid,
                   ") may not map the arena of a job owned by uid ", owner));
}

}  // namespace lohan
