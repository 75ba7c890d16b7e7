#ifndef LOHAN_DAEMON_SCHED_WEIGHT_HANDOFF_H_
#define LOHAN_DAEMON_SCHED_WEIGHT_HANDOFF_H_

// The new weights of chunks just updated, kept in host memory until the
// client fetches them, so that a fetch right after an update does not read
// back from the SSDs what was written to them a moment before. A bounded
// set of equal slots holding the chunks fetched first (the lowest flat
// indices: the next forward goes layer 0 first): once all are taken, a
// chunk fetched before the last one kept takes that one's slot, and any
// other is fetched from the store as before. Thread-safe: the write stage
// keeps, fetches take.
//
// Its owner keeps it true: a kept chunk's weights are that chunk's current
// version (Clear whenever a version kept here is rolled back or replaced
// other than through Keep).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/store/aligned_buffer.h"

namespace lohan {

class WeightHandoff {
 public:
  // At most `slots` chunks of at most `slot_bytes` each; 0 slots: off.
  WeightHandoff(size_t slots, uint64_t slot_bytes);
  WeightHandoff(const WeightHandoff&) = delete;
  WeightHandoff& operator=(const WeightHandoff&) = delete;

  // Keeps a copy of `weights` as chunk `flat`'s, replacing what was kept
  // for it. False, with nothing kept for `flat`, when every slot holds a
  // chunk fetched before it (or `weights` is larger than a slot, or Clear
  // ran meanwhile).
  bool Keep(size_t flat, absl::Span<const uint8_t> weights)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Copies chunk `flat`'s kept weights into `out` and frees their slot.
  // False, `out` untouched, when none are kept, they are not out's size,
  // or Clear ran since generation() returned `generation`.
  bool Take(size_t flat, absl::Span<uint8_t> out, uint64_t generation)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Bumped by each Clear.
  uint64_t generation() const ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets what is kept for chunk `flat`.
  void Drop(size_t flat) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets every kept chunk; the slots' memory stays for the next ones.
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);

  size_t chunks_kept() const ABSL_LOCKS_EXCLUDED(mu_);
  // The slots' memory allocated so far (they are allocated as first used).
  uint64_t bytes_allocated() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t capacity_bytes() const { return slots_ * slot_bytes_; }
  size_t slots() const { return slots_; }

 private:
  struct Kept {
    AlignedBuffer buffer;
    size_t bytes = 0;
  };
  const size_t slots_;
  const uint64_t slot_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, Kept> kept_ ABSL_GUARDED_BY(mu_);
  std::vector<AlignedBuffer> spare_ ABSL_GUARDED_BY(mu_);
  // Slots allocated: kept, spare, or being filled or emptied.
  size_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
  // Bumped by Clear, so that a Keep copying while it ran keeps nothing,
  // and a Take for an earlier generation takes nothing.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_WEIGHT_HANDOFF_H_
