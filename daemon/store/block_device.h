#ifndef LOHAN_DAEMON_STORE_BLOCK_DEVICE_H_
#define LOHAN_DAEMON_STORE_BLOCK_DEVICE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"

namespace lohan {

// The outcome of one I/O. `status` is OK only when all `requested` bytes moved.
// A short transfer is DATA_LOSS with `transferred` < `requested`; the residual
// is `requested - transferred`. An errno from the kernel (EIO, ENOSPC...) goes
// through ErrnoToStatus and names the device path and offset.
struct IoResult {
  absl::Status status;
  uint64_t requested = 0;
  uint64_t transferred = 0;
  uint64_t residual() const { return requested - transferred; }
};

// One read or write of `length` bytes at byte `offset` of the device.
// REQUIRES: `buffer`, `offset` and `length` are multiples of the device's
// block_size(); `buffer` stays valid (and, for reads, untouched by the caller)
// until `done` runs.
struct IoRequest {
  enum class Op { kRead, kWrite };
  Op op = Op::kRead;
  void* buffer = nullptr;
  uint64_t length = 0;
  uint64_t offset = 0;
  // Required. Runs exactly once: on the device's completion thread (or, for
  // a request refused at Submit, on the caller's thread before Submit
  // returns). Keep it short and never block in it. It may Submit to the
  // same device (that never blocks): a completion-driven pipeline keeps
  // the queue full with no thread hop.
  std::function<void(const IoResult&)> done;
};

// The seam between the store and the storage: one SSD (a preallocated file or
// a block device). Implementations: AioBlockDevice (libaio, O_DIRECT) and
// FaultInjectionDevice (wraps another device, for tests).
// Thread-safe: any thread may call any method.
class BlockDevice {
 public:
  virtual ~BlockDevice() = default;

  // The path given at open, for error messages and stats.
  virtual const std::string& path() const = 0;
  // Usable bytes, a multiple of block_size().
  virtual uint64_t capacity() const = 0;
  // Alignment of buffers, offsets and lengths (the O_DIRECT unit).
  virtual uint32_t block_size() const = 0;

  // Queues one request. May block while the device's bounded queue is full
  // (this is how a producer is paced to the device), except when called
  // from a done callback of the same device; never fails by itself:
  // invalid requests complete with an error through `done`.
  virtual void Submit(IoRequest request) = 0;

  // Makes every write completed so far durable (fdatasync).
  virtual absl::Status Flush() = 0;
};

// Submits one request and waits for it. Convenience for tests and slow paths.
IoResult SubmitAndWait(BlockDevice& device, IoRequest::Op op, void* buffer,
                       uint64_t length, uint64_t offset);

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_BLOCK_DEVICE_H_
