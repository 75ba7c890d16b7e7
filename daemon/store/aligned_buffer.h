#ifndef LOHAN_DAEMON_STORE_ALIGNED_BUFFER_H_
#define LOHAN_DAEMON_STORE_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "daemon/common/check.h"

namespace lohan {

// Owns `size` bytes aligned to `alignment` (a power of two, >= sizeof(void*)),
// as O_DIRECT needs. Zero-filled on allocation. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(size_t size, size_t alignment) : size_(size) {
    LOHAN_CHECK((alignment & (alignment - 1)) == 0);
    if (size == 0) return;
    void* p = nullptr;
    LOHAN_CHECK(::posix_memalign(&p, alignment, size) == 0);
    std::memset(p, 0, size);
    data_ = static_cast<uint8_t*>(p);
  }
  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    if (this != &other) {
      std::free(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data_); }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_ALIGNED_BUFFER_H_
