#ifndef LOHAN_DAEMON_SESSION_SERVE_LANES_H_
#define LOHAN_DAEMON_SESSION_SERVE_LANES_H_

#include <array>
#include <cstddef>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace lohan {

// Where a session's requests run once admitted, so that what the client's
// device waits for is not queued behind what only has to be done by the end
// of the iteration:
//   kUrgent: the GPU waits on it now (FETCH_PARAMS, ACT_GET);
//   kBulk:   it frees a client buffer or saves data for later (a streamed
//            gradient's SSD write, ACT_PUT).
// Each lane runs its tasks in order on a thread of its own; the two lanes
// run side by side. Drain() waits until both are empty and idle: requests
// that must see everything before them done (ITER_END, staging, ...) run
// after it. With `in_order` the lanes start no threads and Post runs the
// task at once on the caller's thread: arrival-order service, for
// comparison.
//
// Thread-safety: Post and Drain from one thread (the session's dispatcher);
// tasks run on the lane threads. The destructor drops the tasks not begun
// and joins the threads after the running ones finish.
class ServeLanes {
 public:
  enum class Lane { kUrgent = 0, kBulk = 1 };
  // A dispatcher that would queue more than this per lane waits: the ring's
  // capacity bounds a client's requests in flight anyway.
  static constexpr size_t kMaxQueued = 4096;

  explicit ServeLanes(bool in_order);
  ServeLanes(const ServeLanes&) = delete;
  ServeLanes& operator=(const ServeLanes&) = delete;
  ~ServeLanes();

  void Post(Lane lane, std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);
  bool in_order() const { return in_order_; }
  // Tasks queued (not begun) in `lane` now.
  size_t Queued(Lane lane) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Queue {
    std::deque<std::function<void()>> tasks;
    bool running = false;
  };
  void Run(Lane lane) ABSL_LOCKS_EXCLUDED(mu_);

  const bool in_order_;
  mutable absl::Mutex mu_;
  std::array<Queue, 2> queues_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::array<std::thread, 2> threads_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SESSION_SERVE_LANES_H_
