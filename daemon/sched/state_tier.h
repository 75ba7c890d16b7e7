#ifndef LOHAN_DAEMON_SCHED_STATE_TIER_H_
#define LOHAN_DAEMON_SCHED_STATE_TIER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/sched/memory_shares.h"

namespace lohan {

// The daemon's host memory for optimizer states (lohand's [pool]
// state_tier), divided among jobs by MemoryShares, and what keeps it from
// taking memory the machine no longer has.
struct StateTierMemory {
  MemoryShares* shares = nullptr;  // null: no tier
  // A new copy is made only while the machine's MemAvailable stays at
  // least this much after it (0: no floor): under memory pressure the
  // chunk's state simply stays on the SSDs.
  uint64_t keep_available_bytes = 0;
  // The most the job's group (its owner's jobs) may hold in the tier: the
  // owner's [quotas] state_tier (0: no limit of its own).
  uint64_t group_limit_bytes = 0;
  // The machine's available memory now; null: MemAvailable from
  // /proc/meminfo (tests give a reading of their own).
  std::function<uint64_t()> available_bytes;
};

// One job's state tier: host-memory copies of the committed optimizer state
// (fp32 master and moments) of the chunks placed in RAM, so that their
// update reads the state from memory instead of the SSDs.
//
// Write-through: every version the pipeline writes still goes to the store,
// which stays the durable truth; a copy stands in for a read only while it
// equals the store's committed version. Each chunk's copy is one of: none,
// the committed version, or the pending version just written (which the
// store's commit makes committed and a rollback invalid).
//
// Placement: the longest prefix of chunks in forward order (layer 0 first)
// whose states fit the job's share. Every resident chunk saves the same
// bytes, wherever it is; the first ones are those the next forward needs
// first, and their updates after the gradient norm (which run in forward
// order) then need no read, while the spilled tail's reads overlap with the
// resident layers' updates and the next forward.
//
// Thread-safe: the pipeline's read and write stages and its control calls
// use it at once.
class StateTier {
 public:
  // `chunk_bytes`: each chunk's state bytes, by flat index in forward
  // order. The job joins `memory.shares` (if any) in `group` with `weight`.
  StateTier(std::string job, std::vector<uint64_t> chunk_bytes,
            const StateTierMemory& memory, absl::string_view group,
            double weight);
  StateTier(const StateTier&) = delete;
  StateTier& operator=(const StateTier&) = delete;
  // Frees every copy and leaves the shares.
  ~StateTier();

  bool enabled() const { return memory_.shares != nullptr; }

  // At an iteration's start: places the prefix that fits the job's share
  // now, and frees the copies beyond it (another job joined); while the
  // machine's MemAvailable is below the floor, frees copies from the end
  // of the prefix too.
  void Place() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether chunk `flat` has a copy of its committed version.
  bool HoldsCommitted(size_t flat) const ABSL_LOCKS_EXCLUDED(mu_);
  // Copies the first dest.size() bytes (at most its state's) of chunk
  // `flat`'s committed version into `dest` and returns true, or returns
  // false (no such copy: read the store). `or_pending`: the pending copy
  // does too (an iteration settling, the chunk's update done: its new
  // version, pending or committed by now).
  bool ReadCommitted(size_t flat, absl::Span<uint8_t> dest,
                     bool or_pending = false) ABSL_LOCKS_EXCLUDED(mu_);
  // The chunk's state just written to the store as its pending version:
  // kept when the chunk is placed and memory is had; any older copy of the
  // chunk is void either way (an empty `state`: the write failed).
  void KeepPending(size_t flat, absl::Span<const uint8_t> state)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The store committed the job's pending versions: their copies become
  // the committed ones.
  void CommitPending() ABSL_LOCKS_EXCLUDED(mu_);
  // The store rolled the pending versions back: their copies are void.
  void DropPending() ABSL_LOCKS_EXCLUDED(mu_);
  // Chunks [first, first + count) were committed outside the passes (new
  // weights, a restored moment): their copies are void.
  void Invalidate(size_t first, size_t count) ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    uint64_t bytes_held = 0;       // memory the copies take
    uint64_t committed_bytes = 0;  // of which copies of committed states
    size_t placed_chunks = 0;      // the prefix placed at the last Place
    size_t chunks = 0;
    uint64_t state_bytes = 0;  // every chunk's state
    uint64_t share_bytes = 0;  // the job's share of the tier now
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Region;
  enum class Copy : uint8_t { kNone, kCommitted, kPending };
  struct Slot {
    std::unique_ptr<Region> region;
    Copy copy = Copy::kNone;
  };
  // Frees slot `flat`'s memory and gives it back to the shares.
  void FreeLocked(size_t flat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Memory for slot `flat`, within the job's share and the machine's
  // floor; false when there is none (the chunk stays on the SSDs).
  bool AllocateLocked(size_t flat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether MemAvailable is below keep_available_bytes + `more`.
  bool ShortOfMemory(uint64_t more) const;

  const std::string job_;
  const std::vector<uint64_t> chunk_bytes_;
  const StateTierMemory memory_;
  mutable absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  size_t placed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_STATE_TIER_H_
