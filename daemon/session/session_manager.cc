#include "daemon/session/session_manager.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/check.h"
#include "daemon/common/log_text.h"
#include "daemon/common/memory_release.h"
#include "daemon/ipc/arena_access.h"
#include "daemon/quota/daemon_memory.h"
#include "daemon/quota/fair_share.h"
#include "daemon/session/arena_layout.h"
#include "layout/byte_size.h"
#include "spdlog/spdlog.h"
#include "wire/attach_protocol.h"
#include "wire/fd_passing.h"

namespace lohan {

SessionManager::SessionManager(std::unique_ptr<UnixListener> listener,
                               const Parts& parts, UniqueFd stop_event)
    : listener_(std::move(listener)),
      parts_(parts),
      stop_event_(std::move(stop_event)) {}

std::unique_ptr<SessionManager> SessionManager::Start(
    std::unique_ptr<UnixListener> listener, const Parts& parts) {
  LOHAN_CHECK(parts.jobs != nullptr && parts.pool != nullptr &&
              parts.store != nullptr && parts.updater != nullptr &&
              parts.quotas != nullptr);
  UniqueFd stop_event(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  // Without an eventfd the daemon cannot stop its threads: our bug to fix.
  LOHAN_CHECK(stop_event.valid());
  std::unique_ptr<SessionManager> manager(
      new SessionManager(std::move(listener), parts, std::move(stop_event)));
  SessionManager* self = manager.get();
  if (parts.ledger != nullptr) {
    parts.ledger->SetReclaimer([self](uid_t for_uid, const std::string& job_id,
                                      const std::map<uid_t, uint64_t>& beyond,
                                      bool at_once) {
      return self->ReclaimSsd(for_uid, job_id, beyond, at_once);
    });
  }
  manager->listener_->Start([self](UniqueFd connection, const Caller& caller) {
    self->Accept(std::move(connection), caller);
  });
  return manager;
}

SessionManager::~SessionManager() { Shutdown(); }

void SessionManager::JoinFinished() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->finished.load()) {
      it->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void SessionManager::Refused(const Caller& caller, absl::string_view kind,
                             const absl::Status& why) {
  std::optional<uint64_t> dropped =
      log_limiter_.Admit(absl::StrCat(kind, ":", caller.uid));
  if (!dropped.has_value()) return;
  spdlog::info("data plane refused to pid {} (uid {}): {}{}", caller.pid,
               caller.uid, LogSafe(why.message(), 1000),
               *dropped == 0 ? ""
                             : absl::StrCat(" (", *dropped,
                                            " more such refusals not "
                                            "logged)"));
}

void SessionManager::Accept(UniqueFd connection, const Caller& caller) {
  absl::MutexLock lock(&mu_);
  JoinFinished();
  if (stopping_) return;
  const uint32_t limit = parts_.quotas->For(caller.uid).data_planes;
  size_t by_user = 0;
  for (const Connection& open : connections_) {
    if (open.uid == caller.uid && !open.finished.load()) ++by_user;
  }
  absl::Status refused;
  if (limit != 0 && by_user >= limit) {
    refused = absl::ResourceExhaustedError(absl::StrCat(
        "uid ", caller.uid, " has ", by_user,
        " data-plane connections open and the quota is ", limit,
        " ([quotas] data_planes in lohand.toml); close one first"));
  } else if (connections_.size() >= kMaxConnections) {
    refused = absl::ResourceExhaustedError(
        absl::StrCat("lohand has ", connections_.size(),
                     " data-plane connections open, its most; try again"));
  }
  if (!refused.ok()) {
    // Best effort and never blocking (the socket is non-blocking): the
    // client reads why before it sees the hang-up.
    (void)SendWithFds(connection.get(), EncodeAttachReply(refused), {});
    Refused(caller, "connection", refused);
    return;
  }
  Connection& slot = connections_.emplace_back();
  slot.uid = caller.uid;
  slot.thread =
      std::thread([this, &slot, caller, fd = std::move(connection)]() mutable {
        Serve(fd.get(), caller);
        fd.reset();
        slot.finished.store(true);
      });
}

namespace {
// How long a new data plane waits for its job's last one to finish closing.
constexpr absl::Duration kCloseWait = absl::Seconds(30);
// How long a new data plane within its owner's share of the pool waits for
// other users' planes beyond theirs to close (each at the end of its
// iteration; after half of it, at once).
constexpr absl::Duration kReclaimWait = absl::Seconds(60);
}  // namespace

absl::StatusOr<std::unique_ptr<JobSession>> SessionManager::OpenSession(
    int connection, const Caller& caller, Opened& opened) {
  pollfd fds[2] = {{.fd = connection, .events = POLLIN},
                   {.fd = stop_event_.get(), .events = POLLIN}};
  int ready;
  do {
    ready = poll(fds, 2, kHandshakeTimeoutMs);
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0 || fds[1].revents != 0) {
    return absl::DeadlineExceededError("no attach request in time");
  }
  absl::StatusOr<FdMessage> message =
      ReceiveWithFds(connection, kAttachRequestBytes, 0, kHandshakeTimeoutMs);
  if (!message.ok()) return message.status();
  absl::StatusOr<std::string> job_id = DecodeAttachRequest(message->payload);
  if (!job_id.ok()) return job_id.status();
  absl::StatusOr<v1::Job> job = parts_.jobs->CheckAttachedBy(caller, *job_id);
  if (!job.ok()) return job.status();
  if (absl::Status allowed = AuthorizeArenaAccess(caller, job->owner_uid());
      !allowed.ok()) {
    return allowed;
  }
  uint64_t bytes = 0;  // the arena granted
  {
    absl::MutexLock lock(&mu_);
    // A data plane that is closing (its process gone, the job's pipeline
    // finishing) is waited for, not refused: the new process follows it.
    auto closed = [this, id = *job_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto found = sessions_.find(id);
      return found == sessions_.end() || found->second.session != nullptr;
    };
    mu_.AwaitWithTimeout(absl::Condition(&closed), kCloseWait);
    if (sessions_.count(*job_id) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", *job_id,
          sessions_.at(*job_id).session == nullptr
              ? " has a data plane still closing; try again in a moment"
              : " already has a data plane open"));
    }
    const uid_t owner = job->owner_uid();
    // What is free first; only when not even the job's smallest arena
    // fits are other users' planes beyond their shares taken back, for
    // that much.
    const uint64_t floor = ArenaFloor(*job);
    absl::StatusOr<ArenaClaim> claim = ClaimArenaLocked(*job);
    // A plane whose process just died (a crash, a restart) still holds its
    // arena for the moment it takes to close: wait for that, not refuse.
    if (absl::IsResourceExhausted(claim.status()) &&
        AwaitGonePlanesLocked(kCloseWait)) {
      claim = ClaimArenaLocked(*job);
    }
    absl::StatusOr<bool> asked = false;
    if (absl::IsResourceExhausted(claim.status())) {
      asked = ReclaimPoolLocked(*job_id, owner, floor, /*at_once=*/false);
    }
    if (!asked.ok()) {  // not now: [quotas] reclaim_interval
      return absl::ResourceExhaustedError(absl::StrCat(
          claim.status().message(), "; ", asked.status().message()));
    }
    if (*asked) {
      // Other users' data planes beyond their shares close at the end of
      // their iterations (those still open after half the wait, at once);
      // this one opens once their arenas are back.
      auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return PoolClaimRefusalLocked(*job_id, owner, floor).ok();
      };
      if (!mu_.AwaitWithTimeout(absl::Condition(&fits), kReclaimWait / 2) &&
          ReclaimPoolLocked(*job_id, owner, floor, /*at_once=*/true)
              .value_or(false)) {
        mu_.AwaitWithTimeout(absl::Condition(&fits), kReclaimWait / 2);
      }
      claim = ClaimArenaLocked(*job);
    }
    if (!claim.ok()) return claim.status();
    opened.claim_id = claim->claim_id;
    bytes = claim->bytes;
    opened.wanted_bytes = job->spec().host_pool_bytes();
    if (job->spec().has_model()) opened.model = job->spec().model();
    opened.adopts_activations = claim->reserved;
  }
  absl::StatusOr<std::unique_ptr<JobSession>> session =
      JobSession::Create(parts_.pool, *job_id, bytes, parts_.ring_entries);
  if (!session.ok()) {
    absl::MutexLock lock(&mu_);
    pool_claims_.erase(opened.claim_id);
  }
  return session;
}

SessionManager::Ended SessionManager::WaitForHangUp(int connection,
                                                    int end_event) {
  pollfd fds[3] = {{.fd = connection, .events = POLLIN | POLLRDHUP},
                   {.fd = stop_event_.get(), .events = POLLIN},
                   {.fd = end_event, .events = POLLIN}};
  while (true) {
    if (poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      return Ended::kPeer;
    }
    // Hang-up, error, stop, an end asked for, or bytes the protocol does
    // not allow: all end the session.
    if (fds[1].revents != 0) return Ended::kStop;
    if (fds[2].revents != 0) return Ended::kEndEvent;
    if (fds[0].revents != 0) return Ended::kPeer;
  }
}

void SessionManager::EndSessionLocked(const std::string& job_id) {
  auto found = sessions_.find(job_id);
  if (found == sessions_.end()) return;
  const uint64_t one = 1;
  if (write(found->second.end_event, &one, sizeof(one)) != sizeof(one)) {
    spdlog::error("cannot wake job {}'s data-plane thread", job_id);
  }
}

JobSession* SessionManager::OpenSessionLocked(const std::string& job_id) const {
  auto found = sessions_.find(job_id);
  return found == sessions_.end() ? nullptr : found->second.session;
}

absl::StatusOr<std::string> SessionManager::StopSession(
    const std::string& job_id, bool drain, uid_t by) {
  absl::MutexLock lock(&mu_);
  JobSession* session = OpenSessionLocked(job_id);
  if (session == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("job ", job_id, " has no data plane open"));
  }
  auto claim = pool_claims_.find(sessions_.at(job_id).claim_id);
  const bool owner =
      claim != pool_claims_.end() && claim->second.owner == by && by != 0;
  Closing closing{
      .reason = ClosingReason::kStopped,
      .why = absl::StrCat(
          "lohand closed this job's data plane: `lohanctl ",
          drain ? "drain" : "kill", "` by uid ", by,
          owner ? " (the job's owner)" : (by == 0 ? " (root)" : ""),
          drain ? " ended it at the end of its iteration"
                : " ended it at once (an iteration in progress rolled back)"),
      .advice = "open it again (lohan.init(..., resume=True)) to go on"};
  return StopSessionLocked(job_id, *session, drain, std::move(closing));
}

std::string SessionManager::StopSessionLocked(const std::string& job_id,
                                              JobSession& session, bool drain,
                                              Closing closing) {
  sessions_.at(job_id).closing = std::move(closing);
  const bool registered = session.registered();
  const bool in_iteration = registered && session.InIteration();
  const uint64_t iteration = session.Status().iteration();
  // Its serving thread ends a drained session, once what it admitted has
  // run: an ITER_END admitted (the iteration over for the validator)
  // commits and is answered before the connection closes.
  if (drain && registered && session.RequestDrain()) {
    if (in_iteration) {
      return absl::StrCat("draining: the data plane closes once iteration ",
                          iteration + 1, " ends");
    }
    return absl::StrCat("drained between iterations at ", iteration);
  }
  EndSessionLocked(job_id);
  if (in_iteration) {
    return absl::StrCat("killed: iteration ", iteration + 1,
                        " rolled back; the job keeps iteration ", iteration);
  }
  return absl::StrCat(drain ? "drained" : "killed", " between iterations at ",
                      iteration);
}

void SessionManager::Serve(int connection, const Caller& caller) {
  Opened opened;
  absl::StatusOr<std::unique_ptr<JobSession>> session =
      OpenSession(connection, caller, opened);
  const uint64_t claim_id = opened.claim_id;
  const uint64_t wanted_bytes = opened.wanted_bytes;
  if (!session.ok()) {
    Refused(caller, absl::StatusCodeToString(session.status().code()),
            session.status());
    // Best effort: the peer may already be gone.
    (void)SendWithFds(connection, EncodeAttachReply(session.status()), {});
    return;
  }
  const std::string job_id = (*session)->job_id();
  UniqueFd end_event(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  LOHAN_CHECK(end_event.valid());
  // Before the session is reachable: RegisterModel may come at once.
  (*session)->SetDrainedCallback([this, job_id] {
    absl::MutexLock lock(&mu_);
    EndSessionLocked(job_id);
  });
  (*session)->SetFailureCallback([this, job_id](const absl::Status& failure) {
    parts_.jobs->NoteFailure(job_id, failure);
  });
  (*session)->SetArenaAskCallback(
      [this, job_id] { return ArenaAsked(job_id); });
  uid_t owner = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ ||
        !sessions_
             .emplace(job_id, LiveSession{.session = session->get(),
                                          .pid = caller.pid,
                                          .connection = connection,
                                          .end_event = end_event.get(),
                                          .serial = ++last_serial_,
                                          .claim_id = claim_id,
                                          .wanted_arena_bytes = wanted_bytes,
                                          .model = opened.model,
                                          .adopts_activations =
                                              opened.adopts_activations})
             .second) {
      pool_claims_.erase(claim_id);
      (void)SendWithFds(connection,
                        EncodeAttachReply(absl::UnavailableError(
                            "the daemon is stopping or the job's data plane "
                            "was opened twice")),
                        {});
      return;
    }
    owner = pool_claims_.at(claim_id).owner;
  }
  // Training now: its owner's fair share of the SSDs is kept for it.
  if (parts_.ledger != nullptr) parts_.ledger->SetPresent(owner, true);
  bool stopped_from_outside = false;
  Ended ended = Ended::kPeer;
  const int arena_fd = (*session)->arena_fd();
  absl::Status sent =
      SendWithFds(connection, EncodeAttachReply(absl::OkStatus()), {});
  if (sent.ok()) {
    sent = SendWithFds(connection, EncodeArenaGrant((*session)->grant()),
                       {&arena_fd, 1});
  }
  if (sent.ok()) {
    const uint64_t granted = (*session)->grant().arena_bytes;
    spdlog::info(
        "data plane open for job {} (pid {}, {} byte arena{})", job_id,
        caller.pid, granted,
        granted < wanted_bytes
            ? absl::StrCat(" of the ", wanted_bytes, " its job asks for: ",
                           opened.adopts_activations
                               ? "the arena lohand asked it to move to"
                               : "what the pool had free for it")
            : "");
    ended = WaitForHangUp(connection, end_event.get());
    uint64_t events = 0;
    stopped_from_outside =
        read(end_event.get(), &events, sizeof(events)) == sizeof(events);
  }
  const std::optional<std::vector<uint8_t>> notice =
      EndSession(job_id, *std::move(session), ended);
  if (parts_.ledger != nullptr) parts_.ledger->SetPresent(owner, false);
  ReleaseFreedMemory();
  {
    absl::MutexLock lock(&mu_);
    // A client asked to move that closed its plane itself is opening its
    // next one: its arena waits for it.
    const uint64_t asked = sessions_.at(job_id).arena_asked;
    if (asked != 0 && ended == Ended::kPeer && !stopping_) {
      ReserveForMoveLocked(job_id, claim_id, asked);
    } else {
      pool_claims_.erase(claim_id);
    }
    sessions_.erase(job_id);
  }
  spdlog::info("data plane closed for job {} (pid {}); arena freed", job_id,
               caller.pid);
  if (stopped_from_outside) {
    // lohanctl jobs drain / kill: the process keeps running but holds the
    // job no more (the connection's owner may detach its own job).
    (void)parts_.jobs->Detach(caller, job_id);
    spdlog::info("job {} detached from pid {} (stopped from outside)", job_id,
                 caller.pid);
  }
  // Last, the job detached and its arena back: the client may open it
  // again as soon as it reads this. Best effort: the peer may be gone.
  if (notice.has_value()) (void)SendWithFds(connection, *notice, {});
}

std::optional<std::vector<uint8_t>> SessionManager::EndSession(
    const std::string& job_id, std::unique_ptr<JobSession> session,
    Ended ended) {
  // Closing: no call reaches the session any more, but the job shows an
  // open data plane (and cannot open another) until all of it is gone: its
  // pipeline (which may commit a settling iteration first), its arena, the
  // memory of its model and plan.
  std::optional<Closing> closing;
  bool moving = false;
  // Its optimizer time moves to the closed planes' total as it leaves the
  // open ones (under the same lock, in whole nanoseconds: OptimizerSeconds
  // never goes back, not even by a rounding).
  int64_t optimizer_nanos = 0;
  {
    absl::MutexLock lock(&mu_);
    auto registered = [this, &job_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !sessions_.at(job_id).registering;
    };
    mu_.Await(absl::Condition(&registered));
    LiveSession& live = sessions_.at(job_id);
    live.session = nullptr;
    optimizer_nanos = Nanos(session->Status().optimizer_seconds());
    closed_optimizer_nanos_ += optimizer_nanos;
    // Its client closes it to move: the job's next plane takes over its
    // swapped activations (ReserveForMoveLocked keeps its arena).
    moving = live.arena_asked != 0 && ended == Ended::kPeer && !stopping_;
    if (ended == Ended::kStop) {
      closing =
          Closing{.reason = ClosingReason::kDaemonStopping,
                  .why =
                      "lohand is stopping (SIGTERM or its service stopped) and "
                      "closed this job's data plane",
                  .advice =
                      "open it again (lohan.init(..., resume=True)) once "
                      "lohand is back"};
    } else if (ended == Ended::kEndEvent) {
      closing = live.closing;
    }
  }
  // What it ran is answered first; then what it holds is final.
  session->StopServing();
  if (moving) session->KeepActivations();
  const v1::SessionStatus last = session->Status();
  {
    absl::MutexLock lock(&mu_);
    closed_optimizer_nanos_ +=
        Nanos(last.optimizer_seconds()) - optimizer_nanos;
  }
  std::optional<uint64_t> kept;
  if (session->registered()) kept = last.iteration();
  session.reset();  // the arena is back in the pool: so is the claim
  if (!closing.has_value()) return std::nullopt;
  return ClosingNotice(*closing, kept);
}

std::vector<uint8_t> SessionManager::ClosingNotice(
    const Closing& closing, std::optional<uint64_t> kept_iteration) {
  return EncodeClosingNotice(
      closing.reason,
      absl::StrCat(
          closing.why,
          kept_iteration.has_value()
              ? absl::StrCat("; the job keeps iteration ", *kept_iteration)
              : std::string(),
          ": ", closing.advice));
}

void SessionManager::Shutdown() {
  // Not under mu_: a reclaim under way (it takes mu_) finishes first.
  if (parts_.ledger != nullptr) parts_.ledger->SetReclaimer(nullptr);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  listener_->Stop();
  const uint64_t one = 1;
  if (write(stop_event_.get(), &one, sizeof(one)) != sizeof(one)) {
    spdlog::error("cannot wake the data-plane threads");
  }
  std::list<Connection> connections;
  {
    absl::MutexLock lock(&mu_);
    connections.splice(connections.end(), connections_);
  }
  for (Connection& connection : connections) connection.thread.join();
}

absl::StatusOr<v1::RegisterModelResponse> SessionManager::RegisterModel(
    const Caller& caller, const v1::RegisterModelRequest& request) {
  absl::StatusOr<v1::Job> job =
      parts_.jobs->CheckAttachedBy(caller, request.job_id());
  if (!job.ok()) return job.status();
  const uid_t owner = job->owner_uid();
  const uint64_t held = DaemonMemoryHeld(owner, request.job_id(), "");
  // The session is marked registering: its connection waits for that to
  // end before closing it, so it cannot go under us, while the manager's
  // lock is free (a registration may wait for SSD space that other users'
  // closing data planes give back).
  JobSession* session = nullptr;
  bool adopt_activations = false;
  std::string smaller_arena;  // UpdateParts::smaller_arena
  {
    absl::MutexLock lock(&mu_);
    session = OpenSessionLocked(request.job_id());
    if (session == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", request.job_id(),
          " has no data plane open; open it (lohan_data_plane_open) first"));
    }
    LiveSession& live = sessions_.at(request.job_id());
    if (live.registering) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", request.job_id(), " is registering a model already"));
    }
    live.registering = true;
    adopt_activations = live.adopts_activations;
    const uint64_t holds = session->grant().arena_bytes;
    if (holds < live.wanted_arena_bytes) {
      auto cap = arena_caps_.find(request.job_id());
      smaller_arena = absl::StrCat(
          "its job's arena of ", live.wanted_arena_bytes, " bytes (",
          FormatByteSize(live.wanted_arena_bytes), "): ",
          cap != arena_caps_.end() && cap->second.bytes != 0
              ? absl::StrCat("the job was ", cap->second.why)
              : std::string("the pool had no more free for it when this "
                            "plane opened"));
    }
  }
  bool took = false;  // the registration succeeded
  absl::Cleanup registered_or_not = [&] {
    absl::MutexLock lock(&mu_);
    LiveSession& live = sessions_.at(request.job_id());
    live.registering = false;
    // What the plane's asks to shrink and grow are sized for: the layout
    // its client registers again when it moves (a job's model registered
    // as given has no smaller arena).
    if (took && live.model.has_value()) {
      live.model = ArenaFieldsOf(request.model());
    }
  };
  absl::StatusOr<v1::RegisterModelResponse> registered = session->RegisterModel(
      request.model(),
      {.store = parts_.store,
       .updater = parts_.updater,
       .ledger = parts_.ledger,
       .optimizer_queue = parts_.optimizer_queue,
       .defaults = parts_.job_defaults,
       .job = {.data_parallel_rank = job->spec().has_run(),
               .expect_stored_states = job->has_states(),
               .weight = static_cast<double>(
                   parts_.quotas->For(job->owner_uid()).weight),
               .fair_group = absl::StrCat("uid ", job->owner_uid()),
               .state_tier_limit_bytes =
                   parts_.quotas->For(job->owner_uid()).state_tier_bytes},
       .owner = owner,
       .daemon_memory_held = held,
       .daemon_memory_limit = parts_.quotas->For(owner).daemon_memory_bytes,
       .adopt_activations = adopt_activations,
       .smaller_arena = smaller_arena});
  took = registered.ok();
  // A refused model's memory (its spec, its layout) goes back at once.
  if (!registered.ok()) ReleaseFreedMemory();
  if (registered.ok() && !job->has_states()) {
    // From now on a store without the job's states has lost them.
    if (absl::Status noted = parts_.jobs->NoteStatesStored(request.job_id());
        !noted.ok()) {
      spdlog::warn("job {}: {}", request.job_id(),
                   std::string(noted.message()));
    }
  }
  // A model that did not fit (the SSDs, the arena) or whose states could
  // not be opened: what `lohanctl jobs` says of the job afterwards.
  if (!registered.ok() &&
      (registered.status().code() == absl::StatusCode::kResourceExhausted ||
       registered.status().code() == absl::StatusCode::kDataLoss ||
       registered.status().code() == absl::StatusCode::kInternal)) {
    parts_.jobs->NoteFailure(
        request.job_id(),
        absl::Status(registered.status().code(),
                     absl::StrCat("registering the model: ",
                                  registered.status().message())));
  }
  return registered;
}

uint64_t SessionManager::DaemonMemoryHeld(
    uid_t uid, const std::string& except_tensors_of,
    const std::string& except_plan_of) const {
  std::set<std::string> jobs;
  for (const v1::Job& job : parts_.jobs->List(Caller{.uid = uid})) {
    if (job.owner_uid() == uid) jobs.insert(job.id());
  }
  uint64_t tensors = 0;
  for (const auto& [job, count] : parts_.store->TensorsByJob()) {
    if (jobs.count(job) != 0 && job != except_tensors_of) tensors += count;
  }
  uint64_t plans = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [job, live] : sessions_) {
      if (live.session != nullptr && jobs.count(job) != 0 &&
          job != except_plan_of) {
        plans += live.session->plan_bytes();
      }
    }
  }
  return tensors * kDaemonBytesPerTensor + plans;
}

absl::StatusOr<v1::JobPlan> SessionManager::PlanJob(const Caller& caller,
                                                    const std::string& job_id,
                                                    uint64_t plan_bytes,
                                                    Planner plan) {
  absl::StatusOr<v1::Job> job = parts_.jobs->CheckAttachedBy(caller, job_id);
  if (!job.ok()) return job.status();
  const uid_t owner = job->owner_uid();
  if (absl::Status fits = FitsDaemonMemory(
          owner, plan_bytes, DaemonMemoryHeld(owner, "", job_id),
          parts_.quotas->For(owner).daemon_memory_bytes,
          absl::StrCat("job ", job_id, "'s activation plan"));
      !fits.ok()) {
    return fits;
  }
  SessionLayout layout;
  uint64_t serial = 0;
  {
    absl::MutexLock lock(&mu_);
    const JobSession* session = OpenSessionLocked(job_id);
    if (session == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id,
          " has no data plane open; open it (lohan_data_plane_open) and "
          "register the model first"));
    }
    if (!session->registered()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id,
          " has no model registered on its data plane; register the model "
          "first"));
    }
    layout = {.arena_bytes = session->grant().arena_bytes,
              .weights_resident = session->weights_resident(),
              .tier = session->tier_use(),
              .layers = session->registered_layers()};
    serial = sessions_.at(job_id).serial;
  }
  absl::StatusOr<v1::JobPlan> planned = plan(job_id, layout);
  if (!planned.ok()) return planned.status();
  absl::MutexLock lock(&mu_);
  auto found = sessions_.find(job_id);
  if (found == sessions_.end() || found->second.serial != serial ||
      found->second.session == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, "'s data plane closed while its plan was made"));
  }
  found->second.session->SetPlan(*planned);
  return planned;
}

absl::StatusOr<v1::JobPlan> SessionManager::KeptPlan(
    const Caller& caller, const std::string& job_id) const {
  absl::StatusOr<v1::Job> job = parts_.jobs->Get(caller, job_id);
  if (!job.ok()) return job.status();
  absl::MutexLock lock(&mu_);
  const JobSession* session = OpenSessionLocked(job_id);
  std::optional<v1::JobPlan> plan;
  if (session != nullptr) plan = session->Plan();
  if (!plan.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id,
                     session == nullptr ? " has no data plane open"
                                        : " has no activation plan (PlanJob)"));
  }
  return *std::move(plan);
}

std::vector<v1::SessionStatus> SessionManager::Status() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::SessionStatus> statuses;
  for (const auto& [job_id, open] : sessions_) {
    if (open.session == nullptr) continue;  // closing
    v1::SessionStatus status = open.session->Status();
    status.set_pid(open.pid);
    status.set_wanted_arena_bytes(open.wanted_arena_bytes);
    status.set_arena_asked_bytes(open.arena_asked);
    if (auto cap = arena_caps_.find(job_id); cap != arena_caps_.end()) {
      status.set_arena_note(cap->second.why);
    }
    statuses.push_back(std::move(status));
  }
  return statuses;
}

int64_t SessionManager::Nanos(double seconds) {
  return std::llround(seconds * 1e9);
}

double SessionManager::OptimizerSeconds() const {
  absl::MutexLock lock(&mu_);
  int64_t nanos = closed_optimizer_nanos_;
  for (const auto& [job_id, open] : sessions_) {
    if (open.session != nullptr) {
      nanos += Nanos(open.session->Status().optimizer_seconds());
    }
  }
  return static_cast<double>(nanos) * 1e-9;
}

std::optional<pid_t> SessionManager::DataPlaneOf(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto found = sessions_.find(job_id);
  if (found == sessions_.end()) return std::nullopt;
  return found->second.pid;
}

size_t SessionManager::ActiveSessions() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace lohan
