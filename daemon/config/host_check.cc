#include "daemon/config/host_check.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/meminfo.h"
#include "daemon/config/trusted_path.h"
#include "layout/byte_size.h"
#include "wire/errno_status.h"
#include "wire/unique_fd.h"

namespace lohan {
namespace {

constexpr int kCapIpcLock = 14;  // linux/capability.h

bool HasCapIpcLock() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    uint64_t caps = 0;
    std::istringstream hex(line.substr(7));
    hex >> std::hex >> caps;
    return (caps >> kCapIpcLock) & 1;
  }
  return false;
}

}  // namespace

HostMemory ReadHostMemory() {
  HostMemory memory;
  memory.available_bytes = MemAvailableBytes();
  memory.total_bytes = MemTotalBytes();
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0) {
    memory.memlock_limit_bytes = limit.rlim_cur == RLIM_INFINITY
                                     ? std::numeric_limits<uint64_t>::max()
                                     : limit.rlim_cur;
  }
  memory.has_cap_ipc_lock = HasCapIpcLock();
  return memory;
}

absl::Status CheckPoolFits(uint64_t pool_bytes, const HostMemory& memory) {
  if (pool_bytes > memory.available_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key 'pool.host_pool_size' asks for ", FormatByteSize(pool_bytes),
        " but this machine has only ", FormatByteSize(memory.available_bytes),
        " of memory available to lock; lower it (--host-pool-size)"));
  }
  if (!memory.has_cap_ipc_lock && pool_bytes > memory.memlock_limit_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key 'pool.host_pool_size' asks for ", FormatByteSize(pool_bytes),
        " but RLIMIT_MEMLOCK allows ",
        FormatByteSize(memory.memlock_limit_bytes),
        " and lohand lacks CAP_IPC_LOCK; run it as root (the systemd unit "
        "does), raise the limit (LimitMEMLOCK=), or lower the pool"));
  }
  return absl::OkStatus();
}

uint64_t StateTierFloorBytes(const HostMemory& memory) {
  return std::max<uint64_t>(uint64_t{1} << 30, memory.total_bytes / 16);
}

uint64_t ResolveReadAhead(const DaemonConfig& config,
                          const HostMemory& memory) {
  if (config.optimizer_read_ahead_bytes.has_value()) {
    return *config.optimizer_read_ahead_bytes;
  }
  return (memory.total_bytes / 8) & ~((uint64_t{1} << 20) - 1);
}

absl::StatusOr<uint64_t> ResolveStateTier(const DaemonConfig& config,
                                          const HostMemory& memory) {
  const uint64_t pool = config.host_pool_bytes;
  if (!config.state_tier_bytes.has_value()) {
    const uint64_t taken =
        pool + ResolveReadAhead(config, memory) + StateTierFloorBytes(memory);
    if (memory.available_bytes <= taken) return 0;
    uint64_t tier = (memory.available_bytes - taken) / 2;
    if (!memory.has_cap_ipc_lock) {
      const uint64_t lockable = memory.memlock_limit_bytes > pool
                                    ? memory.memlock_limit_bytes - pool
                                    : 0;
      tier = std::min(tier, lockable);
    }
    return tier & ~((uint64_t{1} << 20) - 1);  // whole MiB
  }
  const uint64_t tier = *config.state_tier_bytes;
  if (tier == 0) return 0;
  if (pool + tier > memory.available_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key 'pool.state_tier' asks for ", FormatByteSize(tier), " beside a ",
        FormatByteSize(pool), " pool, but this machine has only ",
        FormatByteSize(memory.available_bytes),
        " of memory available to lock; lower it (--state-tier), or use "
        "\"auto\" to size it to the machine"));
  }
  if (!memory.has_cap_ipc_lock && pool + tier > memory.memlock_limit_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key 'pool.state_tier' asks for ", FormatByteSize(tier), " beside a ",
        FormatByteSize(pool), " pool, but RLIMIT_MEMLOCK allows ",
        FormatByteSize(memory.memlock_limit_bytes),
        " and lohand lacks CAP_IPC_LOCK; run it as root (the systemd unit "
        "does), raise the limit (LimitMEMLOCK=), or lower the tier"));
  }
  return tier;
}

absl::Status CheckSsdPath(const std::string& path, uint64_t capacity_bytes) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) {
    const int error = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "SSD path '", path,
        "' (key 'store.ssd_paths'): ", ErrnoToStatus(error, "stat").message(),
        error == ENOENT ? "; create the directory first" : ""));
  }
  if (S_ISBLK(info.st_mode)) {
    UniqueFd device(open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!device) {
      return absl::FailedPreconditionError(
          absl::StrCat("SSD path '", path, "' (key 'store.ssd_paths'): ",
                       ErrnoToStatus(errno, "open for writing").message()));
    }
    return absl::OkStatus();
  }
  if (!S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("SSD path '", path,
                     "' (key 'store.ssd_paths') is neither a directory nor "
                     "a block device"));
  }
  // access(W_OK) says yes to root even on read-only mounts; create a file.
  const std::string probe =
      absl::StrCat(path, "/.lohand-write-probe-", getpid());
  UniqueFd file(
      open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600));
  if (!file) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SSD path '", path, "' (key 'store.ssd_paths') is not writable: ",
        ErrnoToStatus(errno, "creating a file in it").message()));
  }
  unlink(probe.c_str());

  // The store preallocates its data file; say so now rather than fail there.
  struct stat data {};
  const std::string data_file = absl::StrCat(path, "/lohan.data");
  const uint64_t existing = stat(data_file.c_str(), &data) == 0
                                ? static_cast<uint64_t>(data.st_size)
                                : 0;
  struct statvfs filesystem {};
  if (capacity_bytes > existing && statvfs(path.c_str(), &filesystem) == 0) {
    const uint64_t free_bytes =
        static_cast<uint64_t>(filesystem.f_bavail) * filesystem.f_frsize;
    if (capacity_bytes - existing > free_bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SSD path '", path, "' has ", FormatByteSize(free_bytes),
          " free but key 'store.capacity_per_ssd' asks for ",
          FormatByteSize(capacity_bytes),
          existing > 0
              ? absl::StrCat(" (", FormatByteSize(existing), " already held)")
              : "",
          "; lower it (--ssd-capacity) or free space"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckHost(const DaemonConfig& config) {
  if (absl::Status status = CheckTrustedPaths(config, geteuid());
      !status.ok()) {
    return status;
  }
  for (const std::string& path : config.ssd_paths) {
    if (absl::Status status = CheckSsdPath(path, config.ssd_capacity_bytes);
        !status.ok()) {
      return status;
    }
  }
  const HostMemory memory = ReadHostMemory();
  if (absl::Status fits = CheckPoolFits(config.host_pool_bytes, memory);
      !fits.ok()) {
    return fits;
  }
  return ResolveStateTier(config, memory).status();
}

}  // namespace lohan
