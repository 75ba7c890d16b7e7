#include "daemon/optim/worker_pool.h"

#include <pthread.h>
#include <sched.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace lohan {

absl::StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::Create(
    const WorkerPoolOptions& options) {
  if (options.num_threads < 1 || options.num_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker pool: num_threads must be in [1, 256], got ",
                     options.num_threads));
  }
  std::unique_ptr<WorkerPool> pool(new WorkerPool(options.pin_threads));
  pool->threads_.reserve(options.num_threads);
  for (int i = 0; i < options.num_threads; ++i) {
    pool->threads_.emplace_back(&WorkerPool::WorkerLoop, pool.get(), i);
  }
  return pool;
}

WorkerPool::WorkerPool(bool pin_threads) : pin_threads_(pin_threads) {}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
  }
  work_cv_.SignalAll();
  for (std::thread& thread : threads_) thread.join();
}

void WorkerPool::Pin(int index) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  const int count = CPU_COUNT(&allowed);
  if (count <= 0) return;
  int wanted = index % count;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (wanted-- == 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0) {
        num_pinned_.fetch_add(1);
      }
      return;
    }
  }
}

void WorkerPool::WorkerLoop(int index) {
  if (pin_threads_) Pin(index);
  uint64_t seen = 0;
  for (;;) {
    const absl::FunctionRef<void(std::size_t)>* job;
    std::size_t tasks;
    {
      absl::MutexLock lock(&mu_);
      while (!shutdown_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (shutdown_) return;
      seen = generation_;
      job = job_;
      tasks = job_tasks_;
    }
    for (std::size_t i = next_task_.fetch_add(1); i < tasks;
         i = next_task_.fetch_add(1)) {
      (*job)(i);
    }
    absl::MutexLock lock(&mu_);
    if (--busy_ == 0) done_cv_.Signal();
  }
}

void WorkerPool::ParallelFor(std::size_t num_tasks,
                             absl::FunctionRef<void(std::size_t)> fn) {
  if (num_tasks == 0) return;
  absl::MutexLock call_lock(&call_mu_);
  absl::MutexLock lock(&mu_);
  job_ = &fn;
  job_tasks_ = num_tasks;
  next_task_.store(0);
  busy_ = static_cast<int>(threads_.size());
  ++generation_;
  work_cv_.SignalAll();
  while (busy_ != 0) done_cv_.Wait(&mu_);
  job_ = nullptr;
}

}  // namespace lohan
