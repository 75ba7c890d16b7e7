#ifndef LOHAN_DAEMON_POOL_SLOT_ALLOCATOR_H_
#define LOHAN_DAEMON_POOL_SLOT_ALLOCATOR_H_

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace lohan {

// What a slot holds. Recorded so the entry validator can refuse, say, a
// gradient delivered into an activation slot.
enum class SlotKind : uint8_t {
  kGradient = 0,
  kWeight = 1,
  kActivation = 2,
  kControl = 3,  // rings, staging, error text
};
absl::string_view SlotKindName(SlotKind kind);

// A byte range of an arena: [offset, offset + length).
struct Slot {
  uint64_t offset = 0;
  uint64_t length = 0;
  SlotKind kind = SlotKind::kControl;

  bool operator==(const Slot&) const = default;
};

// Carves an arena of `arena_bytes` into slots whose offsets and lengths are
// multiples of `alignment` (4 KiB by default: what O_DIRECT and DMA want).
// First fit over an address-ordered free list; a freed slot is merged with
// free neighbours, so freeing everything always gives back one free block.
// Knows nothing about the memory itself: offsets only.
// Thread-safe: all methods may be called concurrently.
class SlotAllocator {
 public:
  static constexpr uint64_t kDefaultAlignment = 4096;

  // REQUIRES: alignment is a power of two; arena_bytes is a multiple of it.
  // (Our own invariant: checked with LOHAN_CHECK.)
  explicit SlotAllocator(uint64_t arena_bytes,
                         uint64_t alignment = kDefaultAlignment);
  SlotAllocator(const SlotAllocator&) = delete;
  SlotAllocator& operator=(const SlotAllocator&) = delete;

  // A slot of at least `bytes` (rounded up to the alignment; the returned
  // length is the rounded one). INVALID_ARGUMENT for 0 bytes;
  // RESOURCE_EXHAUSTED (with free and largest free block) when no free block
  // is large enough.
  absl::StatusOr<Slot> Allocate(uint64_t bytes, SlotKind kind);

  // Frees the live slot starting at `offset`. NOT_FOUND when no live slot
  // starts there (double free, or a made-up offset).
  absl::Status Free(uint64_t offset);

  // OK when [offset, offset + length) lies inside one live slot of `kind`;
  // otherwise INVALID_ARGUMENT (length 0 or offset + length overflows),
  // OUT_OF_RANGE (beyond the arena) or NOT_FOUND / FAILED_PRECONDITION (not
  // inside a live slot / slot of another kind), each with a message.
  // Safe on any untrusted input.
  absl::Status CheckRange(uint64_t offset, uint64_t length,
                          SlotKind kind) const;

  // The live slot starting exactly at `offset`, NOT_FOUND otherwise.
  absl::StatusOr<Slot> FindSlot(uint64_t offset) const;

  struct Stats {
    uint64_t arena_bytes = 0;
    uint64_t used_bytes = 0;
    uint64_t free_bytes = 0;
    uint64_t largest_free_block = 0;
    uint64_t live_slots = 0;
    uint64_t free_blocks = 0;
  };
  Stats GetStats() const;

  uint64_t arena_bytes() const { return arena_bytes_; }
  uint64_t alignment() const { return alignment_; }

 private:
  uint64_t LargestFreeBlockLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const uint64_t arena_bytes_;
  const uint64_t alignment_;

  mutable absl::Mutex mu_;
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> len
  std::map<uint64_t, Slot> live_ ABSL_GUARDED_BY(mu_);      // by offset
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_POOL_SLOT_ALLOCATOR_H_
