#ifndef LOHAN_DAEMON_QUOTA_USER_LIMITS_H_
#define LOHAN_DAEMON_QUOTA_USER_LIMITS_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <utility>

namespace lohan {

// What one user (uid) may hold at once, over all of that user's jobs and
// processes. 0 means no limit of its own (the daemon's capacity still
// bounds it). Configured in lohand.toml's [quotas].
struct UserLimits {
  uint32_t jobs = 0;                 // jobs in the registry
  uint32_t data_planes = 0;          // open or opening data-plane connections
  uint32_t control_connections = 0;  // open gRPC connections
  uint64_t host_pool_bytes = 0;      // arenas of the user's open data planes
  uint64_t ssd_bytes = 0;            // SSD space of the user's jobs
  // What lohand holds in its memory for the user's jobs and plans
  // (daemon_memory.h). Always bounded: 0 in the config means sized to the
  // machine (DefaultDaemonMemoryLimit), which lohand resolves at start.
  uint64_t daemon_memory_bytes = 0;
  // Host memory of the state tier ([pool] state_tier) the user's jobs hold
  // copies of their optimizer states in.
  uint64_t state_tier_bytes = 0;
  // Not a limit: each of the user's jobs' weight when jobs compete for the
  // SSD array and the optimizer (1 to 1000; a job of weight 2 gets twice
  // the share of one of weight 1 while both want more).
  uint32_t weight = 1;

  bool operator==(const UserLimits&) const = default;
};

// A user's own lines in the config: each set key replaces the default's.
struct UserLimitOverrides {
  std::optional<uint32_t> jobs;
  std::optional<uint32_t> data_planes;
  std::optional<uint32_t> control_connections;
  std::optional<uint64_t> host_pool_bytes;
  std::optional<uint64_t> ssd_bytes;
  std::optional<uint64_t> daemon_memory_bytes;
  std::optional<uint64_t> state_tier_bytes;
  std::optional<uint32_t> weight;

  UserLimits Over(UserLimits limits) const {
    if (jobs) limits.jobs = *jobs;
    if (data_planes) limits.data_planes = *data_planes;
    if (control_connections) limits.control_connections = *control_connections;
    if (host_pool_bytes) limits.host_pool_bytes = *host_pool_bytes;
    if (ssd_bytes) limits.ssd_bytes = *ssd_bytes;
    if (daemon_memory_bytes) limits.daemon_memory_bytes = *daemon_memory_bytes;
    if (state_tier_bytes) limits.state_tier_bytes = *state_tier_bytes;
    if (weight) limits.weight = *weight;
    return limits;
  }
};

// Every user's limits: the defaults, and the users configured by name
// (resolved to uids when the daemon starts). Immutable, so thread-safe.
class QuotaTable {
 public:
  QuotaTable() = default;
  QuotaTable(UserLimits defaults, std::map<uid_t, UserLimits> by_uid)
      : defaults_(defaults), by_uid_(std::move(by_uid)) {}

  const UserLimits& For(uid_t uid) const {
    auto found = by_uid_.find(uid);
    return found == by_uid_.end() ? defaults_ : found->second;
  }

 private:
  UserLimits defaults_;
  std::map<uid_t, UserLimits> by_uid_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_QUOTA_USER_LIMITS_H_
