// JobPipeline's end of an iteration: the norm, then commit, clip, skip or
// settle in the background (see ClipSchedule and settle_in_background).

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "daemon/common/span_trace.h"
#include "daemon/optim/optim_types.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/sched/pipeline_util.h"

namespace lohan {

using sched_internal::Annotate;
using sched_internal::IsNoPending;
using sched_internal::Now;

absl::StatusOr<IterationReport> JobPipeline::EndIteration(
    std::optional<double> global_sum_squares) {
  const double start = Now();
  SpanScope span("end_iteration");
  // NaN's sign bit means nothing (inf - inf in an all-reduce sets it).
  if (global_sum_squares.has_value() && std::signbit(*global_sum_squares) &&
      !std::isnan(*global_sum_squares)) {
    return absl::InvalidArgumentError(
        absl::StrCat("EndIteration: global sum of squares ",
                     *global_sum_squares, " is negative"));
  }
  absl::MutexLock api(&api_mu_);
  uint64_t iteration;
  ClipOptions clip;
  float grad_scale;
  bool started_deferred;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status ending = StartEndingLocked(); !ending.ok()) {
      return ending;
    }
    iteration = iteration_;
    clip = clip_;
    grad_scale = grad_scale_;
    started_deferred = started_deferred_;
    if (options_.schedule == Schedule::kAfterBackward) {
      for (size_t layer : submit_order_) {
        EnqueueLayerLocked(layer, TaskKind::kUpdate, grad_scale_, defers());
      }
    }
  }
  // Settling in the background, the norm is all EndIteration waits for:
  // eager updates still running go on into the settle.
  absl::Status s =
      defers() && options_.settle_in_background ? WaitDecisions() : WaitPass();
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    for (size_t l = 0; l < submissions_.size(); ++l) {
      if (!submissions_[l].submitted) {
        s = absl::FailedPreconditionError(absl::StrCat(
            "EndIteration: layer ", l, " got no gradient this iteration"));
        break;
      }
    }
  }
  auto fail = [&](const absl::Status& error) {
    abandon_.store(true);  // What still runs lands as pending, rolled back.
    (void)WaitPass();
    (void)RollbackAll();
    // Updates (or a skip's republish) that ran wrote into the caller's
    // buffers: the committed weights go back.
    const absl::Status restored = RestoreWeightCopies();
    DropScratch();
    EndIterationIdle();
    if (restored.ok()) return error;
    return absl::Status(error.code(),
                        absl::StrCat(error.message(), "; ", restored.message(),
                                     " (that layer's weight buffer holds "
                                     "unspecified values)"));
  };
  if (!s.ok()) return fail(s);

  IterationReport report;
  report.started_deferred = started_deferred;
  double sum = 0.0;
  // Fixed (layer, chunk) order; both sources hold the same bits.
  for (double x : defers() ? norm_squares_ : sum_squares_) sum += x;
  // The own sum only decided which chunks waited; FinishDeferred and
  // FinishRedoAll make any outcome right from any such start.
  if (global_sum_squares.has_value()) sum = *global_sum_squares;
  report.global_norm = std::sqrt(sum);
  report.nonfinite = !std::isfinite(sum);
  report.iteration = iteration;
  report.skipped = report.nonfinite && clip.skip_nonfinite;
  if (!report.nonfinite && clip.max_grad_norm > 0.0) {
    const double scale = clip.max_grad_norm / (report.global_norm + 1e-6);
    if (scale < 1.0) {
      report.clipped = true;
      report.clip_scale = scale;
    }
  }
  const double redo_start = Now();
  const bool wait = !options_.settle_in_background;
  absl::StatusOr<bool> running = defers()
                                     ? FinishDeferred(report, grad_scale, wait)
                                     : FinishRedoAll(report, grad_scale, wait);
  if (!running.ok()) return fail(running.status());
  if (*running) {
    // The rest runs while the caller goes on; SettleLoop commits it.
    absl::MutexLock lock(&mu_);
    settle_iteration_ = iteration + 1;
    last_clipped_ = report.clipped;
    report.iteration = iteration + 1;
    report.settling = true;
    report.busy = busy_;
    busy_ = StageBusy{};
    phase_ = Phase::kSettling;
    report.wait_seconds = Now() - start;
    return report;
  }
  if (report.clipped || report.skipped || report.deferred_chunks > 0) {
    report.redo_seconds = Now() - redo_start;
  }
  if (!report.skipped) {
    const double commit_start = Now();
    s = Commit(iteration + 1);
    if (!s.ok()) return fail(Annotate(s, "committing the iteration"));
    report.commit_seconds = Now() - commit_start;
    report.iteration = iteration + 1;
  }
  DropScratch();
  absl::MutexLock lock(&mu_);
  EndReadAheadLocked();
  iteration_ = report.iteration;
  if (!report.skipped) last_clipped_ = report.clipped;
  report.busy = busy_;
  busy_ = StageBusy{};
  phase_ = Phase::kIdle;
  report.wait_seconds = Now() - start;
  return report;
}

absl::StatusOr<bool> JobPipeline::FinishRedoAll(IterationReport& report,
                                                float grad_scale, bool wait) {
  report.eager_chunks = state_.total_chunks();
  if (report.skipped) {
    absl::Status s = RollbackAll();
    if (s.ok()) s = RunPass(TaskKind::kRepublish, 1.0f);
    if (!s.ok()) return s;
    return false;
  }
  if (!report.clipped) return false;
  report.redone_chunks = state_.total_chunks();
  absl::Status s = RollbackAll();
  if (s.ok()) {
    s = RunPass(TaskKind::kUpdate,
                static_cast<float>(report.clip_scale * grad_scale), wait);
  }
  if (!s.ok()) return s;
  return !wait;
}

absl::StatusOr<bool> JobPipeline::FinishDeferred(IterationReport& report,
                                                 float grad_scale, bool wait) {
  std::vector<Fate> fates;
  {
    absl::MutexLock lock(&mu_);
    norm_known_ = true;  // No eager task is dropped after this.
    if (read_ahead_queued_) read_ahead_ready_at_norm_ = CountStagedLocked();
    fates = fates_;
  }
  for (Fate fate : fates) {
    if (fate == Fate::kEager || fate == Fate::kDropped) ++report.eager_chunks;
    if (fate == Fate::kDropped) ++report.dropped_chunks;
    if (fate == Fate::kDeferred) ++report.deferred_chunks;
  }
  // Updated before the norm (or updating now), and waiting for it.
  auto eager = [&](size_t flat) { return fates[flat] == Fate::kEager; };
  auto deferred = [&](size_t flat) {
    return fates[flat] == Fate::kDeferred || fates[flat] == Fate::kDropped;
  };
  absl::Status s;
  if (report.skipped || report.clipped) {
    // Eager updates may still run (settling in the background): they end
    // before anything of theirs is rolled back.
    s = WaitPass();
    if (!s.ok()) return s;
  }
  if (report.skipped) {
    // Only the eager updates touched anything: their pending versions, and
    // the client's 16-bit buffers, which get the committed weights back.
    if (report.eager_chunks > report.dropped_chunks) {
      s = RollbackAll();
      if (s.ok()) s = RunChunkPass(TaskKind::kRepublish, 1.0f, eager);
    }
    if (!s.ok()) return s;
    return false;
  }
  if (report.clipped) {
    report.redone_chunks = report.eager_chunks - report.dropped_chunks;
    if (report.redone_chunks > 0) s = RollbackAll();
    if (s.ok()) {
      s = RunChunkPass(
          TaskKind::kUpdate, static_cast<float>(report.clip_scale * grad_scale),
          [](size_t) { return true; }, wait);
    }
  } else {
    // Unclipped: the eager updates stand; the deferred ones join them.
    if (report.deferred_chunks + report.dropped_chunks > 0) {
      s = RunChunkPass(TaskKind::kUpdate, grad_scale, deferred, wait,
                       /*append=*/true);
    } else if (wait) {
      s = WaitPass();
    }
    if (!s.ok()) return s;
    if (!wait) {
      // Eager updates not begun were queued in backward order; the next
      // forward needs layer 0 first. Read-ahead still queued goes first:
      // the updates of its chunks come after it.
      read_queue_.Sort([this](const Task& a, const Task& b) {
        const bool a_ahead = a.kind == TaskKind::kReadAhead;
        const bool b_ahead = b.kind == TaskKind::kReadAhead;
        if (a_ahead != b_ahead) return a_ahead;
        return FlatIndex(a.layer, a.chunk) < FlatIndex(b.layer, b.chunk);
      });
    }
    absl::MutexLock lock(&mu_);
    if (!PassDone()) return true;  // SettleLoop checks how it ended.
    if (!first_error_.ok()) return first_error_;
    return false;
  }
  if (!s.ok()) return s;
  return !wait;
}

void JobPipeline::SettleLoop() {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_settler_ || (phase_ == Phase::kSettling && PassDone());
  };
  while (true) {
    mu_.Await(absl::Condition(&ready));
    if (phase_ != Phase::kSettling) return;  // Stopping, nothing to commit.
    const uint64_t iteration = settle_iteration_;
    absl::Status s = first_error_;
    mu_.Unlock();
    if (s.ok()) s = Annotate(Commit(iteration), "committing the iteration");
    if (!s.ok()) (void)RollbackAll();
    DropScratch();
    mu_.Lock();
    if (!s.ok()) {
      settle_error_ = absl::AbortedError(absl::StrCat(
          "job '", job_, "': iteration ", iteration,
          " failed after EndIteration returned (its last updates run while "
          "the next forward goes on): ",
          s.message(), "; it is rolled back, the job stays at iteration ",
          iteration - 1, " (open it again to go on from there)"));
    } else {
      iteration_ = iteration;
    }
    EndReadAheadLocked();
    phase_ = Phase::kIdle;
  }
}

size_t JobPipeline::layers_settling() const {
  absl::MutexLock lock(&mu_);
  if (phase_ != Phase::kSettling) return 0;
  return static_cast<size_t>(
      std::count_if(layer_left_.begin(), layer_left_.end(),
                    [](size_t left) { return left > 0; }));
}

size_t JobPipeline::chunks_read_ahead() const {
  absl::MutexLock lock(&mu_);
  return CountStagedLocked();
}

absl::Status JobPipeline::StartEndingLocked() {
  if (absl::Status settled = AwaitSettledLocked(); !settled.ok()) {
    return settled;
  }
  if (phase_ != Phase::kInIteration) {
    return absl::FailedPreconditionError("no iteration in progress");
  }
  phase_ = Phase::kEnding;
  return absl::OkStatus();
}

absl::Status JobPipeline::AwaitSettledLocked() const {
  mu_.Await(absl::Condition(
      +[](const Phase* phase) { return *phase != Phase::kSettling; }, &phase_));
  return settle_error_;
}

absl::Status JobPipeline::WaitLayer(size_t layer) const {
  SpanScope span("wait_layer", layer);
  absl::MutexLock lock(&mu_);
  if (absl::Status in_range = LayerInRange(layer); !in_range.ok()) {
    return in_range;
  }
  auto updated = [this, layer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return phase_ != Phase::kSettling || layer_left_[layer] == 0 ||
           !first_error_.ok();
  };
  mu_.Await(absl::Condition(&updated));
  if (phase_ == Phase::kSettling && !first_error_.ok()) {
    return AwaitSettledLocked();  // Its error, once rolled back.
  }
  return settle_error_;
}

absl::Status JobPipeline::ReadCurrent(size_t flat, absl::Span<uint8_t> out,
                                      bool prefix, bool* from_tier) const {
  bool settling;
  {
    absl::MutexLock lock(&mu_);
    settling = phase_ == Phase::kSettling;
  }
  if (tier_.ReadCommitted(flat, out, /*or_pending=*/settling)) {
    if (from_tier != nullptr) *from_tier = true;
    return absl::OkStatus();
  }
  return ReadCurrentStored(chunk_names_[flat], out, prefix);
}

absl::Status JobPipeline::ReadCurrentStored(const std::string& name,
                                            absl::Span<uint8_t> out,
                                            bool prefix) const {
  bool settling;
  {
    absl::MutexLock lock(&mu_);
    settling = phase_ == Phase::kSettling;
  }
  if (settling) {
    absl::StatusOr<uint64_t> r =
        prefix ? store_->ReadPrefix(job_, name, out, /*pending=*/true)
               : store_->ReadPending(job_, name, out);
    // Committed meanwhile: the same bytes are now the committed version.
    if (r.ok() || !IsNoPending(r.status())) return r.status();
  }
  return (prefix ? store_->ReadPrefix(job_, name, out)
                 : store_->Read(job_, name, out))
      .status();
}

}  // namespace lohan
