#include "daemon/session/serve_lanes.h"

#include <utility>

namespace lohan {

ServeLanes::ServeLanes(bool in_order) : in_order_(in_order) {
  if (in_order_) return;
  for (Lane lane : {Lane::kUrgent, Lane::kBulk}) {
    threads_[static_cast<size_t>(lane)] =
        std::thread([this, lane] { Run(lane); });
  }
}

ServeLanes::~ServeLanes() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (Queue& queue : queues_) queue.tasks.clear();
  }
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
  queue.tasks.push_back(std::move(task));
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

void ServeLanes::Run(Lane lane) {
  Queue& queue = queues_[static_cast<size_t>(lane)];
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, &queue]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue.tasks.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      task = std::move(queue.tasks.front());
      queue.tasks.pop_front();
      queue.running = true;
    }
    task();
    absl::MutexLock lock(&mu_);
    queue.running = false;
  }
}

}  // namespace lohan
