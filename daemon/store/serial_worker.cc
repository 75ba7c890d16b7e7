#include "daemon/store/serial_worker.h"

#include <utility>

namespace lohan {

SerialWorker::SerialWorker() : thread_([this] { Run(); }) {}

SerialWorker::~SerialWorker() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void SerialWorker::Post(absl::AnyInvocable<void() &&> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void SerialWorker::Run() {
  while (true) {
    absl::AnyInvocable<void() &&> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](SerialWorker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
            return w->stopping_ || !w->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // stopping, and everything posted ran
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::move(task)();
  }
}

}  // namespace lohan
