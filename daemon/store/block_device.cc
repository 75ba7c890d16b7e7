#include "daemon/store/block_device.h"

#include "absl/synchronization/notification.h"

namespace lohan {

IoResult SubmitAndWait(BlockDevice& device, IoRequest::Op op, void* buffer,
                       uint64_t length, uint64_t offset) {
  IoResult result;
  absl::Notification finished;
  IoRequest request;
  request.op = op;
  request.buffer = buffer;
  request.length = length;
  request.offset = offset;
  request.done = [&result, &finished](const IoResult& r) {
    result = r;
    finished.Notify();
  };
  device.Submit(std::move(request));
  finished.WaitForNotification();
  return result;
}

}  // namespace lohan
