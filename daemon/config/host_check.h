#ifndef LOHAN_DAEMON_CONFIG_HOST_CHECK_H_
#define LOHAN_DAEMON_CONFIG_HOST_CHECK_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "daemon/config/config.h"

namespace lohan {

// What this machine lets the daemon lock in RAM.
struct HostMemory {
  uint64_t available_bytes = 0;      // MemAvailable from /proc/meminfo
  uint64_t total_bytes = 0;          // MemTotal
  uint64_t memlock_limit_bytes = 0;  // RLIMIT_MEMLOCK (UINT64_MAX: unlimited)
  bool has_cap_ipc_lock = false;     // the limit does not apply
};

HostMemory ReadHostMemory();

// FAILED_PRECONDITION naming 'pool.host_pool_size' when `pool_bytes` cannot be
// locked: more than the available memory, or over RLIMIT_MEMLOCK without
// CAP_IPC_LOCK.
absl::Status CheckPoolFits(uint64_t pool_bytes, const HostMemory& memory);

// The free memory the state tier leaves the machine: it takes no new
// memory that would bring MemAvailable below this, and gives copies back
// when MemAvailable falls below it. A sixteenth of the memory, at least
// 1 GiB.
uint64_t StateTierFloorBytes(const HostMemory& memory);

// [pool] state_tier for this machine. "auto": half of what is available
// beyond the pool, the read-ahead and the floor (0 when nothing is), so
// the training processes keep the other half. A size: it must fit beside
// the pool in what can be locked (the available memory, RLIMIT_MEMLOCK
// without CAP_IPC_LOCK), else FAILED_PRECONDITION naming 'pool.state_tier'
// and the fix.
absl::StatusOr<uint64_t> ResolveStateTier(const DaemonConfig& config,
                                          const HostMemory& memory);

// The read-ahead memory all jobs share ([optimizer] read_ahead): the
// configured size, or for "auto" an eighth of the machine's memory (whole
// MiB). Auto is a cap: each job holds what its backward's idle SSD time
// fills, so on a machine whose tier holds the states it holds nothing.
uint64_t ResolveReadAhead(const DaemonConfig& config, const HostMemory& memory);

// FAILED_PRECONDITION naming the path unless it is an existing directory (or
// block device) in which this process can create files and whose filesystem
// has room to grow the data file (<path>/lohan.data) to `capacity_bytes`.
absl::Status CheckSsdPath(const std::string& path, uint64_t capacity_bytes);

// Everything the daemon needs from the machine before it starts serving.
absl::Status CheckHost(const DaemonConfig& config);

}  // namespace lohan

#endif  // LOHAN_DAEMON_CONFIG_HOST_CHECK_H_
