#include "daemon/rpc/ended_job_sweeper.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "daemon/common/check.h"
#include "daemon/rpc/job_removal.h"
#include "layout/byte_size.h"
#include "spdlog/spdlog.h"

namespace lohan {
namespace {

// A time in the log, UTC as RFC 3339 (the log's own clock is local).
std::string LogTime(int64_t unix_seconds) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                          absl::FromUnixSeconds(unix_seconds),
                          absl::UTCTimeZone());
}

}  // namespace

absl::Duration EndedJobSweeper::SweepInterval(absl::Duration keep_ended) {
  return std::clamp(keep_ended / 10, absl::Seconds(1), absl::Minutes(1));
}

std::unique_ptr<EndedJobSweeper> EndedJobSweeper::Start(Options options) {
  LOHAN_CHECK(options.jobs != nullptr && options.sessions != nullptr &&
              options.store != nullptr && options.ledger != nullptr &&
              options.keep_ended > absl::ZeroDuration());
  std::unique_ptr<EndedJobSweeper> sweeper(
      new EndedJobSweeper(std::move(options)));
  sweeper->thread_ = std::thread([s = sweeper.get()] { s->Run(); });
  return sweeper;
}

EndedJobSweeper::EndedJobSweeper(Options options)
    : options_(std::move(options)),
      interval_(SweepInterval(options_.keep_ended)) {}

EndedJobSweeper::~EndedJobSweeper() { Stop(); }

void EndedJobSweeper::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void EndedJobSweeper::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const bool woken =
          mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_);
      if (woken) return;
    }
    SweepOnce(absl::Now());
  }
}

size_t EndedJobSweeper::SweepOnce(absl::Time now) {
  size_t deleted = 0;
  for (const v1::Job& job : options_.jobs->Expired(now)) {
    // Detached by its owner while its process still trains: the plane
    // goes first (the next pass deletes the job if still due).
    if (std::optional<pid_t> plane = options_.sessions->DataPlaneOf(job.id());
        plane.has_value()) {
      continue;
    }
    absl::Status status = options_.jobs->DeleteExpired(job.id(), now);
    if (absl::IsFailedPrecondition(status) || absl::IsNotFound(status)) {
      continue;  // attached, pinned or deleted meanwhile
    }
    if (!status.ok()) {
      spdlog::warn("job {}: not deleted although ended since {}: {}", job.id(),
                   LogTime(job.ended_unix_seconds()),
                   std::string(status.message()));
      continue;
    }
    const uint64_t bytes = FreeDeletedJob(options_.store, options_.ledger,
                                          options_.job_deleted, job.id());
    ++deleted;
    spdlog::info(
        "job {} '{}' of uid {} deleted by lohand: no process attached since "
        "{} ([jobs] keep_ended {}), {} bytes ({}) freed on the SSDs",
        job.id(), job.spec().name(), job.owner_uid(),
        LogTime(job.ended_unix_seconds()),
        absl::FormatDuration(options_.keep_ended), bytes,
        FormatByteSize(bytes));
  }
  return deleted;
}

}  // namespace lohan
