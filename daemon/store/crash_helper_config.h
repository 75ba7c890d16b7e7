#ifndef LOHAN_DAEMON_STORE_CRASH_HELPER_CONFIG_H_
#define LOHAN_DAEMON_STORE_CRASH_HELPER_CONFIG_H_

// What crash_helper and tensor_store_crash_test agree on (test only).

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/store/tensor_store.h"

namespace lohan {

inline constexpr char kCrashJob[] = "crashjob";

inline const std::vector<uint64_t>& CrashTensorSizes() {
  static const std::vector<uint64_t> sizes = {1, 70001, 3 * 65536 + 5, 333333};
  return sizes;
}

inline std::string CrashTensorName(size_t t) {
  return "tensor" + std::to_string(t);
}

inline uint64_t CrashSeed(size_t t, uint64_t version) {
  return t * 1000003 + version;
}

// ssd_paths are appended by the caller.
inline StoreOptions CrashStoreOptions(const std::string& state_dir) {
  StoreOptions o;
  o.state_dir = state_dir;
  o.stripe_unit = 65536;
  o.queue_depth = 8;
  o.device_capacity_bytes = 16 << 20;
  // Small, so that kills also land during online catalog compactions.
  o.catalog_compact_bytes = 4 << 10;
  return o;
}

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_CRASH_HELPER_CONFIG_H_
