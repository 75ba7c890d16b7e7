#ifndef LOHAN_DAEMON_COMMON_MEMINFO_H_
#define LOHAN_DAEMON_COMMON_MEMINFO_H_

#include <cstdint>

namespace lohan {

// MemAvailable from /proc/meminfo: what the kernel estimates can be
// allocated without swapping (0 when it cannot be read).
uint64_t MemAvailableBytes();
// MemTotal from /proc/meminfo (0 when it cannot be read).
uint64_t MemTotalBytes();

}  // namespace lohan

#endif  // LOHAN_DAEMON_COMMON_MEMINFO_H_
