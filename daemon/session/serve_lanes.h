#ifndef LOHAN_DAEMON_SESSION_SERVE_LANES_H_
#define LOHAN_DAEMON_SESSION_SERVE_LANES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace lohan {

// Where a session's requests run once admitted, so that what the client's
// device waits for is not queued behind what only has to be done by the end
// of the iteration, and the serving thread only admits:
//   kUrgent:  the GPU waits on it now (FETCH_PARAMS, ACT_GET, ACT_FREE);
//   kBulk:    it frees a client buffer or saves data for later (a streamed
//             gradient's SSD write, ACT_PUT);
//   kOrdered: it must see everything posted before it done, and what is
//             posted after it must see it done (ITER_BEGIN/END/ABORT, the
//             staging ops): a barrier between the other two lanes' tasks.
// Each lane runs its tasks in order on a thread of its own; urgent and bulk
// tasks of one epoch (between two ordered tasks) run side by side. With
// `in_order` the lanes start no threads and Post runs the task at once on
// the caller's thread: arrival-order service, for comparison.
//
// Thread-safety: Post, WaitOrdered and Drain from one thread (the
// session's dispatcher); tasks run on the lane threads. The destructor
// drops the tasks not begun and joins the threads after the running ones
// finish.
class ServeLanes {
 public:
  enum class Lane { kUrgent = 0, kBulk = 1, kOrdered = 2 };
  // A dispatcher that would queue more than this per lane waits: the ring's
  // capacity bounds a client's requests in flight anyway.
  static constexpr size_t kMaxQueued = 4096;

  explicit ServeLanes(bool in_order);
  ServeLanes(const ServeLanes&) = delete;
  ServeLanes& operator=(const ServeLanes&) = delete;
  ~ServeLanes();

  void Post(Lane lane, std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every ordered task posted so far has run (what an ordered
  // request's admission must see: INIT_WEIGHTS before ITER_BEGIN).
  void WaitOrdered() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every lane is empty and idle.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);
  bool in_order() const { return in_order_; }
  // Tasks queued (not begun) in `lane` now.
  size_t Queued(Lane lane) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static constexpr size_t kLanes = 3;
  struct Task {
    std::function<void()> run;
    // Ordered tasks posted before it (for an ordered task: its index).
    uint64_t epoch = 0;
  };
  struct Queue {
    std::deque<Task> tasks;
    bool running = false;
  };
  bool CanStartLocked(Lane lane) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(Lane lane) ABSL_LOCKS_EXCLUDED(mu_);

  const bool in_order_;
  mutable absl::Mutex mu_;
  std::array<Queue, kLanes> queues_ ABSL_GUARDED_BY(mu_);
  uint64_t ordered_posted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ordered_done_ ABSL_GUARDED_BY(mu_) = 0;
  // Urgent and bulk tasks posted and not finished, by epoch.
  std::map<uint64_t, size_t> unfinished_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::array<std::thread, kLanes> threads_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SESSION_SERVE_LANES_H_
