#ifndef LOHAN_DAEMON_CONFIG_CONFIG_H_
#define LOHAN_DAEMON_CONFIG_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/quota/user_limits.h"
#include "layout/durability.h"

namespace lohan {

// Everything lohand reads from its config file. The defaults are not written
// here: they are deploy/lohand.toml, embedded (see DefaultConfig()).
struct DaemonConfig {
  std::string socket_path;
  std::string state_dir;
  std::string log_level;
  std::vector<std::string> ssd_paths;
  uint64_t ssd_capacity_bytes = 0;  // per SSD path
  uint64_t stripe_unit_bytes = 0;
  uint32_t block_size = 0;
  uint32_t queue_depth = 0;
  // The most bytes of one tensor transfer that pass the fair I/O gate at
  // once (whole stripe units); 0: see GateUnitBytes.
  uint64_t gate_unit_bytes = 0;
  bool allow_buffered_io = false;
  // Bytes written then read on each SSD to measure it for the planner (a
  // probe file beside the data file); 0: the SSDs are not measured.
  uint64_t profile_probe_bytes = 0;
  uint64_t host_pool_bytes = 0;
  // [pool] state_tier: host memory for jobs' optimizer states (the state
  // tier), or nullopt: "auto", sized to the machine when the daemon starts
  // (ResolveStateTier in host_check.h). 0: no tier.
  std::optional<uint64_t> state_tier_bytes;
  // The jobs' default durability: [pool] commit_interval (every that many
  // iterations), or [pool] durable_every (once that long passed since the
  // last durable iteration; commit_interval is then 0), "auto" by default
  // (kAutoDurableEverySeconds, stretched to keep the durable writes within
  // durable_write_share = kAutoDurableWriteShare of the time; a stated
  // duration has no share). A file that states one form replaces the
  // other; one that states both is refused.
  uint32_t commit_interval = 0;
  absl::Duration durable_every = absl::Seconds(kAutoDurableEverySeconds);
  double durable_write_share = kAutoDurableWriteShare;
  // [pool] state_tier_updates: "in_place" (the optimizer updates a state
  // where the tier holds it) or "copy" (into a chunk buffer and back).
  std::string state_tier_updates;
  // Entries in each of a data plane's two rings (a power of two, 8 to
  // 1024): the requests one process may have in flight.
  uint32_t ring_entries = 0;
  // 0 = half of the online cores, at least 1 (see EffectiveOptimizerThreads).
  uint32_t optimizer_threads = 0;
  // "auto", "avx512", "avx2" or "scalar".
  std::string optimizer_isa;
  // "auto" (calibrated at the first start, cached), "default", or a
  // tuning such as "prefetch=256,stream=on,chunks=16" (daemon/optim/tuning.h).
  std::string optimizer_tuning;
  // Host memory all jobs together may fill with optimizer states read
  // ahead of updates that wait for the gradient norm, shared by their
  // owners' weights (0: none). Unset ("auto"): sized to the machine
  // (ResolveReadAhead), and each job reads ahead what its backward's idle
  // SSD time fills (PipelineOptions::read_ahead_adapts).
  std::optional<uint64_t> optimizer_read_ahead_bytes;
  // A control connection that carries no call for this long is closed (the
  // client reconnects when it next calls).
  uint32_t control_idle_timeout_seconds = 0;
  // [quotas]: every user's limits, and [quotas.user.NAME]: one user's own
  // (by login name; resolved when the daemon starts).
  UserLimits quota_defaults;
  std::map<std::string, UserLimitOverrides> quota_users;
  // [quotas] reclaim_interval: a user's requests close other users' data
  // planes (beyond their shares) at most once per this long (zero: no
  // limit). [quotas] reclaim_grace: a job whose plane was closed for
  // another user's share is not closed so again for this long (zero: no
  // grace). Both from 0 to kMaxReclaimDuration, checked when parsed.
  absl::Duration reclaim_interval = absl::ZeroDuration();
  absl::Duration reclaim_grace = absl::ZeroDuration();
  // [quotas] regrow_after: a job whose arena was made smaller than it asks
  // for is asked to grow back once the pool has had room for it this long
  // without a break, and no sooner than this after it shrank (zero: at its
  // next iteration's end). From 0 to kMaxReclaimDuration.
  absl::Duration regrow_after = absl::ZeroDuration();
  // [jobs] keep_ended: lohand deletes a job that no process has been
  // attached to for this long (JobRegistry: ended), unless it is pinned,
  // and frees its SSD space; zero: never (jobs are deleted by hand only).
  // Zero, or from kMinKeepEnded to kMaxKeepEnded, checked when parsed.
  absl::Duration keep_ended = absl::ZeroDuration();
  // [metrics] textfile: where lohand writes its Prometheus metrics for
  // node_exporter's textfile collector (an absolute path ending in
  // ".prom", its directory trusted as trusted_path.h says); empty: none.
  // [metrics] interval: how often, from kMinMetricsInterval to
  // kMaxMetricsInterval.
  std::string metrics_textfile;
  absl::Duration metrics_interval = absl::ZeroDuration();
};

// The most [quotas] reclaim_interval, reclaim_grace and regrow_after may be.
inline constexpr absl::Duration kMaxReclaimDuration = absl::Hours(24);

// The bounds of a [jobs] keep_ended other than "0s" (never): beyond ten
// years it is a mistake, not a policy.
inline constexpr absl::Duration kMinKeepEnded = absl::Seconds(1);
inline constexpr absl::Duration kMaxKeepEnded = absl::Hours(24 * 3650);

// The bounds of [metrics] interval.
inline constexpr absl::Duration kMinMetricsInterval = absl::Seconds(1);
inline constexpr absl::Duration kMaxMetricsInterval = absl::Hours(1);

// Values given on the command line; each one set replaces the file's value.
struct ConfigOverrides {
  std::optional<std::string> socket_path;
  std::optional<std::string> state_dir;
  std::optional<std::string> log_level;
  std::optional<std::vector<std::string>> ssd_paths;
  std::optional<std::string> ssd_capacity;    // unparsed, e.g. "64GiB"
  std::optional<std::string> host_pool_size;  // unparsed, e.g. "8GiB"
  std::optional<std::string> profile_probe;   // unparsed, e.g. "256MiB"
  std::optional<std::string> state_tier;      // "auto" or a size
  std::optional<int64_t> optimizer_threads;
  std::optional<int64_t> ring_entries;
  std::optional<std::string> optimizer_tuning;
};

// The built-in defaults: the embedded deploy/lohand.toml.
DaemonConfig DefaultConfig();

// Parses TOML `text` on top of `base`. `origin` names the text in errors
// (usually the file path). Unknown keys, wrong types and bad values are
// INVALID_ARGUMENT naming the key and line.
absl::StatusOr<DaemonConfig> ParseConfigToml(absl::string_view text,
                                             absl::string_view origin,
                                             const DaemonConfig& base);

// Reads and parses the file at `path` on top of DefaultConfig().
absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path);

// Applies command-line overrides; a bad value is INVALID_ARGUMENT naming the
// flag.
absl::Status ApplyOverrides(const ConfigOverrides& overrides,
                            DaemonConfig& config);

// Checks values on their own (no file system access): absolute paths, the
// socket path length, log level names, a non-empty SSD list without
// duplicates, sizes and counts in range, the block size a power of two and
// the stripe unit a multiple of it, a known optimizer ISA name, an optimizer
// tuning that parses, a metrics textfile that is an absolute path to a
// *.prom file.
absl::Status ValidateConfig(const DaemonConfig& config);

// The data-plane socket lives beside the control socket.
std::string DataSocketPath(const DaemonConfig& config);

// The number of optimizer threads to start given `online_cores`.
uint32_t EffectiveOptimizerThreads(const DaemonConfig& config,
                                   uint32_t online_cores);

// store.gate_unit, or (0) four stripe rows over all SSDs, at least 8 MiB:
// every SSD's queue stays busy through one part of a transfer.
uint64_t GateUnitBytes(const DaemonConfig& config);

}  // namespace lohan

#endif  // LOHAN_DAEMON_CONFIG_CONFIG_H_
