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
//
// A buffer made while a job runs, that a transfer waits for, is made with
// Pages::kSmall instead: where free memory is fragmented (a page cache
// full of a dataset, say), the kernel's "madvise" defrag mode compacts
// memory to fault each huge page in, and 64 MiB took 0.6-0.9 s that way
// on the development VM, against 30-80 ms without the advice.
class AlignedBuffer {
 public:
  static constexpr size_t kHugePageBytes = size_t{2} << 20;

  enum class Pages { kHugeWhereLarge, kSmall };

  AlignedBuffer() = default;
  AlignedBuffer(size_t size, size_t alignment,
                Pages pages = Pages::kHugeWhereLarge)
      : size_(size) {
    LOHAN_CHECK((alignment & (alignment - 1)) == 0);
    if (size == 0) return;
    const bool huge = pages == Pages::kHugeWhereLarge && size >= kHugePageBytes;
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
