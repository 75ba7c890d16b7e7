#ifndef LOHAN_DAEMON_OPTIM_WORKER_POOL_H_
#define LOHAN_DAEMON_OPTIM_WORKER_POOL_H_

// A fixed set of optimizer worker threads that run one parallel loop at a
// time. The pool owns its threads and joins them in the destructor.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace lohan {

struct WorkerPoolOptions {
  int num_threads = 1;  // 1..256
  // Pin worker i to the i-th CPU (modulo) of the process's affinity mask.
  // Best effort: a failure leaves that thread unpinned (see num_pinned()).
  bool pin_threads = true;
};

class WorkerPool {
 public:
  // Starts the threads. InvalidArgument for a thread count out of range.
  // (Thread creation failure itself aborts: std::thread reports it only by
  // exception, and the daemon builds without exception handling.)
  static absl::StatusOr<std::unique_ptr<WorkerPool>> Create(
      const WorkerPoolOptions& options);

  // Wakes the threads, waits for them to finish, and joins them.
  // REQUIRES: no ParallelFor() call is in progress.
  ~WorkerPool();

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int num_threads() const { return static_cast<int>(threads_.size()); }
  int num_pinned() const { return num_pinned_.load(); }

  // Calls fn(i) once for every i in [0, num_tasks), spread over the pool's
  // threads (any task on any thread, in any order), and returns when all
  // calls have returned. The caller's thread waits and does no task itself.
  // Thread-safe: concurrent calls run one after the other.
  // REQUIRES: fn is safe to call concurrently for different i; fn does not
  // call ParallelFor on this pool.
  void ParallelFor(std::size_t num_tasks,
                   absl::FunctionRef<void(std::size_t)> fn);

 private:
  explicit WorkerPool(bool pin_threads);
  void WorkerLoop(int index);
  void Pin(int index);

  // Constant after construction.
  const bool pin_threads_;
  std::vector<std::thread> threads_;

  std::atomic<int> num_pinned_{0};

  // Held by a ParallelFor caller for its whole call: one loop at a time.
  absl::Mutex call_mu_;

  absl::Mutex mu_;
  absl::CondVar work_cv_;  // generation_ changed or shutdown_
  absl::CondVar done_cv_;  // busy_ reached 0
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  int busy_ ABSL_GUARDED_BY(mu_) = 0;  // workers yet to finish this loop
  const absl::FunctionRef<void(std::size_t)>* job_ ABSL_GUARDED_BY(mu_) =
      nullptr;
  std::size_t job_tasks_ ABSL_GUARDED_BY(mu_) = 0;

  // Next task index of the current loop.
  std::atomic<std::size_t> next_task_{0};
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_OPTIM_WORKER_POOL_H_
