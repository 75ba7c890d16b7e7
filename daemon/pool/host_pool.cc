#include "daemon/pool/host_pool.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/check.h"
#include "layout/byte_size.h"

namespace lohan {

PooledArena::PooledArena(HostPool* pool, std::string job_id,
                         std::unique_ptr<SharedArena> arena)
    : pool_(pool), job_id_(std::move(job_id)), arena_(std::move(arena)) {}

PooledArena::~PooledArena() {
  // Unmap before the bytes go back, so the budget never over-commits.
  arena_.reset();
  pool_->Release(job_id_);
}

HostPool::HostPool(Options options) : options_(options) {}

HostPool::~HostPool() {
  absl::MutexLock lock(&mu_);
  LOHAN_CHECK(jobs_.empty());
}

absl::StatusOr<std::unique_ptr<PooledArena>> HostPool::CreateArena(
    const std::string& job_id, uint64_t bytes) {
  if (job_id.empty()) return absl::InvalidArgumentError("empty job id");
  if (bytes == 0 || bytes % SharedArena::kPageBytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena size ", bytes, " must be a positive multiple of ",
                     SharedArena::kPageBytes));
  }
  {
    absl::MutexLock lock(&mu_);
    if (jobs_.contains(job_id)) {
      return absl::AlreadyExistsError(
          absl::StrCat("job ", job_id, " already has an arena"));
    }
    const uint64_t free_bytes = options_.capacity_bytes - used_bytes_;
    if (bytes > free_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "host pool: job ", job_id, " asks for ", FormatByteSize(bytes),
          " but only ", FormatByteSize(free_bytes), " of ",
          FormatByteSize(options_.capacity_bytes), " is free"));
    }
    used_bytes_ += bytes;
    jobs_[job_id] = JobUse{job_id, bytes, false};
  }

  SharedArena::Options arena_options;
  arena_options.name = absl::StrCat("lohan-job-", job_id);
  arena_options.bytes = bytes;
  arena_options.try_huge_pages = options_.try_huge_pages;
  arena_options.lock_in_ram = options_.lock_in_ram;
  absl::StatusOr<std::unique_ptr<SharedArena>> arena =
      SharedArena::Create(arena_options);
  if (!arena.ok()) {
    Release(job_id);
    return arena.status();
  }
  {
    absl::MutexLock lock(&mu_);
    jobs_[job_id].huge_pages = (*arena)->huge_pages();
  }
  return std::unique_ptr<PooledArena>(
      new PooledArena(this, job_id, std::move(*arena)));
}

void HostPool::Release(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  LOHAN_CHECK(it != jobs_.end());
  LOHAN_CHECK(used_bytes_ >= it->second.bytes);
  used_bytes_ -= it->second.bytes;
  jobs_.erase(it);
}

HostPool::Stats HostPool::GetStats() const {
  absl::MutexLock lock(&mu_);
  Stats stats;
  stats.capacity_bytes = options_.capacity_bytes;
  stats.used_bytes = used_bytes_;
  stats.jobs.reserve(jobs_.size());
  for (const auto& [id, use] : jobs_) stats.jobs.push_back(use);
  return stats;
}

}  // namespace lohan
