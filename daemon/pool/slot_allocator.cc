#include "daemon/pool/slot_allocator.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "daemon/common/check.h"

namespace lohan {

absl::string_view SlotKindName(SlotKind kind) {
  switch (kind) {
    case SlotKind::kGradient:
      return "gradient";
    case SlotKind::kWeight:
      return "weight";
    case SlotKind::kActivation:
      return "activation";
    case SlotKind::kControl:
      return "control";
  }
  return "unknown";
}

SlotAllocator::SlotAllocator(uint64_t arena_bytes, uint64_t alignment)
    : arena_bytes_(arena_bytes), alignment_(alignment) {
  LOHAN_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0);
  LOHAN_CHECK(arena_bytes % alignment == 0);
  if (arena_bytes > 0) free_[0] = arena_bytes;
}

absl::StatusOr<Slot> SlotAllocator::Allocate(uint64_t bytes, SlotKind kind) {
  if (bytes == 0) return absl::InvalidArgumentError("slot of 0 bytes");
  if (bytes > arena_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "slot of ", bytes, " bytes exceeds the ", arena_bytes_, " byte arena"));
  }
  const uint64_t length = (bytes + alignment_ - 1) & ~(alignment_ - 1);
  absl::MutexLock lock(&mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < length) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - length;
    free_.erase(it);
    if (rest > 0) free_[offset + length] = rest;
    Slot slot{offset, length, kind};
    live_[offset] = slot;
    used_bytes_ += length;
    return slot;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("no free block of ", length, " bytes for a ",
                   SlotKindName(kind), " slot: ", arena_bytes_ - used_bytes_,
                   " bytes free, largest block ", LargestFreeBlockLocked()));
}

absl::Status SlotAllocator::Free(uint64_t offset) {
  absl::MutexLock lock(&mu_);
  auto live = live_.find(offset);
  if (live == live_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no live slot starts at offset ", offset));
  }
  uint64_t start = offset;
  uint64_t length = live->second.length;
  used_bytes_ -= length;
  live_.erase(live);

  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + length == next->first) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = length;
  return absl::OkStatus();
}

absl::Status SlotAllocator::CheckRange(uint64_t offset, uint64_t length,
                                       SlotKind kind) const {
  if (length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("empty range at offset ", offset));
  }
  if (offset > UINT64_MAX - length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "range offset ", offset, " + length ", length, " overflows"));
  }
  if (offset + length > arena_bytes_) {
    return absl::OutOfRangeError(
        absl::StrCat("range [", offset, ", ", offset + length,
                     ") is beyond the ", arena_bytes_, " byte arena"));
  }
  absl::ReaderMutexLock lock(&mu_);
  auto it = live_.upper_bound(offset);
  if (it == live_.begin()) {
    return absl::NotFoundError(
        absl::StrCat("offset ", offset, " is not inside a live slot"));
  }
  const Slot& slot = std::prev(it)->second;
  if (offset + length > slot.offset + slot.length) {
    return absl::NotFoundError(absl::StrCat("range [", offset, ", ",
                                            offset + length,
                                            ") is not inside one live slot"));
  }
  if (slot.kind != kind) {
    return absl::FailedPreconditionError(absl::StrCat(
        "range at offset ", offset, " is in a ", SlotKindName(slot.kind),
        " slot, not a ", SlotKindName(kind), " slot"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Slot> SlotAllocator::FindSlot(uint64_t offset) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = live_.find(offset);
  if (it == live_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no live slot starts at offset ", offset));
  }
  return it->second;
}

uint64_t SlotAllocator::LargestFreeBlockLocked() const {
  uint64_t largest = 0;
  for (const auto& [offset, length] : free_)
    largest = std::max(largest, length);
  return largest;
}

SlotAllocator::Stats SlotAllocator::GetStats() const {
  absl::ReaderMutexLock lock(&mu_);
  Stats stats;
  stats.arena_bytes = arena_bytes_;
  stats.used_bytes = used_bytes_;
  stats.free_bytes = arena_bytes_ - used_bytes_;
  stats.largest_free_block = LargestFreeBlockLocked();
  stats.live_slots = live_.size();
  stats.free_blocks = free_.size();
  return stats;
}

}  // namespace lohan
