#ifndef LOHAN_DAEMON_POOL_HOST_POOL_H_
#define LOHAN_DAEMON_POOL_HOST_POOL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/pool/shared_arena.h"

namespace lohan {

class HostPool;

// A job's arena on loan from the HostPool. Destroying it unmaps the arena and
// returns its bytes to the pool's budget (the physical memory is freed once
// the clients that received the fd have unmapped it too).
// Not copyable or movable; hold by unique_ptr.
// REQUIRES: the HostPool outlives every PooledArena it created.
class PooledArena {
 public:
  PooledArena(const PooledArena&) = delete;
  PooledArena& operator=(const PooledArena&) = delete;
  ~PooledArena();

  const std::string& job_id() const { return job_id_; }
  const SharedArena& arena() const { return *arena_; }

 private:
  friend class HostPool;
  PooledArena(HostPool* pool, std::string job_id,
              std::unique_ptr<SharedArena> arena);

  HostPool* const pool_;
  const std::string job_id_;
  std::unique_ptr<SharedArena> arena_;  // reset first in the destructor
};

// The daemon-wide budget of shared, locked host memory, handed out as one
// SharedArena per job. Thread-safe: every method may be called concurrently.
class HostPool {
 public:
  struct Options {
    uint64_t capacity_bytes = 0;
    // Passed to SharedArena::Options for every arena.
    bool try_huge_pages = true;
    bool lock_in_ram = true;
  };

  explicit HostPool(Options options);
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;
  // REQUIRES: every PooledArena from this pool has been destroyed.
  ~HostPool();

  // Creates the job's arena of `bytes` (a positive multiple of 4 KiB).
  // RESOURCE_EXHAUSTED, saying how much is free, when it does not fit in the
  // budget (or the kernel refuses the memory or the lock);
  // ALREADY_EXISTS when the job has an arena; INVALID_ARGUMENT for a bad size
  // or an empty job id. The bytes are reserved before the (slow) memfd/mlock
  // work, which runs without the lock held.
  absl::StatusOr<std::unique_ptr<PooledArena>> CreateArena(
      const std::string& job_id, uint64_t bytes);

  struct JobUse {
    std::string job_id;
    uint64_t bytes = 0;
    bool huge_pages = false;  // false too while the arena is being created
  };
  struct Stats {
    uint64_t capacity_bytes = 0;
    uint64_t used_bytes = 0;   // reserved, including arenas being created
    std::vector<JobUse> jobs;  // ordered by job id
  };
  Stats GetStats() const;

 private:
  friend class PooledArena;
  void Release(const std::string& job_id);

  const Options options_;

  mutable absl::Mutex mu_;
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, JobUse> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_POOL_HOST_POOL_H_
