#ifndef LOHAN_DAEMON_SCHED_LOCKED_REGION_H_
#define LOHAN_DAEMON_SCHED_LOCKED_REGION_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace lohan {

// Host memory the daemon keeps for a job in RAM: an anonymous mapping,
// page-aligned, locked (swapped out, it would cost more than the SSD
// traffic it saves), huge pages advised (the optimizer streams it).
class LockedRegion {
 public:
  // Null when the memory cannot be mapped or locked.
  static std::unique_ptr<LockedRegion> Map(size_t bytes) {
    void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) return nullptr;
    (void)::madvise(data, bytes, MADV_HUGEPAGE);
    std::unique_ptr<LockedRegion> region(new LockedRegion(data, bytes));
    if (::mlock(data, bytes) != 0) return nullptr;
    return region;
  }
  LockedRegion(const LockedRegion&) = delete;
  LockedRegion& operator=(const LockedRegion&) = delete;
  ~LockedRegion() { ::munmap(data_, bytes_); }
  uint8_t* data() { return static_cast<uint8_t*>(data_); }
  size_t size() const { return bytes_; }

 private:
  LockedRegion(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* const data_;
  const size_t bytes_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_LOCKED_REGION_H_
