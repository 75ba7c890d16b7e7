#ifndef LOHAN_DAEMON_STORE_EXTENT_ALLOCATOR_H_
#define LOHAN_DAEMON_STORE_EXTENT_ALLOCATOR_H_

#include <cstdint>
#include <map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lohan {

// Free space of one device: first-fit over a map of free runs, coalesced on
// free. Offsets and lengths are multiples of `alignment`.
// Not thread-safe: the owner (SsdArray) serializes calls.
class ExtentAllocator {
 public:
  // REQUIRES: capacity and alignment > 0, capacity a multiple of alignment.
  ExtentAllocator(uint64_t capacity, uint64_t alignment);

  // Returns the offset of `length` contiguous free bytes, now used.
  // RESOURCE_EXHAUSTED when no free run is long enough.
  // REQUIRES: length > 0 and a multiple of alignment.
  absl::StatusOr<uint64_t> Allocate(uint64_t length);

  // Marks [offset, offset + length) used (catalog replay). DATA_LOSS if any
  // of it is already used or past the capacity (a corrupt catalog).
  absl::Status Reserve(uint64_t offset, uint64_t length);

  // Returns a run from Allocate or Reserve.
  // REQUIRES: the run is currently used (checked: a double free aborts).
  void Free(uint64_t offset, uint64_t length);

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return capacity_ - free_bytes_; }
  uint64_t largest_free_run() const;

 private:
  const uint64_t capacity_;
  const uint64_t alignment_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, disjoint, coalesced
  uint64_t free_bytes_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_EXTENT_ALLOCATOR_H_
