#ifndef LOHAN_DAEMON_STORE_FAULT_STORE_H_
#define LOHAN_DAEMON_STORE_FAULT_STORE_H_

// For tests above the store: a real TensorStore whose every SSD is a real
// AioBlockDevice wrapped in a FaultInjectionDevice, so a test can slow,
// fail or power-cut its I/O.

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/store/fault_injection_device.h"
#include "daemon/store/tensor_store.h"

namespace lohan {
namespace testing_util {

// Opens the store of `options`; `faults` (cleared first) gets the wrappers,
// in ssd_paths order, owned by the store.
absl::StatusOr<std::unique_ptr<TensorStore>> OpenStoreWithFaults(
    const StoreOptions& options, std::vector<FaultInjectionDevice*>* faults);

}  // namespace testing_util
}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_FAULT_STORE_H_
