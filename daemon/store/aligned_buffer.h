#ifndef LOHAN_DAEMON_STORE_ALIGNED_BUFFER_H_
#define LOHAN_DAEMON_STORE_ALIGNED_BUFFER_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "daemon/common/check.h"

namespace lohan {

// Owns `size` bytes aligned to `alignment` (a power of two, >= sizeof(void*)),
// as O_DIRECT needs. Zero-filled on allocation. Move-only.
//
// A buffer of kHugePageBytes or more starts on a huge-page boundary and is
// advised to the kernel as huge pages (MADV_HUGEPAGE; transparent huge pages
// in "madvise" mode, the common default, honour it): the optimizer streams
// such buffers and with 4 KiB pages spends up to a tenth of its time on
// TLB misses and on prefetches stopped at page boundaries
// (docs/benchmarks-optim.md). Where the kernel has no huge page to give,
// the advice is a no-op.
class AlignedBuffer {
 public:
  static constexpr size_t kHugePageBytes = size_t{2} << 20;

  AlignedBuffer() = default;
  AlignedBuffer(size_t size, size_t alignment) : size_(size) {
    LOHAN_CHECK((alignment & (alignment - 1)) == 0);
    if (size == 0) return;
    const bool huge = size >= kHugePageBytes;
    if (huge && alignment < kHugePageBytes) alignment = kHugePageBytes;
    void* p = nullptr;
    LOHAN_CHECK(::posix_memalign(&p, alignment, size) == 0);
    if (huge) (void)::madvise(p, size, MADV_HUGEPAGE);
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
