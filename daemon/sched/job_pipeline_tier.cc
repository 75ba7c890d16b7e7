// JobPipeline's durability by commit interval (PipelineOptions::
// commit_interval): volatile commits between durable ones, what only the
// state tier holds written when it must reach the store; the tier's memory
// placed between iterations.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/sched/pipeline_util.h"
#include "layout/durability.h"

namespace lohan {

using sched_internal::Annotate;
using sched_internal::CommitTag;

absl::Status JobPipeline::CommitVolatile(uint64_t tag) {
  // Every chunk the tier alone took has no version in the store; the
  // others were written this iteration.
  std::vector<std::string> names;
  for (size_t flat = 0; flat < chunk_names_.size(); ++flat) {
    if (!tier_.PendingOnly(flat)) names.push_back(chunk_names_[flat]);
  }
  names.insert(names.end(), weight16_names_.begin(), weight16_names_.end());
  names.push_back(StateLayout::MetaName());
  absl::Status s = store_->CommitBatchVolatile(job_, names, tag);
  if (!s.ok()) return s;
  tier_.CommitPending();
  absl::MutexLock lock(&mu_);
  volatile_since_durable_ = true;
  return absl::OkStatus();
}

absl::Status JobPipeline::MakeDurable() {
  absl::MutexLock api(&api_mu_);
  return MakeDurableLocked();
}

absl::Status JobPipeline::MakeDurableLocked() {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status settled = AwaitSettledLocked(); !settled.ok()) {
      return settled;
    }
    if (phase_ != Phase::kIdle && !shutting_down_) {
      return absl::FailedPreconditionError(
          "the states are made durable between iterations");
    }
    if (!volatile_since_durable_) return absl::OkStatus();
  }
  return WriteDurable();
}

absl::Status JobPipeline::WriteDurable() {
  uint64_t iteration;
  {
    absl::MutexLock lock(&mu_);
    iteration = iteration_;
  }
  const std::vector<size_t> only = tier_.CommittedOnly();
  std::vector<std::string> written;
  auto rollback = [&] {
    for (const std::string& name : written) (void)store_->Rollback(job_, name);
  };
  absl::Status s;
  for (size_t flat : only) {
    // Written from where the tier holds it.
    const bool held =
        tier_.UseCommitted(flat, [&](absl::Span<const uint8_t> state) {
          s = store_->Write(job_, chunk_names_[flat], state).status();
        });
    if (!held) continue;  // (not only any more)
    if (!s.ok()) break;
    written.push_back(chunk_names_[flat]);
  }
  if (s.ok()) s = WriteMeta(iteration);
  if (s.ok()) {
    std::vector<std::string> names = chunk_names_;
    names.insert(names.end(), weight16_names_.begin(), weight16_names_.end());
    names.push_back(StateLayout::MetaName());
    s = store_->CommitBatch(job_, names, CommitTag(iteration));
  }
  if (!s.ok()) {
    rollback();
    (void)store_->Rollback(job_, StateLayout::MetaName());
    return Annotate(s, absl::StrCat("job '", job_, "': making iteration ",
                                    iteration, " durable"));
  }
  for (size_t flat : only) tier_.MarkStored(flat);
  absl::MutexLock lock(&mu_);
  durable_iteration_ = iteration;
  durable_since_ = DurabilityClock();
  volatile_since_durable_ = false;
  return absl::OkStatus();
}

double JobPipeline::DurabilityClock() const {
  return options_.durability_clock ? options_.durability_clock()
                                   : sched_internal::Now();
}

bool JobPipeline::DurableNextLocked() const {
  // Without a tier every state is written each iteration anyway: a durable
  // commit costs only its sync.
  if (!tier_.enabled()) return true;
  if (options_.durable_every_seconds > 0.0) {
    return DurabilityClock() - durable_since_ >= DurableSpacingLocked();
  }
  return options_.commit_interval <= 1 ||
         (iteration_ + 1) % options_.commit_interval == 0;
}

double JobPipeline::DurableSpacingLocked() const {
  return DurableSpacingSeconds(options_.durable_every_seconds,
                               options_.durable_write_share,
                               last_durable_write_seconds_);
}

double JobPipeline::durable_every_seconds() const {
  if (options_.durable_every_seconds <= 0.0) return 0.0;
  absl::MutexLock lock(&mu_);
  return DurableSpacingLocked();
}

uint64_t JobPipeline::last_durable_write_bytes() const {
  absl::MutexLock lock(&mu_);
  return last_durable_write_bytes_;
}

double JobPipeline::seconds_since_durable() const {
  absl::MutexLock lock(&mu_);
  return DurabilityClock() - durable_since_;
}

void JobPipeline::PlaceTier() {
  const std::vector<size_t> to_store = tier_.Place();
  if (to_store.empty()) return;
  uint64_t iteration;
  {
    absl::MutexLock lock(&mu_);
    iteration = iteration_;
  }
  // Copies the tier gives back whose version the store lacks: written
  // (from where the tier holds them) and committed (volatile) first; one
  // that fails stays, over the share, and is tried again at the next
  // iteration.
  for (size_t flat : to_store) {
    const std::string& name = chunk_names_[flat];
    absl::Status s;
    const bool held =
        tier_.UseCommitted(flat, [&](absl::Span<const uint8_t> state) {
          s = store_->Write(job_, name, state).status();
        });
    if (!held) continue;
    if (s.ok()) {
      s = store_->CommitBatchVolatile(job_, {name}, CommitTag(iteration));
    }
    if (!s.ok()) {
      (void)store_->Rollback(job_, name);
      continue;
    }
    tier_.MarkStored(flat);
    tier_.Release(flat);
    absl::MutexLock lock(&mu_);
    volatile_since_durable_ = true;
  }
}

void JobPipeline::FitGradScratch() {
  if (!grad_scratch_.enabled()) return;
  const StateTier::Stats tier = tier_.stats();
  // The copies the tier could not give back yet (a failed write) count too.
  const uint64_t states = std::max(tier.placed_bytes, tier.bytes_held);
  grad_scratch_.Fit(tier.share_bytes > states ? tier.share_bytes - states : 0);
}

void JobPipeline::LostTierVersion() {
  absl::MutexLock lock(&mu_);
  if (!settle_error_.ok()) return;
  settle_error_ = absl::AbortedError(absl::StrCat(
      "job '", job_,
      "': an iteration failed after updating states that only host memory "
      "held (the iterations since the last durable one, ",
      durable_iteration_,
      "); the job can only go back to that iteration: open it again"));
}

}  // namespace lohan
