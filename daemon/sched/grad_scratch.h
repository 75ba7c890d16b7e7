#ifndef LOHAN_DAEMON_SCHED_GRAD_SCRATCH_H_
#define LOHAN_DAEMON_SCHED_GRAD_SCRATCH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/sched/locked_region.h"
#include "daemon/sched/state_tier.h"

namespace lohan {

// Host memory for one job's streamed gradients (PipelineOptions::
// stream_gradients): a chunk's gradient kept here from SubmitGradients to
// the end of the iteration instead of being written to the SSDs and read
// back for its update (and again for a clip redo). The memory is the job's
// share of the state tier (StateTierMemory), what is left of it once the
// tier's states are placed: the states come first, since a state kept in
// RAM also keeps the next forward's weights near. Per byte of RAM a
// gradient saves more SSD traffic (4 bytes of an fp32 gradient save 8 a
// step; 12 of a state save 12 at commit interval 1, which writes it
// through), but the states' placement must not move with a job's layout.
//
// Regions are kept from one iteration to the next (mapping and locking
// them again each step would cost a pass over the memory) and given back
// by Fit, between iterations. Thread-safe; a region's memory is its
// caller's until the next Fit.
class GradScratch {
 public:
  // `chunk_bytes`: each chunk's gradient bytes, by flat index. Takes from
  // `memory.shares` as flow `job`, which the job's StateTier joins and
  // leaves: destroy this first. `enabled` false (or no tier): never holds
  // anything.
  GradScratch(std::string job, std::vector<uint64_t> chunk_bytes,
              const StateTierMemory& memory, bool enabled);
  GradScratch(const GradScratch&) = delete;
  GradScratch& operator=(const GradScratch&) = delete;
  ~GradScratch();

  bool enabled() const { return enabled_; }
  // Between iterations: from now on holds at most `room` bytes (the job's
  // share less what its placed states take), giving back regions from the
  // end; all of them while the machine is short of memory.
  void Fit(uint64_t room) ABSL_LOCKS_EXCLUDED(mu_);
  // Memory for chunk `flat`'s gradient (chunk_bytes[flat], page-aligned):
  // its region, mapped now if need be within the room and the machine's
  // floor; null when there is none (the store keeps the gradient).
  uint8_t* Take(size_t flat) ABSL_LOCKS_EXCLUDED(mu_);
  // Chunk `flat`'s region, or null.
  const uint8_t* Find(size_t flat) const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t bytes_held() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void FreeLocked(size_t flat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string job_;
  const std::vector<uint64_t> chunk_bytes_;
  const StateTierMemory memory_;
  const bool enabled_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<LockedRegion>> regions_ ABSL_GUARDED_BY(mu_);
  uint64_t room_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_GRAD_SCRATCH_H_
