#ifndef LOHAN_DAEMON_PROFILE_HOST_PROFILE_H_
#define LOHAN_DAEMON_PROFILE_HOST_PROFILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/optim/adam.h"
#include "proto/lohan.pb.h"

namespace lohan {

struct ProfileOptions {
  std::vector<std::string> ssd_paths;
  uint32_t block_size = 4096;
  uint32_t queue_depth = 32;
  bool allow_buffered_io = false;
  // Bytes written then read on each SSD (a probe file beside its data file,
  // removed after): an untimed write, then the median of three write and
  // read passes each. 0: the SSDs are not measured.
  uint64_t probe_bytes = uint64_t{256} << 20;
  // The optimizer as lohand runs it: its kernels, measured on one thread,
  // and its thread count.
  const AdamUpdater* updater = nullptr;
  uint32_t optimizer_threads = 1;
};

// What the measurement is for: a profile with another key is stale.
std::string ProfileKey(const ProfileOptions& options);

// Measures the SSDs (each alone, then all at once), memcpy and the
// optimizer. RESOURCE_EXHAUSTED naming the path when an SSD has no room for
// the probe; the store's own data files are never touched.
absl::StatusOr<v1::HostProfile> MeasureHost(const ProfileOptions& options);

// The profile cached in `state_dir` if its key matches and `remeasure` is
// false; else measures and caches it (a failure to cache is logged, not
// fatal). `*measured` says which. Either way a probe file left on an SSD
// path by a daemon killed while measuring is removed.
absl::StatusOr<v1::HostProfile> LoadOrMeasureHost(const std::string& state_dir,
                                                  const ProfileOptions& options,
                                                  bool remeasure,
                                                  bool* measured);

// Measures (or loads) the profile on a thread of its own, so the daemon
// serves while it runs (a few seconds per SSD), and holds the result.
// The destructor waits for a measurement under way.
class HostProfiler {
 public:
  // REQUIRES: options.updater outlives the profiler.
  HostProfiler(std::string state_dir, ProfileOptions options, bool remeasure);
  HostProfiler(const HostProfiler&) = delete;
  HostProfiler& operator=(const HostProfiler&) = delete;
  ~HostProfiler();

  // Nullopt while measuring, or when it failed (logged once).
  std::optional<v1::HostProfile> Get() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until the measurement is over (for tests and --check-config).
  void Wait() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<v1::HostProfile> profile_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_PROFILE_HOST_PROFILE_H_
