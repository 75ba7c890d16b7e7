// JobSession: serving the rings (the admission of each submission and its
// dispatch to a lane, and the completions). The rest of the class is
// in job_session.cc.
#include "absl/strings/str_cat.h"
#include "daemon/common/log_text.h"
#include "daemon/common/test_point.h"
#include "daemon/session/job_session.h"
#include "daemon/store/io_gate.h"
#include "spdlog/spdlog.h"

namespace lohan {
namespace {

// How often the serving thread looks up from an idle ring to see whether the
// session is stopping.
constexpr absl::Duration kIdleWake = absl::Milliseconds(100);

}  // namespace

void JobSession::LogFailure(const SubmissionEntry& entry,
                            const absl::Status& status) {
  // It may quote what the client sent.
  const std::string message = LogSafe(status.message(), 1000);
  switch (status.code()) {
    // The daemon's side failed (a full or failing SSD, damaged data, a
    // settle that failed): the operator must see it, with the store's
    // device and offset in the text. Rate limited per kind and job.
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnavailable:
      if (std::optional<uint64_t> dropped =
              failure_log_.Admit(absl::StatusCodeToString(status.code()))) {
        spdlog::warn(
            "job {}: request {} failed: {}: {}{}", job_id(), entry.request_id,
            absl::StatusCodeToString(status.code()), message,
            *dropped > 0
                ? absl::StrCat(" (", *dropped, " more like it not logged)")
                : std::string());
        if (on_failure_) on_failure_(status);
      }
      return;
    default:  // The client's request was refused: its business.
      spdlog::debug("job {}: request {} failed: {}", job_id(), entry.request_id,
                    message);
  }
}

void JobSession::Complete(const SubmissionEntry& entry,
                          const absl::Status& status, uint64_t detail,
                          uint32_t flags) {
  {
    absl::MutexLock stats_lock(&stats_mu_);
    stats_.set_requests(stats_.requests() + 1);
    if (!status.ok()) stats_.set_failed_requests(stats_.failed_requests() + 1);
  }
  if (!status.ok()) LogFailure(entry, status);
  uint64_t arena_asked = 0;
  if (status.ok() && entry.op == static_cast<uint16_t>(RingOp::kIterEnd) &&
      on_arena_ask_) {
    arena_asked = on_arena_ask_();
  }
  absl::MutexLock lock(&complete_mu_);
  CompletionEntry completion{};
  completion.arena_asked = arena_asked;
  completion.request_id = entry.request_id;
  completion.status_code = static_cast<uint32_t>(status.code());
  completion.flags = flags;
  completion.detail = detail;
  if (!status.ok()) {
    // The text goes to its record of the error area first (see
    // kErrorTextRecordBytes): sequence 0, the text, then the sequence; the
    // completion's release ordering publishes it. One record per failure,
    // round robin, so the texts of several requests failing while the
    // client is not reading stay apart.
    completion.detail = ++error_sequence_;
    WriteErrorText(
        base() + served_->error_text.offset, served_->error_text.length,
        error_sequence_,
        std::string_view(status.message().data(), status.message().size()));
  }
  // Answered even while the session stops (a drain, lohand's SIGTERM): a
  // request that ran, an ITER_END that committed, is one the client must
  // hear of, and it reads what is in the ring before it reports the daemon
  // gone. Only a full ring is given up on then: nobody reads it.
  while (true) {
    absl::StatusOr<bool> pushed = completions_->TryPush(&completion);
    if (!pushed.ok()) {
      spdlog::warn("job {}: completion ring broken: {}", job_id(),
                   std::string(pushed.status().message()));
      if (on_failure_) {
        on_failure_(absl::DataLossError(
            absl::StrCat("the completion ring of its data plane was broken (",
                         pushed.status().message(), "); serving stopped")));
      }
      stopping_.store(true);
      return;
    }
    if (*pushed || stopping_.load()) return;
    (void)completions_->WaitForSpace(kIdleWake);
  }
}

bool JobSession::InIteration() const {
  absl::MutexLock lock(&validator_mu_);
  return validator_->in_iteration();
}

bool JobSession::RequestDrain() {
  drain_requested_.store(true);
  return !stopping_.load();
}

void JobSession::StopServingBrokenRing(const absl::Status& why) {
  spdlog::warn("job {}: submission ring broken, serving stops: {}", job_id(),
               LogSafe(why.message(), 1000));
  // What `lohanctl jobs` shows under the job, and the plane closed rather
  // than left open unserved.
  if (on_failure_) {
    on_failure_(absl::DataLossError(absl::StrCat(
        "the submission ring of its data plane was broken by its client (",
        why.message(),
        "); lohand stopped serving it and closed it: open it "
        "again")));
  }
  if (on_drained_) on_drained_();
}

void JobSession::Serve() {
  while (!stopping_.load()) {
    if (drain_requested_.load() && !InIteration()) {
      // Between iterations: nothing is lost by ending here, once what was
      // admitted (an ITER_END queued behind gradients) has run.
      TestPoint("job_session.draining");
      lanes_->Drain();
      spdlog::info("job {}: drained at iteration {}", job_id(),
                   served_->pipeline->iteration());
      if (on_drained_) on_drained_();
      return;
    }
    SubmissionEntry entry;
    absl::StatusOr<bool> popped = submissions_->TryPop(&entry);
    if (!popped.ok()) return StopServingBrokenRing(popped.status());
    if (!*popped) {
      absl::Status waited = submissions_->WaitForEntries(kIdleWake);
      if (!waited.ok() && !absl::IsDeadlineExceeded(waited)) {
        return StopServingBrokenRing(waited);
      }
      continue;
    }
    Dispatch(entry);
  }
}

ServeLanes::Lane JobSession::LaneOf(RingOp op) {
  switch (op) {
    case RingOp::kFetchParams:
    case RingOp::kActGet:
    case RingOp::kActFree:  // a catalog update; the client may wait on it
      return ServeLanes::Lane::kUrgent;
    case RingOp::kGradReady:
    case RingOp::kActPut:
      return ServeLanes::Lane::kBulk;
    default:
      return ServeLanes::Lane::kOrdered;
  }
}

void JobSession::Dispatch(const SubmissionEntry& entry) {
  const RingOp op = static_cast<RingOp>(entry.op);
  ServeLanes::Lane lane = LaneOf(op);
  if (lane == ServeLanes::Lane::kOrdered) {
    // Admitted once every ordered request before it has run (an
    // ITER_BEGIN needs its INIT_WEIGHTS done), then run on the ordered
    // lane once everything before it has; what comes after waits for it.
    lanes_->WaitOrdered();
    if (absl::Status admitted = AdmitOrdered(entry); !admitted.ok()) {
      Complete(entry, admitted, 0, 0);
      return;
    }
    lanes_->Post(lane, [this, entry] {
      uint64_t detail = 0;
      uint32_t flags = 0;
      absl::Status status = Handle(entry, detail, flags);
      Complete(entry, status, detail, flags);
    });
    // Admitted and queued: for the validator, an ITER_END's iteration is
    // over now, though it has not run.
    TestPoint("job_session.ordered_posted");
    return;
  }
  // Admitted in arrival order: the validator follows the client's
  // protocol (iteration numbers, slots, activation ids) as sent.
  if (absl::Status admitted = AcceptEntry(entry); !admitted.ok()) {
    Complete(entry, admitted, 0, 0);
    return;
  }
  const bool activation =
      op == RingOp::kActPut || op == RingOp::kActGet || op == RingOp::kActFree;
  if (activation) {
    absl::MutexLock lock(&activations_mu_);
    // An activation's requests run in order: one whose put or get is still
    // queued goes behind it, on its lane.
    auto [at, added] =
        activations_in_flight_.try_emplace(entry.activation_id, lane, 0);
    if (!added) lane = at->second.first;
    ++at->second.second;
  }
  const bool urgent = lane == ServeLanes::Lane::kUrgent;
  lanes_->Post(lane, [this, entry, activation, urgent] {
    TestPoint("job_session.lane_task_runs");
    uint64_t detail = 0;
    uint32_t flags = 0;
    absl::Status status;
    if (urgent) {
      // Its SSD reads go ahead of this job's state traffic (FairSsdGate).
      IoGate::UrgentScope scope;
      status = Execute(entry, detail, flags);
    } else {
      status = Execute(entry, detail, flags);
    }
    if (activation) {
      absl::MutexLock lock(&activations_mu_);
      auto at = activations_in_flight_.find(entry.activation_id);
      if (--at->second.second == 0) activations_in_flight_.erase(at);
    }
    Complete(entry, status, detail, flags);
  });
}

}  // namespace lohan
