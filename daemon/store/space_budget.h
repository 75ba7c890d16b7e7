#ifndef LOHAN_DAEMON_STORE_SPACE_BUDGET_H_
#define LOHAN_DAEMON_STORE_SPACE_BUDGET_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lohan {

// Who may place how many bytes on the SSDs: the store asks before it
// allocates a tensor version and tells when a version's space is free again
// (once no reader holds it). Bytes are SSD space
// (TensorStore::FootprintBytes: the tensor's size padded to the block size).
// The daemon's quotas implement it (daemon/quota); the store knows nothing of
// users or limits.
//
// Implementations must be thread-safe and must not call into the store.
class SpaceBudget {
 public:
  virtual ~SpaceBudget() = default;

  // Counts `bytes` more for `job`, or refuses (RESOURCE_EXHAUSTED, with the
  // numbers) and counts nothing.
  virtual absl::Status Reserve(absl::string_view job, uint64_t bytes) = 0;
  // Counts `bytes` the job holds already (versions found when the budget is
  // attached); never refused.
  virtual void Charge(absl::string_view job, uint64_t bytes) = 0;
  // Returns what Reserve or Charge counted.
  virtual void Release(absl::string_view job, uint64_t bytes) = 0;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_SPACE_BUDGET_H_
