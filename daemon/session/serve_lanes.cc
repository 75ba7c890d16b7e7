#include "daemon/session/serve_lanes.h"

#include <utility>

#include "daemon/common/test_point.h"
#include "daemon/common/thread_name.h"

namespace lohan {

ServeLanes::ServeLanes(bool in_order) : in_order_(in_order) {
  if (in_order_) return;
  for (Lane lane : {Lane::kUrgent, Lane::kBulk, Lane::kOrdered}) {
    threads_[static_cast<size_t>(lane)] = std::thread([this, lane] {
      NameThisThread(lane == Lane::kUrgent ? "lohan-urgent"
                     : lane == Lane::kBulk ? "lohan-bulk"
                                           : "lohan-ordered");
      Run(lane);
    });
  }
}

ServeLanes::~ServeLanes() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (Queue& queue : queues_) queue.tasks.clear();
  }
  TestPoint("serve_lanes.dropped");
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

void ServeLanes::Post(Lane lane, std::function<void()> task) {
  if (in_order_) {
    task();
    return;
  }
  Queue& queue = queues_[static_cast<size_t>(lane)];
  absl::MutexLock lock(&mu_);
  auto has_room = [&queue]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue.tasks.size() < kMaxQueued;
  };
  mu_.Await(absl::Condition(&has_room));
  if (lane == Lane::kOrdered) {
    queue.tasks.push_back(Task{std::move(task), ordered_posted_++});
  } else {
    queue.tasks.push_back(Task{std::move(task), ordered_posted_});
    ++unfinished_[ordered_posted_];
  }
}

void ServeLanes::WaitOrdered() {
  if (in_order_) return;
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ordered_done_ == ordered_posted_;
  };
  mu_.Await(absl::Condition(&done));
}

size_t ServeLanes::Queued(Lane lane) const {
  absl::MutexLock lock(&mu_);
  return queues_[static_cast<size_t>(lane)].tasks.size();
}

void ServeLanes::Drain() {
  if (in_order_) return;
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Queue& queue : queues_) {
      if (queue.running || !queue.tasks.empty()) return false;
    }
    return true;
  };
  mu_.Await(absl::Condition(&idle));
}

bool ServeLanes::CanStartLocked(Lane lane) const {
  const Queue& queue = queues_[static_cast<size_t>(lane)];
  if (queue.tasks.empty()) return false;
  const uint64_t epoch = queue.tasks.front().epoch;
  if (lane != Lane::kOrdered) return epoch <= ordered_done_;
  // Every task posted before it has finished.
  return unfinished_.empty() || unfinished_.begin()->first > epoch;
}

void ServeLanes::Run(Lane lane) {
  Queue& queue = queues_[static_cast<size_t>(lane)];
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, lane]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || CanStartLocked(lane);
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      task = std::move(queue.tasks.front());
      queue.tasks.pop_front();
      queue.running = true;
    }
    task.run();
    absl::MutexLock lock(&mu_);
    queue.running = false;
    if (lane == Lane::kOrdered) {
      ++ordered_done_;
    } else if (auto at = unfinished_.find(task.epoch); --at->second == 0) {
      unfinished_.erase(at);
    }
  }
}

}  // namespace lohan
