#include "daemon/config/host_check.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/byte_size.h"
#include "daemon/config/trusted_path.h"
#include "wire/errno_status.h"
#include "wire/unique_fd.h"

namespace lohan {
namespace {

constexpr int kCapIpcLock = 14;  // linux/capability.h

uint64_t ReadMemAvailable() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string name;
    uint64_t kib = 0;
    if (fields >> name >> kib && name == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

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
  memory.available_bytes = ReadMemAvailable();
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
  return CheckPoolFits(config.host_pool_bytes, ReadHostMemory());
}

}  // namespace lohan
