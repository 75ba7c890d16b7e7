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

// NOT_FOUND when no such process is running; UNAVAILABLE when /proc cannot
// be read now (the daemon is short of file descriptors or memory): that
// says nothing about the process.
absl::StatusOr<ProcessIdentity> IdentifyProcess(pid_t pid);

enum class ProcessState {
  kRunning,  // the very process `identity` names, not a zombie
  kGone,     // exited (or its pid now names another process)
  kUnknown,  // /proc could not be read; treat as running
};
ProcessState CheckRunning(const ProcessIdentity& identity);

}  // namespace lohan

#endif  // LOHAN_DAEMON_COMMON_PROCESS_IDENTITY_H_
