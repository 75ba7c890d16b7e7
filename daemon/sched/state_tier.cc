#include "daemon/sched/state_tier.h"

#include <cstring>
#include <utility>

#include "daemon/common/check.h"
#include "daemon/common/meminfo.h"

namespace lohan {

StateTier::StateTier(std::string job, std::vector<uint64_t> chunk_bytes,
                     const StateTierMemory& memory, absl::string_view group,
                     double weight)
    : job_(std::move(job)),
      chunk_bytes_(std::move(chunk_bytes)),
      memory_(memory),
      slots_(chunk_bytes_.size()) {
  if (memory_.shares != nullptr) {
    memory_.shares->Join(job_, group, weight, memory_.group_limit_bytes);
  }
}

StateTier::~StateTier() {
  {
    absl::MutexLock lock(&mu_);
    slots_.clear();
  }
  if (memory_.shares != nullptr) memory_.shares->Leave(job_);
}

std::vector<size_t> StateTier::Place() {
  std::vector<size_t> to_store;
  if (!enabled()) return to_store;
  const uint64_t share = memory_.shares->ShareOf(job_);
  absl::MutexLock lock(&mu_);
  uint64_t fits = 0;
  size_t placed = 0;
  while (placed < chunk_bytes_.size() && fits + chunk_bytes_[placed] <= share) {
    fits += chunk_bytes_[placed++];
  }
  placed_ = placed;
  // A copy the store lacks is freed once stored (the caller's Release);
  // returns the bytes that will come back then.
  auto free_or_store = [&](size_t flat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Slot& slot = slots_[flat];
    if (slot.copy == Copy::kCommitted && !slot.stored) {
      to_store.push_back(flat);
      return chunk_bytes_[flat];
    }
    FreeLocked(flat);
    return uint64_t{0};
  };
  for (size_t flat = placed_; flat < slots_.size(); ++flat) {
    if (slots_[flat].region != nullptr) free_or_store(flat);
  }
  // Under memory pressure copies go back, from the end: dropping a stored
  // copy costs only its reads.
  if (memory_.keep_available_bytes == 0) return to_store;
  uint64_t coming = 0;
  for (size_t flat = placed_; flat-- > 0;) {
    if (slots_[flat].region == nullptr) continue;
    if (!memory_.ShortOf(0, coming)) break;
    coming += free_or_store(flat);
  }
  return to_store;
}

void StateTier::Release(size_t flat) {
  absl::MutexLock lock(&mu_);
  FreeLocked(flat);
}

bool StateTier::HoldsCommittedOnly(size_t flat) const {
  absl::MutexLock lock(&mu_);
  return slots_[flat].copy == Copy::kCommitted && !slots_[flat].stored;
}

std::vector<size_t> StateTier::CommittedOnly() const {
  absl::MutexLock lock(&mu_);
  std::vector<size_t> flats;
  for (size_t flat = 0; flat < slots_.size(); ++flat) {
    if (slots_[flat].copy == Copy::kCommitted && !slots_[flat].stored) {
      flats.push_back(flat);
    }
  }
  return flats;
}

void StateTier::MarkStored(size_t flat) {
  absl::MutexLock lock(&mu_);
  slots_[flat].stored = true;
}

bool StateTier::PendingOnly(size_t flat) const {
  absl::MutexLock lock(&mu_);
  return slots_[flat].copy == Copy::kPending && !slots_[flat].stored;
}

bool StateTier::HoldsCommitted(size_t flat) const {
  absl::MutexLock lock(&mu_);
  return slots_[flat].copy == Copy::kCommitted;
}

bool StateTier::ReadCommitted(size_t flat, absl::Span<uint8_t> dest,
                              bool or_pending) {
  absl::MutexLock lock(&mu_);
  Slot& slot = slots_[flat];
  if (slot.lent) return false;
  if (slot.copy != Copy::kCommitted &&
      !(or_pending && slot.copy == Copy::kPending)) {
    return false;
  }
  LOHAN_CHECK(dest.size() <= chunk_bytes_[flat]);
  std::memcpy(dest.data(), slot.region->data(), dest.size());
  return true;
}

uint8_t* StateTier::Lend(size_t flat) {
  if (!enabled() || !memory_.update_in_place) return nullptr;
  absl::MutexLock lock(&mu_);
  Slot& slot = slots_[flat];
  if (slot.copy != Copy::kCommitted || slot.lent) return nullptr;
  slot.replaced_only = !slot.stored;
  slot.copy = Copy::kPending;
  slot.stored = false;
  slot.lent = true;
  return slot.region->data();
}

bool StateTier::UseCommitted(
    size_t flat, absl::FunctionRef<void(absl::Span<const uint8_t>)> use) {
  uint8_t* data = nullptr;
  {
    absl::MutexLock lock(&mu_);
    Slot& slot = slots_[flat];
    if (slot.copy != Copy::kCommitted || slot.lent) return false;
    slot.lent = true;
    data = slot.region->data();
  }
  use(absl::MakeConstSpan(data, chunk_bytes_[flat]));
  absl::MutexLock lock(&mu_);
  slots_[flat].lent = false;
  return true;
}

void StateTier::GiveBack(size_t flat, bool stored) {
  absl::MutexLock lock(&mu_);
  Slot& slot = slots_[flat];
  LOHAN_CHECK(slot.lent);
  slot.lent = false;
  slot.stored = stored;
}

bool StateTier::KeepPending(size_t flat, absl::Span<const uint8_t> state,
                            bool stored) {
  if (!enabled()) return false;
  absl::MutexLock lock(&mu_);
  Slot& slot = slots_[flat];
  LOHAN_CHECK(!slot.lent);
  // A failed write changed nothing, the store's versions included.
  if (state.empty()) return false;
  const bool had_only = slot.copy == Copy::kCommitted && !slot.stored;
  // (A chunk with a copy has its memory: it is always kept below.)
  if (stored) slot.copy = Copy::kNone;
  // A chunk with a copy keeps it (its memory is had); another needs room.
  if (slot.region == nullptr && (flat >= placed_ || !AllocateLocked(flat))) {
    return false;
  }
  LOHAN_CHECK(state.size() == chunk_bytes_[flat]);
  std::memcpy(slot.region->data(), state.data(), state.size());
  slot.copy = Copy::kPending;
  slot.stored = stored;
  slot.replaced_only = had_only;
  return true;
}

void StateTier::CommitPending() {
  absl::MutexLock lock(&mu_);
  for (Slot& slot : slots_) {
    if (slot.copy == Copy::kPending) slot.copy = Copy::kCommitted;
    slot.replaced_only = false;
  }
}

bool StateTier::DropPending() {
  absl::MutexLock lock(&mu_);
  bool kept = true;
  for (Slot& slot : slots_) {
    if (slot.copy != Copy::kPending) continue;
    if (slot.replaced_only) kept = false;
    slot.copy = Copy::kNone;
    slot.stored = true;
    slot.replaced_only = false;
  }
  return kept;
}

void StateTier::Invalidate(size_t first, size_t count) {
  absl::MutexLock lock(&mu_);
  for (size_t flat = first; flat < first + count && flat < slots_.size();
       ++flat) {
    slots_[flat].copy = Copy::kNone;
    slots_[flat].stored = true;
  }
}

StateTier::Stats StateTier::stats() const {
  Stats stats;
  if (enabled()) stats.share_bytes = memory_.shares->ShareOf(job_);
  absl::MutexLock lock(&mu_);
  stats.placed_chunks = placed_;
  stats.chunks = slots_.size();
  for (size_t flat = 0; flat < slots_.size(); ++flat) {
    stats.state_bytes += chunk_bytes_[flat];
    if (flat < placed_) stats.placed_bytes += chunk_bytes_[flat];
    if (slots_[flat].region == nullptr) continue;
    stats.bytes_held += chunk_bytes_[flat];
    if (slots_[flat].copy == Copy::kCommitted) {
      stats.committed_bytes += chunk_bytes_[flat];
    }
  }
  return stats;
}

void StateTier::FreeLocked(size_t flat) {
  Slot& slot = slots_[flat];
  LOHAN_CHECK(!slot.lent);
  slot.copy = Copy::kNone;
  slot.stored = true;
  slot.replaced_only = false;
  if (slot.region == nullptr) return;
  slot.region.reset();
  memory_.shares->Give(job_, chunk_bytes_[flat]);
}

bool StateTierMemory::ShortOf(uint64_t more, uint64_t coming) const {
  if (keep_available_bytes == 0) return false;
  const uint64_t available =
      available_bytes ? available_bytes() : MemAvailableBytes();
  return available + coming < keep_available_bytes + more;
}

bool StateTier::AllocateLocked(size_t flat) {
  Slot& slot = slots_[flat];
  if (slot.region != nullptr) return true;
  const uint64_t bytes = chunk_bytes_[flat];
  if (memory_.ShortOf(bytes)) return false;
  if (!memory_.shares->TryTake(job_, bytes)) return false;
  slot.region = LockedRegion::Map(bytes);
  if (slot.region == nullptr) {
    memory_.shares->Give(job_, bytes);
    return false;
  }
  return true;
}

}  // namespace lohan
