#include "daemon/sched/weight_handoff.h"

#include <cstring>
#include <utility>

namespace lohan {
namespace {

constexpr size_t kSlotAlignment = 4096;

}  // namespace

WeightHandoff::WeightHandoff(size_t slots, uint64_t slot_bytes)
    : slots_(slot_bytes > 0 ? slots : 0), slot_bytes_(slot_bytes) {}

bool WeightHandoff::Keep(size_t flat, absl::Span<const uint8_t> weights) {
  AlignedBuffer slot;
  bool allocate = false;
  uint64_t generation;
  {
    absl::MutexLock lock(&mu_);
    generation = generation_;
    // What was kept for the chunk is an older version now: its slot takes
    // the new one, or is freed.
    if (auto old = kept_.find(flat); old != kept_.end()) {
      slot = std::move(old->second.buffer);
      kept_.erase(old);
    }
    const bool fits = weights.size() <= slot_bytes_;
    if (!fits) {
      if (slot.size() > 0) spare_.push_back(std::move(slot));
      return false;
    }
    if (slot.size() == 0) {
      if (!spare_.empty()) {
        slot = std::move(spare_.back());
        spare_.pop_back();
      } else if (allocated_ < slots_) {
        ++allocated_;
        allocate = true;
      } else {
        // Full: the chunk fetched last gives way to one fetched before it.
        auto last = kept_.end();
        for (auto it = kept_.begin(); it != kept_.end(); ++it) {
          if (last == kept_.end() || it->first > last->first) last = it;
        }
        if (last == kept_.end() || last->first < flat) return false;
        slot = std::move(last->second.buffer);
        kept_.erase(last);
      }
    }
  }
  // Allocating (first touch) and copying run outside the lock, beside
  // fetches of other chunks.
  if (allocate) {
    slot = AlignedBuffer(slot_bytes_, kSlotAlignment,
                         AlignedBuffer::Pages::kSmall);
  }
  std::memcpy(slot.data(), weights.data(), weights.size());
  absl::MutexLock lock(&mu_);
  if (generation != generation_) {
    spare_.push_back(std::move(slot));
    return false;
  }
  Kept& kept = kept_[flat];
  if (kept.buffer.size() > 0) spare_.push_back(std::move(kept.buffer));
  kept.buffer = std::move(slot);
  kept.bytes = weights.size();
  return true;
}

bool WeightHandoff::Take(size_t flat, absl::Span<uint8_t> out,
                         uint64_t generation) {
  AlignedBuffer slot;
  {
    absl::MutexLock lock(&mu_);
    if (generation != generation_) return false;
    auto kept = kept_.find(flat);
    if (kept == kept_.end() || kept->second.bytes != out.size()) return false;
    slot = std::move(kept->second.buffer);
    kept_.erase(kept);
  }
  std::memcpy(out.data(), slot.data(), out.size());
  absl::MutexLock lock(&mu_);
  spare_.push_back(std::move(slot));
  return true;
}

void WeightHandoff::Drop(size_t flat) {
  absl::MutexLock lock(&mu_);
  auto kept = kept_.find(flat);
  if (kept == kept_.end()) return;
  spare_.push_back(std::move(kept->second.buffer));
  kept_.erase(kept);
}

void WeightHandoff::Clear() {
  absl::MutexLock lock(&mu_);
  for (auto& [flat, kept] : kept_) spare_.push_back(std::move(kept.buffer));
  kept_.clear();
  ++generation_;
}

uint64_t WeightHandoff::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

size_t WeightHandoff::chunks_kept() const {
  absl::MutexLock lock(&mu_);
  return kept_.size();
}

uint64_t WeightHandoff::bytes_allocated() const {
  absl::MutexLock lock(&mu_);
  return allocated_ * slot_bytes_;
}

}  // namespace lohan
