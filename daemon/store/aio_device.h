#ifndef LOHAN_DAEMON_STORE_AIO_DEVICE_H_
#define LOHAN_DAEMON_STORE_AIO_DEVICE_H_

#include <libaio.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/store/block_device.h"
#include "wire/unique_fd.h"

namespace lohan {

struct AioDeviceOptions {
  // A directory (the device is the file `<path>/lohan.data`, created and
  // preallocated with fallocate if missing), a block device, or a regular file.
  std::string path;
  // Bytes to use. 0: the existing file's or block device's size. A file
  // smaller than this is grown with fallocate (ENOSPC: RESOURCE_EXHAUSTED).
  uint64_t capacity_bytes = 0;
  // O_DIRECT unit: buffers, offsets and lengths are multiples of it.
  uint32_t block_size = 4096;
  // Most requests in flight in the kernel at once (the aio context's size).
  uint32_t queue_depth = 32;
  // Requests waiting for a free slot before Submit blocks; 0: 2 * queue_depth.
  uint32_t submit_queue_capacity = 0;
  // If the filesystem refuses O_DIRECT, fall back to buffered I/O (logged as
  // slower) instead of failing with FAILED_PRECONDITION.
  bool allow_buffered_io = false;
};

// A BlockDevice on libaio, staged like fio's libaio engine: Submit() queues a
// request in a bounded queue (blocking while it is full); one thread owns the
// aio context, moves queued requests into free slots (at most queue_depth in
// flight), submits them with batched io_submit (partial submission resubmits
// the rest; EAGAIN reaps completions first), reaps with io_getevents and runs
// each request's callback. An eventfd wakes the thread both for new requests
// and for completions. A done callback may Submit to the same device: that
// call never blocks, and the loop submits it right after the callbacks.
//
// Thread-safe. The destructor stops accepting requests, waits for every
// queued and in-flight request to complete (callbacks run), then joins the
// thread and closes the context and the file.
class AioBlockDevice final : public BlockDevice {
 public:
  // Opens (creating/preallocating if needed) the device. A filesystem that
  // refuses O_DIRECT is FAILED_PRECONDITION naming the path unless
  // options.allow_buffered_io.
  static absl::StatusOr<std::unique_ptr<AioBlockDevice>> Open(
      const AioDeviceOptions& options);
  // The file an SSD path stands for: `<path>/lohan.data` for a directory,
  // else the path itself (a block device or a regular file).
  static std::string DataFilePath(const std::string& ssd_path);

  AioBlockDevice(const AioBlockDevice&) = delete;
  AioBlockDevice& operator=(const AioBlockDevice&) = delete;
  ~AioBlockDevice() override;

  const std::string& path() const override { return path_; }
  uint64_t capacity() const override { return capacity_; }
  uint32_t block_size() const override { return block_size_; }
  void Submit(IoRequest request) override;
  absl::Status Flush() override;

  // False when running in the opt-in buffered mode.
  bool direct_io() const { return direct_io_; }
  // The file actually opened (`<dir>/lohan.data` for a directory).
  const std::string& file_path() const { return file_path_; }

 private:
  struct Slot;
  AioBlockDevice(std::string path, std::string file_path, UniqueFd fd,
                 UniqueFd event_fd, io_context_t context, uint64_t capacity,
                 const AioDeviceOptions& options, bool direct_io);
  void Run();

  // Constant after construction.
  const std::string path_;
  const std::string file_path_;
  const UniqueFd fd_;
  const UniqueFd event_fd_;
  const io_context_t context_;
  const uint64_t capacity_;
  const uint32_t block_size_;
  const uint32_t queue_depth_;
  const uint32_t queue_capacity_;
  const bool direct_io_;

  absl::Mutex mu_;
  std::deque<IoRequest> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::thread thread_;  // Owns context_'s submissions and completions.
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_AIO_DEVICE_H_
