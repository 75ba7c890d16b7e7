#ifndef LOHAN_DAEMON_SCHED_BUFFER_POOL_H_
#define LOHAN_DAEMON_SCHED_BUFFER_POOL_H_

// A fixed set of equal, aligned chunk buffers: the whole host memory a job's
// update pipeline has in flight, whatever the layer sizes.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "daemon/sched/bounded_queue.h"
#include "daemon/store/aligned_buffer.h"

namespace lohan {

// Thread-safe. Owns its buffers; a buffer handed out stays valid until the
// pool is destroyed.
class BufferPool {
 public:
  // `count` (> 0) buffers of `bytes` each, aligned to `alignment` (a power
  // of two), zero-filled. Allocation failure aborts (as operator new).
  BufferPool(size_t count, size_t bytes, size_t alignment);
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  // REQUIRES: every acquired buffer released, or nobody uses them any more.
  ~BufferPool() = default;

  // Waits for a free buffer; null once Close() was called.
  uint8_t* Acquire();
  // REQUIRES: `buffer` came from Acquire and is not released yet.
  void Release(uint8_t* buffer);
  // Wakes waiters; every later Acquire returns null.
  void Close();

  size_t count() const { return buffers_.size(); }
  size_t buffer_bytes() const { return bytes_; }

 private:
  const size_t bytes_;
  std::vector<AlignedBuffer> buffers_;  // Constant after construction.
  BoundedQueue<uint8_t*> free_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_BUFFER_POOL_H_
