#include "daemon/sched/buffer_pool.h"

#include "daemon/common/check.h"

namespace lohan {

BufferPool::BufferPool(size_t count, size_t bytes, size_t alignment)
    : bytes_(bytes), free_(count) {
  LOHAN_CHECK(count > 0);
  buffers_.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    buffers_.emplace_back(bytes, alignment);
    LOHAN_CHECK(free_.Push(buffers_.back().data()));
  }
}

uint8_t* BufferPool::Acquire() {
  std::optional<uint8_t*> buffer = free_.Pop();
  return buffer.has_value() ? *buffer : nullptr;
}

void BufferPool::Release(uint8_t* buffer) { free_.Push(buffer); }

void BufferPool::Close() { free_.Close(); }

}  // namespace lohan
