#ifndef LOHAN_DAEMON_SESSION_JOB_SESSION_H_
#define LOHAN_DAEMON_SESSION_JOB_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/ipc/arena_grant.h"
#include "daemon/pool/host_pool.h"
#include "daemon/pool/slot_allocator.h"

namespace lohan {

// One job's data plane while its process is connected: the job's arena from
// the host pool (shared memory, locked in RAM), its slot allocator, and the
// submission and completion rings formatted in two control slots of it.
// Destroying the session returns the arena's bytes to the pool.
class JobSession {
 public:
  // Ring capacity in entries, each way.
  static constexpr uint32_t kRingCapacity = 1024;

  // RESOURCE_EXHAUSTED when the pool cannot hold `arena_bytes` (rounded up
  // to 4 KiB) or the arena is too small for the rings; ALREADY_EXISTS while
  // the job has an arena. REQUIRES: `pool` outlives the session.
  static absl::StatusOr<std::unique_ptr<JobSession>> Create(
      HostPool* pool, const std::string& job_id, uint64_t arena_bytes);

  JobSession(const JobSession&) = delete;
  JobSession& operator=(const JobSession&) = delete;

  const std::string& job_id() const { return arena_->job_id(); }
  // What the client needs to map the arena and find the rings.
  const ArenaGrant& grant() const { return grant_; }
  // The arena's memfd, to pass to the client (the session keeps owning it).
  int arena_fd() const { return arena_->arena().fd(); }
  SlotAllocator& slots() { return *slots_; }

 private:
  JobSession(std::unique_ptr<PooledArena> arena,
             std::unique_ptr<SlotAllocator> slots, ArenaGrant grant);

  std::unique_ptr<PooledArena> arena_;
  std::unique_ptr<SlotAllocator> slots_;
  const ArenaGrant grant_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SESSION_JOB_SESSION_H_
