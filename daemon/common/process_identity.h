#ifndef LOHAN_DAEMON_COMMON_PROCESS_IDENTITY_H_
#define LOHAN_DAEMON_COMMON_PROCESS_IDENTITY_H_

#include <sys/types.h>

#include <cstdint>

#include "absl/status/statusor.h"

namespace lohan {

// A process as the kernel knows it: a pid alone can be reused after the
// process exits, pid plus start time cannot.
struct ProcessIdentity {
  pid_t pid = 0;
  uint64_t start_ticks = 0;  // field 22 of /proc/<pid>/stat

  bool operator==(const ProcessIdentity&) const = default;
};

// NOT_FOUND when no such process is running.
absl::StatusOr<ProcessIdentity> IdentifyProcess(pid_t pid);

// True while the very process `identity` names is running (not a zombie).
bool IsRunning(const ProcessIdentity& identity);

}  // namespace lohan

#endif  // LOHAN_DAEMON_COMMON_PROCESS_IDENTITY_H_
