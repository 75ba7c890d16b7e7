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
// A budget may count a job's versions in accounts of its own, named from
// the tensor's name (AccountOf: the daemon counts swapped activations apart
// from a job's optimizer states); the store keeps each version's account
// and gives it back with the bytes.
//
// Implementations must be thread-safe and must not call into the store.
class SpaceBudget {
 public:
  virtual ~SpaceBudget() = default;

  // The account of tensor `name`'s versions (0 unless the budget tells
  // tensors apart).
  virtual uint8_t AccountOf(absl::string_view name) const { return 0; }
  // Counts `bytes` more for `job` in `account`, or refuses
  // (RESOURCE_EXHAUSTED, with the numbers) and counts nothing.
  virtual absl::Status Reserve(absl::string_view job, uint8_t account,
                               uint64_t bytes) = 0;
  // Counts `bytes` the job holds already (versions found when the budget is
  // attached); never refused.
  virtual void Charge(absl::string_view job, uint8_t account,
                      uint64_t bytes) = 0;
  // Returns what Reserve or Charge counted.
  virtual void Release(absl::string_view job, uint8_t account,
                       uint64_t bytes) = 0;
  // The store's own refusal of a version the budget allowed (no SSD has
  // room for it: block rounding, fragmentation), with what the budget
  // adds for the job's owner; `refusal` itself by default.
  virtual absl::Status NoRoom(absl::string_view job, absl::Status refusal) {
    return refusal;
  }
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_SPACE_BUDGET_H_
