#ifndef LOHAN_DAEMON_SCHED_MEMORY_SHARES_H_
#define LOHAN_DAEMON_SCHED_MEMORY_SHARES_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace lohan {

// Host memory that jobs take for a while and give back (the optimizer
// states read ahead of updates that wait for the gradient norm), shared by
// weight: `capacity` bytes split among the groups (users) that have joined
// flows (jobs), in proportion to their weights, a group's share split
// evenly among its flows. A flow takes only up to its share, so what one
// job holds never keeps another from its own; a lone job may take it all.
// Taking never waits: memory is asked for where doing without only costs
// time (the update reads its state itself). When a flow joins, the others'
// shares shrink at once; what they hold beyond them (Excess) is theirs to
// give back, which a pipeline does at the end of its iteration.
// A group may have a limit of its own (a user's quota): it never holds more,
// and what its weight would give it beyond that goes to the other groups
// (water-filling).
// Thread-safe.
class MemoryShares {
 public:
  explicit MemoryShares(uint64_t capacity) : capacity_(capacity) {}
  MemoryShares(const MemoryShares&) = delete;
  MemoryShares& operator=(const MemoryShares&) = delete;

  // `flow` takes part, in `group` (empty: a group of its own) weighed
  // `weight` (the group's; non-positive counts as 1), the group holding
  // at most `group_limit` bytes (0: no limit of its own; the group's first
  // flow sets both). Joining again changes nothing.
  void Join(absl::string_view flow, absl::string_view group, double weight,
            uint64_t group_limit = 0) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives back everything `flow` holds and takes it out of the shares.
  void Leave(absl::string_view flow) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `flow` (joined) may hold `bytes` more: true takes them.
  bool TryTake(absl::string_view flow, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // REQUIRES: `flow` holds at least `bytes`.
  void Give(absl::string_view flow, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // What `flow` holds beyond its share now (0 if within it, or unknown).
  uint64_t Excess(absl::string_view flow) const ABSL_LOCKS_EXCLUDED(mu_);
  // The flow's share now (0: not joined) and what it holds.
  uint64_t ShareOf(absl::string_view flow) const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t Held(absl::string_view flow) const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t capacity() const { return capacity_; }

 private:
  struct Flow {
    std::string group;
    uint64_t held = 0;
  };
  struct Group {
    double weight = 1.0;
    size_t flows = 0;
    uint64_t limit = 0;  // 0: none
  };
  // Each group's share of the capacity: by weight, a group's limit capping
  // it and what it leaves split among the others by weight.
  std::map<std::string, double, std::less<>> GroupSharesLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t ShareLocked(const Flow& flow) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t capacity_;
  mutable absl::Mutex mu_;
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  double total_weight_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Flow, std::less<>> flows_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Group, std::less<>> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_MEMORY_SHARES_H_
