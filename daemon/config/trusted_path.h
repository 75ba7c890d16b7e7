#ifndef LOHAN_DAEMON_CONFIG_TRUSTED_PATH_H_
#define LOHAN_DAEMON_CONFIG_TRUSTED_PATH_H_

// Whether the directories lohand keeps its files in are safe from the
// other local users it serves, as sshd's StrictModes asks of a home
// directory: a user who can write such a directory (or one above it) can
// rename lohand's job registry or SSD data file away, or plant a symlink
// where lohand will create a file.

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/config/config.h"

namespace lohan {

// OK when `directory` (resolved through symlinks) is a directory owned by
// `owner` or root and writable by neither group nor others, and every
// directory above it is owned by `owner` or root and is either writable by
// neither or sticky (as /tmp: others may create entries there but not
// rename or remove lohand's). Else FAILED_PRECONDITION naming `key` (the
// config key that gave the path), the directory at fault, its owner and
// mode, and the fix. A missing directory: FAILED_PRECONDITION too.
absl::Status CheckTrustedDirectory(const std::string& directory, uid_t owner,
                                   absl::string_view key);

// CheckTrustedDirectory of the socket's directory, the state directory,
// every SSD path that is a directory (block devices are the kernel's to
// guard) and the directory of [metrics] textfile when set, for a daemon
// running as `owner`. A directory that does not exist yet (`lohand
// --check-config` before the first start): the directory it would be made
// in is checked as one above it; but the metrics directory, which lohand
// does not make, must exist.
absl::Status CheckTrustedPaths(const DaemonConfig& config, uid_t owner);

}  // namespace lohan

#endif  // LOHAN_DAEMON_CONFIG_TRUSTED_PATH_H_
