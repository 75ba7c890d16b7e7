#ifndef LOHAN_DAEMON_SCHED_STATE_TIER_H_
#define LOHAN_DAEMON_SCHED_STATE_TIER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/sched/locked_region.h"
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
  // Updates of a chunk the tier holds run where its copy lives (the
  // optimizer reads and writes the tier's memory: StateTier::Lend). False:
  // each update copies the state into a chunk buffer and back (lohand's
  // [pool] state_tier_updates = "copy", kept to measure against).
  bool update_in_place = true;

  // Whether the machine's MemAvailable (and `coming` bytes that will be
  // freed) is below keep_available_bytes + `more`.
  bool ShortOf(uint64_t more, uint64_t coming = 0) const;
};

// One job's state tier: host-memory copies of the committed optimizer state
// (fp32 master and moments) of the chunks placed in RAM, so that their
// update reads the state from memory instead of the SSDs.
//
// Each chunk's copy is one of: none, the committed version, or the pending
// version just made (which the commit makes committed and a rollback
// void), and the store holds that same version too ("stored": written
// through) or not (the pipeline's commit interval: between durable
// commits, the versions of the chunks in RAM are not written; the store
// keeps an older one, which a restart finds). A copy stands in for a read
// whenever it holds the version asked for.
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
  uint64_t ChunkBytes(size_t flat) const { return chunk_bytes_[flat]; }

  // At an iteration's start: places the prefix that fits the job's share
  // now, and frees the copies beyond it (another job joined); while the
  // machine's MemAvailable is below the floor, frees copies from the end
  // of the prefix too. A copy the store does not hold is not freed: it is
  // returned (by flat index), for the caller to store and then Release.
  std::vector<size_t> Place() ABSL_LOCKS_EXCLUDED(mu_);
  // Frees chunk `flat`'s copy (stored by now).
  void Release(size_t flat) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether chunk `flat` has a copy of its committed version; of one the
  // store does not hold (its update must not begin before the iteration's
  // outcome is known: nothing could bring the version back).
  bool HoldsCommitted(size_t flat) const ABSL_LOCKS_EXCLUDED(mu_);
  bool HoldsCommittedOnly(size_t flat) const ABSL_LOCKS_EXCLUDED(mu_);
  // The chunks whose committed version only the tier holds.
  std::vector<size_t> CommittedOnly() const ABSL_LOCKS_EXCLUDED(mu_);
  // Chunk `flat`'s committed copy is now in the store too.
  void MarkStored(size_t flat) ABSL_LOCKS_EXCLUDED(mu_);
  // Copies the first dest.size() bytes (at most its state's) of chunk
  // `flat`'s committed version into `dest` and returns true, or returns
  // false (no such copy, or it is lent for its update: read the store).
  // `or_pending`: the pending copy does too (an iteration settling, the chunk's
  // update done: its new version, pending or committed by now).
  bool ReadCommitted(size_t flat, absl::Span<uint8_t> dest,
                     bool or_pending = false) ABSL_LOCKS_EXCLUDED(mu_);
  // The chunk's new state as its pending version, `stored` when the store
  // got it too (written through): kept when the chunk has a copy already
  // or is placed and memory is had; returns whether it was. With
  // `stored`, an older copy of a chunk not kept is void; without, a chunk
  // not kept has none (the caller then writes the state to the store and
  // calls again). An empty `state` (the write failed) changes nothing.
  bool KeepPending(size_t flat, absl::Span<const uint8_t> state,
                   bool stored = true) ABSL_LOCKS_EXCLUDED(mu_);
  // Lends chunk `flat`'s copy of its committed version for an update in
  // place (update_in_place): returns the copy's memory (ChunkBytes(flat)
  // bytes, page-aligned), which the caller alone may use until GiveBack.
  // From now on the copy counts as the chunk's pending version, not
  // stored: the committed version is only where the store has it (a
  // rollback voids the copy; DropPending says when the store did not have
  // it). Null, nothing lent: no committed copy, or updates copy.
  uint8_t* Lend(size_t flat) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `use` with chunk `flat`'s committed copy where it lives (no
  // copy of it; e.g. to write it to the store) and returns true, or returns
  // false without calling it when there is none or it is lent. The copy is
  // lent meanwhile: no one else reads or frees it.
  bool UseCommitted(size_t flat,
                    absl::FunctionRef<void(absl::Span<const uint8_t>)> use)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends Lend(flat): the copy holds the chunk's new state, `stored` when
  // the store got it too (written through). After a failed update or write
  // (`stored` false) the iteration must roll back, which voids the copy.
  void GiveBack(size_t flat, bool stored) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether chunk `flat`'s pending version is one the store lacks.
  bool PendingOnly(size_t flat) const ABSL_LOCKS_EXCLUDED(mu_);
  // The job's pending versions were committed: their copies become the
  // committed ones.
  void CommitPending() ABSL_LOCKS_EXCLUDED(mu_);
  // The pending versions were rolled back: their copies are void. Returns
  // false when one of them had replaced a committed version the store does
  // not hold: that version is lost (the job can only go back to what the
  // store holds).
  bool DropPending() ABSL_LOCKS_EXCLUDED(mu_);
  // Chunks [first, first + count) were committed outside the passes (new
  // weights, a restored moment): their copies are void.
  void Invalidate(size_t first, size_t count) ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    uint64_t bytes_held = 0;       // memory the copies take
    uint64_t committed_bytes = 0;  // of which copies of committed states
    size_t placed_chunks = 0;      // the prefix placed at the last Place
    uint64_t placed_bytes = 0;     // its states' bytes
    size_t chunks = 0;
    uint64_t state_bytes = 0;  // every chunk's state
    uint64_t share_bytes = 0;  // the job's share of the tier now
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class Copy : uint8_t { kNone, kCommitted, kPending };
  struct Slot {
    std::unique_ptr<LockedRegion> region;
    Copy copy = Copy::kNone;
    bool stored = true;  // the store holds the copy's version too
    // The pending copy replaced a committed one the store lacks.
    bool replaced_only = false;
    // Lent for an update in place: no one else reads or frees the memory.
    bool lent = false;
  };
  // Frees slot `flat`'s memory and gives it back to the shares.
  void FreeLocked(size_t flat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Memory for slot `flat`, within the job's share and the machine's
  // floor; false when there is none (the chunk stays on the SSDs).
  bool AllocateLocked(size_t flat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string job_;
  const std::vector<uint64_t> chunk_bytes_;
  const StateTierMemory memory_;
  mutable absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  size_t placed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_STATE_TIER_H_
