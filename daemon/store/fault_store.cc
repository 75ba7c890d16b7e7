#include "daemon/store/fault_store.h"

#include <utility>

#include "daemon/store/aio_device.h"

namespace lohan {
namespace testing_util {

absl::StatusOr<std::unique_ptr<TensorStore>> OpenStoreWithFaults(
    const StoreOptions& options, std::vector<FaultInjectionDevice*>* faults) {
  faults->clear();
  std::vector<std::unique_ptr<BlockDevice>> devices;
  for (const std::string& path : options.ssd_paths) {
    absl::StatusOr<std::unique_ptr<AioBlockDevice>> aio = AioBlockDevice::Open(
        AioDeviceOptions{.path = path,
                         .capacity_bytes = options.device_capacity_bytes,
                         .queue_depth = options.queue_depth});
    if (!aio.ok()) return aio.status();
    auto wrapped = std::make_unique<FaultInjectionDevice>(*std::move(aio));
    faults->push_back(wrapped.get());
    devices.push_back(std::move(wrapped));
  }
  return TensorStore::OpenWithDevices(options, std::move(devices));
}

}  // namespace testing_util
}  // namespace lohan
