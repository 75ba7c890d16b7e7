#ifndef LOHAN_DAEMON_SCHED_BOUNDED_QUEUE_H_
#define LOHAN_DAEMON_SCHED_BOUNDED_QUEUE_H_

// A FIFO between pipeline stages: Push waits while it is full, Pop while it
// is empty; Close wakes everyone and ends both.

#include <algorithm>
#include <cstddef>
#include <deque>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace lohan {

// Thread-safe, any number of producers and consumers.
template <class T>
class BoundedQueue {
 public:
  // REQUIRES: capacity > 0.
  explicit BoundedQueue(size_t capacity) : capacity_(capacity) {}
  BoundedQueue(const BoundedQueue&) = delete;
  BoundedQueue& operator=(const BoundedQueue&) = delete;

  // Waits for room, then appends. False (item dropped) once closed.
  bool Push(T item) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &BoundedQueue::CanPush));
    if (closed_) return false;
    items_.push_back(std::move(item));
    return true;
  }
  // Waits for an item and removes it. nullopt once closed (items still
  // queued then are dropped: Close means shut down, not drain).
  std::optional<T> Pop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &BoundedQueue::CanPop));
    if (closed_) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }
  // Reorders the items queued now (stable): what is needed first goes
  // first. Items a consumer took already are not affected.
  template <class Less>
  void Sort(Less less) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::stable_sort(items_.begin(), items_.end(), less);
  }

  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return items_.size();
  }

 private:
  bool CanPush() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || items_.size() < capacity_;
  }
  bool CanPop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !items_.empty();
  }

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<T> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_BOUNDED_QUEUE_H_
