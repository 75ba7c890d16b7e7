// JobPipeline's kept commits (PipelineOptions::keep_previous_commit): a
// data-parallel rank's job keeps the states its last commit replaced until
// its next iteration begins, so that it can go back one step to where the
// other ranks are.

#include "absl/strings/str_cat.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/sched/pipeline_util.h"

namespace lohan {

using sched_internal::Annotate;

bool JobPipeline::KeepsPreviousCommit() const {
  // The meta is in every iteration's commit: it keeps one exactly when the
  // last commit was a kept one.
  absl::StatusOr<TensorInfo> meta = store_->Stat(job_, StateLayout::MetaName());
  return meta.ok() && meta->previous_version != 0;
}

absl::Status JobPipeline::ReleaseKeptStates() {
  if (!options_.keep_previous_commit) return absl::OkStatus();
  absl::StatusOr<size_t> released = store_->ReleasePrevious(job_);
  if (!released.ok()) {
    return Annotate(released.status(), absl::StrCat("job '", job_, "'"));
  }
  return absl::OkStatus();
}

absl::Status JobPipeline::ReleasePreviousCommit() {
  absl::MutexLock api(&api_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status settled = AwaitSettledLocked(); !settled.ok()) {
      return settled;
    }
    if (phase_ != Phase::kIdle) {
      return absl::FailedPreconditionError(
          "the kept states are released between iterations only");
    }
  }
  return ReleaseKeptStates();
}

absl::StatusOr<uint64_t> JobPipeline::AwaitCommitted() const {
  absl::MutexLock lock(&mu_);
  if (absl::Status settled = AwaitSettledLocked(); !settled.ok()) {
    return settled;
  }
  return iteration_;
}

absl::Status JobPipeline::RevertLastCommit() {
  if (!KeepsPreviousCommit()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_,
        "' keeps no commit before its last one to go back to (only a "
        "data-parallel rank's job keeps one, until its next iteration "
        "begins)"));
  }
  absl::StatusOr<size_t> reverted = store_->RevertToPrevious(job_);
  if (!reverted.ok()) {
    return Annotate(reverted.status(),
                    absl::StrCat("job '", job_, "': going back a commit"));
  }
  return absl::OkStatus();
}

}  // namespace lohan
