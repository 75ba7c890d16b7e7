#ifndef LOHAN_DAEMON_IPC_ARENA_ACCESS_H_
#define LOHAN_DAEMON_IPC_ARENA_ACCESS_H_

#include <sys/types.h>

#include "absl/status/status.h"
#include "daemon/common/caller.h"

namespace lohan {

// Who may receive a job's arena fd (and so read and write its memory): the
// uid that owns the job, and root. `peer` must come from the kernel
// (ReadPeerCredentials on the very socket the fd will be sent over), never
// from anything the client says. PERMISSION_DENIED otherwise.
absl::Status AuthorizeArenaAccess(const Caller& peer, uid_t owner);

}  // namespace lohan

#endif  // LOHAN_DAEMON_IPC_ARENA_ACCESS_H_
