#ifndef LOHAN_DAEMON_SESSION_SESSION_MANAGER_H_
#define LOHAN_DAEMON_SESSION_SESSION_MANAGER_H_

#include <atomic>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/common/caller.h"
#include "daemon/common/log_limiter.h"
#include "daemon/ipc/unix_listener.h"
#include "daemon/jobs/job_registry.h"
#include "daemon/pool/host_pool.h"
#include "daemon/quota/fair_share.h"
#include "daemon/quota/space_ledger.h"
#include "daemon/quota/user_limits.h"
#include "daemon/sched/memory_shares.h"
#include "daemon/session/job_session.h"
#include "daemon/session/job_settings.h"
#include "wire/plane_notice.h"
#include "wire/unique_fd.h"

namespace lohan {

// Serves the data-plane socket: each connection is one process asking for
// its job's arena (wire/attach_protocol.h). The process must be the
// one attached to the job (JobRegistry::CheckAttachedBy, which also enforces
// the owner's uid); it then gets the arena fd and the ring layout, and its
// JobSession lives exactly as long as the connection: when the process
// closes it or dies, the arena goes back to the host pool.
//
// Each connection is served on a thread of its own, so a client that
// connects and says nothing holds up nobody (and is dropped after
// kHandshakeTimeout). Per user (QuotaTable): at most data_planes
// connections, open or opening (one more is answered RESOURCE_EXHAUSTED and
// closed at once, no thread started), and at most host_pool_bytes over the
// user's arenas. A registered model's SSD set-aside (SpaceLedger) is given
// back when its connection closes. Refusals are logged, rate-limited.
// When lohand closes a plane from its side (given way to another user's
// share, stopped by its owner or root, lohand stopping), it sends the
// client a closing notice (wire/plane_notice.h) saying why and which
// iteration the job keeps, after the last completion and before the
// connection closes. Thread-safe.
class SessionManager {
 public:
  static constexpr int kHandshakeTimeoutMs = 5000;
  static constexpr size_t kMaxConnections = 1024;

  struct Parts {
    JobRegistry* jobs = nullptr;
    HostPool* pool = nullptr;
    TensorStore* store = nullptr;
    const AdamUpdater* updater = nullptr;
    const QuotaTable* quotas = nullptr;
    SpaceLedger* ledger = nullptr;  // may be null: no SSD accounting
    // Shares the optimizer among jobs by their owners' weights; may be
    // null.
    FairQueue* optimizer_queue = nullptr;
    // The daemon's per-job defaults ([pool], [optimizer]), which each
    // job's RegisterModel is resolved against (JobSession::UpdateParts).
    JobDefaults job_defaults;
    // Entries in each of a session's two rings ([pool] ring_entries).
    uint32_t ring_entries = JobSession::kRingCapacity;
    // [quotas] reclaim_interval: one user's requests close other users'
    // planes at most once per this long (zero: no limit); reclaim_grace: a
    // job whose plane was closed so is not again for this long (zero:
    // none).
    absl::Duration reclaim_interval = absl::ZeroDuration();
    absl::Duration reclaim_grace = absl::ZeroDuration();
    // [quotas] regrow_after: a job below the arena it asks for is asked to
    // grow once the pool has had room for more, for it, this long without
    // a break, and no sooner than this after it was asked to shrink (zero:
    // at its next iteration's end).
    absl::Duration regrow_after = absl::ZeroDuration();
    // The time both are measured with; empty: absl::Now. Tests set it.
    std::function<absl::Time()> clock;
  };
  // REQUIRES: every part (and the updater's worker pool) outlives the
  // manager.
  static std::unique_ptr<SessionManager> Start(
      std::unique_ptr<UnixListener> listener, const Parts& parts);

  SessionManager(const SessionManager&) = delete;
  SessionManager& operator=(const SessionManager&) = delete;
  ~SessionManager();

  // Stops accepting, closes every data-plane connection, frees every arena
  // and joins every thread. Idempotent.
  void Shutdown();

  size_t ActiveSessions() const;
  // The pid of the process whose data plane `job_id` has open (or still
  // closing); none without one.
  std::optional<pid_t> DataPlaneOf(const std::string& job_id) const;

  // Every open data plane's progress, by job id.
  // The whole plan kept with `job_id`'s session (JobSession::Plan), for
  // its owner or root: NOT_FOUND for a job the caller may not see,
  // FAILED_PRECONDITION without a data plane or a plan.
  absl::StatusOr<v1::JobPlan> KeptPlan(const Caller& caller,
                                       const std::string& job_id) const;
  std::vector<v1::SessionStatus> Status() const;

  // Ends `job_id`'s data plane from outside its process: `drain` once the
  // iteration in progress is over and what the plane admitted has run (at
  // once between iterations), else now (an iteration in progress is rolled
  // back). Either way the connection closes, its client told that uid `by`
  // stopped it, and the job is detached. Returns what will happen, for the
  // caller. NOT_FOUND when the job has no data plane open. The caller
  // (owner or root) is checked by the control service.
  absl::StatusOr<std::string> StopSession(const std::string& job_id, bool drain,
                                          uid_t by);

  // RegisterModel for the job's open data plane, called by the process
  // attached to the job. FAILED_PRECONDITION when the job has no data plane
  // open (open it first) or the caller is not the attached process.
  absl::StatusOr<v1::RegisterModelResponse> RegisterModel(
      const Caller& caller, const v1::RegisterModelRequest& request);

  // What a job's open session fixes of its layout, for its plan.
  struct SessionLayout {
    uint64_t arena_bytes = 0;
    bool weights_resident = false;  // JobSession::weights_resident
    JobSession::TierUse tier;       // JobSession::tier_use
    v1::ModelSpec layers;           // JobSession::registered_layers
  };
  using Planner = absl::FunctionRef<absl::StatusOr<v1::JobPlan>(
      const std::string& job_id, const SessionLayout& layout)>;
  // The activation plan of `job_id`'s open session, called for by the
  // process attached to the job (the checks RegisterModel makes:
  // NOT_FOUND for another user's job, FAILED_PRECONDITION when the caller
  // is not the attached process or the job has no data plane open) once
  // its model is registered (FAILED_PRECONDITION otherwise). `plan` runs
  // without the manager's lock (a large plan takes a tenth of a second;
  // other callers do not wait for it); what it returns is kept with the
  // session (JobSession::SetPlan) and returned, a failure passed through;
  // FAILED_PRECONDITION if the session closed meanwhile.
  // `plan_bytes` (PlanBytesEstimate of the request) is checked against the
  // owner's [quotas] daemon_memory first (RESOURCE_EXHAUSTED, nothing
  // planned), the job's kept plan not counted: a new one replaces it.
  absl::StatusOr<v1::JobPlan> PlanJob(const Caller& caller,
                                      const std::string& job_id,
                                      uint64_t plan_bytes, Planner plan);

  // What the manager did to share the pool and the SSD array, per job,
  // over the job's planes since the manager started (v1::Job's
  // arena_shrink_asks, arena_grow_asks, planes_closed).
  struct ShareCounts {
    uint64_t shrink_asks = 0;    // AskShrinkLocked
    uint64_t grow_asks = 0;      // GrowAskLocked
    uint64_t planes_closed = 0;  // ClosePlaneForLocked, each plane once
  };
  // By job id; a job absent was never asked or closed.
  std::map<std::string, ShareCounts> ShareCountsByJob() const;
  // Seconds the optimizer spent on jobs' updates since the manager
  // started: every plane's SessionStatus.optimizer_seconds, closed ones
  // included (v1::OptimizerStatus.busy_seconds). Never decreases.
  double OptimizerSeconds() const;
  // Drops what the manager keeps of job `job_id`, deleted: its counts and
  // its arena cap.
  void ForgetJob(const std::string& job_id);

  // What lohand holds in its memory for `uid` ([quotas] daemon_memory):
  // its jobs' store tensors, but `except_tensors_of`'s, and its sessions'
  // kept plans, but `except_plan_of`'s (either may be empty).
  uint64_t DaemonMemoryHeld(uid_t uid, const std::string& except_tensors_of,
                            const std::string& except_plan_of) const;

 private:
  struct Connection {
    uid_t uid = 0;
    std::thread thread;
    std::atomic<bool> finished{false};
  };
  // Why lohand closes a session from its side, for its client's closing
  // notice: "<why>; the job keeps iteration K: <advice>".
  struct Closing {
    ClosingReason reason = ClosingReason::kStopped;
    std::string why;
    std::string advice;
  };
  // What ended WaitForHangUp.
  enum class Ended { kPeer, kStop, kEndEvent };
  // An open session, as the other threads may reach it.
  struct LiveSession {
    // Null while the session closes (its connection thread destroys it).
    JobSession* session = nullptr;
    pid_t pid = 0;
    // Its client's connection (owned by its connection thread, open while
    // the session is in sessions_): hung up once the client is gone.
    int connection = -1;
    int end_event = -1;     // eventfd: signalled, its connection thread ends it
    uint64_t serial = 0;    // unique among the manager's sessions, ever
    uint64_t claim_id = 0;  // its PoolClaim
    // The arena its job asks for (JobSpec.host_pool_bytes); its own may be
    // smaller (ClaimArenaLocked).
    uint64_t wanted_arena_bytes = 0;
    // RegisterModel runs on it (without the manager's lock): the session
    // is not closed until it returns.
    bool registering = false;
    // The arena fields of its job's model (JobSpec.model, ArenaFieldsOf),
    // and once its model is registered, of the spec registered: what its
    // client registers again when it moves, so what its asks to shrink
    // and grow are sized for (one registered as given has no smaller
    // arena). None: a job kept without a model, whose arena cannot change.
    std::optional<v1::ModelSpec> model;
    // What its client is asked at each iteration's end (ArenaAsked) until
    // it moves: the arena bytes of its next plane; 0: nothing.
    uint64_t arena_asked = 0;
    // Since when the pool has had room for it to grow (GrowAskLocked);
    // InfiniteFuture: not now.
    absl::Time room_since = absl::InfiniteFuture();
    // Opened on the arena its job's last plane left when it closed to
    // move: its registration takes over that plane's swapped activations.
    bool adopts_activations = false;
    // Why it was last asked to end (StopSessionLocked); none: not asked.
    std::optional<Closing> closing;
  };
  // An open (or opening) session's claim on its owner's pool quota.
  struct PoolClaim {
    uid_t owner = 0;
    uint64_t bytes = 0;
  };

  SessionManager(std::unique_ptr<UnixListener> listener, const Parts& parts,
                 UniqueFd stop_event);
  void Accept(UniqueFd connection, const Caller& caller);
  void Serve(int connection, const Caller& caller);
  // Wakes the connection thread of `job_id` to close its session.
  void EndSessionLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The session for `caller`'s job, or the reason there is none, its
  // arena as ClaimArenaLocked grants it (other users' planes beyond their
  // shares closed first only when not even the smallest arena fits).
  // `claim_id` gets its claim on the owner's pool quota (the caller gives
  // it back once the session is gone), `wanted_bytes` the arena its job
  // asks for.
  struct Opened {
    uint64_t claim_id = 0;
    uint64_t wanted_bytes = 0;
    std::optional<v1::ModelSpec> model;  // LiveSession::model
    bool adopts_activations = false;     // LiveSession's
  };
  absl::StatusOr<std::unique_ptr<JobSession>> OpenSession(int connection,
                                                          const Caller& caller,
                                                          Opened& opened);
  // Waits until the peer hangs up (or sends anything: not allowed), the
  // manager stops or `end_event` (an eventfd) is signalled; says which
  // (the manager's stop first, then the end event, when several came).
  Ended WaitForHangUp(int connection, int end_event);
  // Ends `job_id`'s `session` once its connection thread is done waiting:
  // no call reaches it any more, it stops serving (what runs finishes and
  // is answered) and is destroyed. Returns the closing notice for its
  // client, if lohand closed it (`ended` by the manager's stop or the end
  // event with a Closing recorded), naming the iteration the job keeps.
  std::optional<std::vector<uint8_t>> EndSession(
      const std::string& job_id, std::unique_ptr<JobSession> session,
      Ended ended);
  // The closing notice of `closing`, the job keeping `kept_iteration` (none:
  // no model was registered).
  static std::vector<uint8_t> ClosingNotice(
      const Closing& closing, std::optional<uint64_t> kept_iteration);
  void JoinFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job_id`'s session, or null when it has none open (or it is closing).
  JobSession* OpenSessionLocked(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pool claims and their fair shares: session_manager_shares.cc.
  // Claims `bytes` of the pool for `job_id`'s session, of `owner`'s quota
  // and fair share: the claim's id, or RESOURCE_EXHAUSTED with the numbers.
  absl::StatusOr<uint64_t> ClaimPoolLocked(const std::string& job_id,
                                           uid_t owner, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A claimed arena: its PoolClaim's id and its size.
  struct ArenaClaim {
    uint64_t claim_id = 0;
    uint64_t bytes = 0;
    bool reserved = false;  // left by the job's last plane, which moved
  };
  // Claims the arena `job`'s data plane opens with: the job's own
  // (JobSpec.host_pool_bytes) when it fits `job`'s owner's quota and fair
  // share of what is free; else, for a job kept with its model
  // (JobSpec.model), the largest arena ChooseArena lays the model out in
  // within what is free, down to SmallestArena (streamed if need be). The
  // refusal of the job's own arena when not even that fits.
  absl::StatusOr<ArenaClaim> ClaimArenaLocked(const v1::Job& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A claim ClaimArenaLocked reserved for `job` (Reservation), taken and
  // resized for its new plane: a grow within what its owner may claim
  // more. None: no reservation. The caller's plane takes over the swapped
  // activations the job's last one kept.
  std::optional<ArenaClaim> TakeReservationLocked(const v1::Job& job,
                                                  uint64_t wanted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps the claim of `job_id`'s plane, closing now after its client was
  // asked to move to `asked` bytes, for the job's next plane: shrunk to
  // `asked` if fewer (a Reservation).
  void ReserveForMoveLocked(const std::string& job_id, uint64_t claim_id,
                            uint64_t asked) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (at most `patience`) for the planes whose clients are gone, their
  // hang-ups seen or not yet, to finish closing: what they hold is about
  // to be free, so a new plane is not refused for it. False when none was
  // closing.
  bool AwaitGonePlanesLocked(absl::Duration patience)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back reservations no plane came for in time, and the swapped
  // activations their jobs' last planes kept.
  void DropStaleReservationsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The least arena ClaimArenaLocked may grant `job`.
  static uint64_t ArenaFloor(const v1::Job& job);
  // The most pool bytes `owner` may claim more now: within its quota and
  // FairShareRoom.
  uint64_t PoolRoomLocked(uid_t owner) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why ClaimPoolLocked would refuse now; OK when it would not.
  absl::Status PoolClaimRefusalLocked(const std::string& job_id, uid_t owner,
                                      uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When `bytes` more fit `owner`'s share of the pool but not what is
  // free, takes back what other users' data planes hold beyond their
  // shares, the newest first, until it covers it: a registered plane whose
  // model streams is asked to shrink at its next iteration's end (never
  // below its smallest arena, its user's share, or the arena a grace
  // leaves it), the others closed (at the end of the iteration in
  // progress, or `at_once`, the iteration rolled back), each job told
  // why; `at_once` (the escalation) closes, never asks. Whether any was
  // asked or closed.
  // RESOURCE_EXHAUSTED, nothing closed, when it would close some but
  // ReclaimAllowedLocked refuses. REQUIRES for `at_once`: a call without
  // it for the same request was allowed.
  // `shrink_only`: planes that cannot shrink are left alone (for a plane
  // already training, TakeBackForUseLocked).
  absl::StatusOr<bool> ReclaimPoolLocked(const std::string& job_id, uid_t owner,
                                         uint64_t bytes, bool at_once,
                                         bool shrink_only = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // [quotas] reclaim_interval, for every reclaim (pool and SSD): OK when
  // `owner`'s request for `job_id` may close other users' planes now (its
  // last reclaim was reclaim_interval ago or more, or this is the
  // escalation, `at_once`, of the request last allowed); else
  // RESOURCE_EXHAUSTED saying when it may and why.
  absl::Status ReclaimAllowedLocked(uid_t owner, const std::string& job_id,
                                    bool at_once)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Other users' open sessions than `owner`'s, the newest first.
  struct Candidate {
    uint64_t serial;
    std::string job_id;
    JobSession* session;
    uid_t uid;
    uint64_t bytes;  // its pool claim
  };
  std::vector<Candidate> OthersNewestFirstLocked(uid_t owner) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // [quotas] reclaim_grace: whether candidate `c` is a job's plane opened
  // after the job's last plane was closed for another user's share, less
  // than reclaim_grace ago (it counts as within its share).
  bool InGraceLocked(const Candidate& c) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What `c`'s grace leaves it of the pool: the arena it shrank to (0: it
  // was closed, or has no grace).
  uint64_t GraceArenaLocked(const Candidate& c) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The arena `c` shrinks to, giving back at most `give` bytes and keeping
  // at least `keep`: the largest its model is laid out in within that,
  // not below its smallest; none when it cannot shrink (no model kept, not
  // registered, an as-given layout, nothing smaller fits).
  std::optional<uint64_t> ShrinkTargetLocked(const Candidate& c, uint64_t give,
                                             uint64_t keep) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks `c`'s client to move to a `target` byte arena for `owner`'s job
  // `job_id` (its ITER_END completions carry it), caps the job's arena at
  // it and notes the reclaim (NoteReclaimedLocked, its grace keeping
  // `target`).
  void AskShrinkLocked(uid_t owner, const std::string& job_id,
                       const Candidate& c, uint64_t target,
                       absl::string_view what_for)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The JobSession's arena-ask callback (ITER_END): what `job_id`'s open
  // plane is asked now (a pending shrink or grow, or a grow decided now:
  // GrowAskLocked); 0: nothing.
  uint64_t ArenaAsked(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // A grow for `live` (of `job_id`), below the arena its job asks for:
  // the largest arena its model takes within what its owner may claim more
  // (PoolRoomLocked) and its job's arena, once that has been more than it
  // holds for regrow_after and regrow_after has passed since it was asked
  // to shrink; 0: none now.
  uint64_t GrowAskLocked(const std::string& job_id, LiveSession& live)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Only use earns a share: when `live` (of `job_id`, holding `held` of
  // `owner`'s) has begun an iteration and its model would take a larger
  // arena within its owner's share than it holds, but that is not free,
  // asks others holding beyond their shares to shrink for it
  // (ReclaimPoolLocked, shrink_only: at their next iterations' ends, none
  // closed; at most once per reclaim_interval for `owner`). GrowAskLocked grows
  // it once the room is there.
  void TakeBackForUseLocked(const std::string& job_id, const LiveSession& live,
                            uint64_t held, uid_t owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records that `owner`'s request closed candidate `c`'s plane (or shrank
  // it to `kept` bytes): the time of `owner`'s last reclaim, and `c`'s
  // job's grace.
  void NoteReclaimedLocked(uid_t owner, const Candidate& c, uint64_t kept = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes candidate `c`'s plane for `owner`'s job `job_id` (at the end of
  // its iteration, or `at_once`), its client told it gave way to `job_id`'s
  // share of `what_for`, the job's last failure `plane` was closed and
  // `advice`; notes the reclaim (NoteReclaimedLocked).
  void ClosePlaneForLocked(uid_t owner, const std::string& job_id,
                           const Candidate& c, bool at_once,
                           absl::string_view what_for, absl::string_view plane,
                           absl::string_view advice)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // parts_.clock, or absl::Now.
  absl::Time Now() const;
  // `seconds` in whole nanoseconds: sums of them are exact, so a total
  // that moves from the open planes' to the closed ones' never goes back.
  static int64_t Nanos(double seconds);
  // The ledger's reclaimer (SpaceLedger::SetReclaimer): for the users in
  // `beyond` (newest first) until what each holds beyond its share is
  // covered: a training plane whose swapped activations cover it keeps
  // training (it may swap no more beyond its share meanwhile; they come
  // back as its iterations free them), unless `at_once`; the others whose
  // closing gives SSD space back are closed (each at the end of its
  // iteration, or `at_once`, its iteration rolled back), each job told
  // why. Planes within their grace are kept, and none is
  // closed when ReclaimAllowedLocked refuses: that refusal is returned
  // (the set-aside is then refused at once, saying why).
  absl::Status ReclaimSsd(uid_t for_uid, const std::string& job_id,
                          const std::map<uid_t, uint64_t>& beyond, bool at_once)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Every user holding pool claims (present: training) and their sum.
  std::map<uid_t, ShareHolder> PoolHoldersLocked(uint64_t& held_by_all) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The drain of StopSession, under the lock (`drain`: at the end of the
  // iteration in progress and once what the session admitted has run;
  // else at once, the iteration rolled back). `closing` is what its client
  // is told (replacing what an earlier request would have told it).
  std::string StopSessionLocked(const std::string& job_id, JobSession& session,
                                bool drain, Closing closing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Refused(const Caller& caller, absl::string_view kind,
               const absl::Status& why);

  // Constant after construction.
  std::unique_ptr<UnixListener> listener_;
  const Parts parts_;
  const UniqueFd stop_event_;  // eventfd: readable once Shutdown starts
  LogLimiter log_limiter_{5, absl::Seconds(10)};

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
  // Sessions by job id. A session is removed (under mu_) before its
  // connection thread destroys it; RegisterModel holds mu_ while it uses one.
  std::map<std::string, LiveSession> sessions_ ABSL_GUARDED_BY(mu_);
  // By claim id: a job's closing session and its next one may both hold
  // one for a moment.
  std::map<uint64_t, PoolClaim> pool_claims_ ABSL_GUARDED_BY(mu_);
  uint64_t last_claim_ ABSL_GUARDED_BY(mu_) = 0;
  // By requesting uid: when its requests last closed another user's plane,
  // and the job whose request was last allowed to (its at-once follow-up
  // is the same reclaim).
  struct Reclaimer {
    absl::Time last = absl::InfinitePast();
    std::string allowed_for;
  };
  std::map<uid_t, Reclaimer> reclaimers_ ABSL_GUARDED_BY(mu_);
  // By job: when its plane (that serial) was last closed for another
  // user's share; entries older than reclaim_grace are dropped.
  struct GaveWay {
    absl::Time at;
    uint64_t serial = 0;
    uint64_t kept = 0;  // the arena it shrank to; 0: closed
  };
  std::map<std::string, GaveWay> gave_way_ ABSL_GUARDED_BY(mu_);
  // By job: the most arena its next planes are granted since it was asked
  // to shrink (or, after, to grow less than its whole arena), and when;
  // its bytes 0 once it may have its whole arena again.
  struct ArenaCap {
    uint64_t bytes = 0;  // 0: none (it grew back whole)
    absl::Time at;
    std::string why;  // SessionStatus.arena_note
  };
  std::map<std::string, ArenaCap> arena_caps_ ABSL_GUARDED_BY(mu_);
  // By job: the pool claim a plane that closed to move (its client asked
  // to, ArenaAsked) left for the job's next plane, at the arena it was
  // asked (a shrink) or its old one (a grow, made larger at the reopen if
  // the pool still has room), so that nobody takes it meanwhile; dropped
  // at `until` if no plane came for it.
  struct Reservation {
    uint64_t claim_id = 0;
    absl::Time until;
  };
  std::map<std::string, Reservation> reserved_ ABSL_GUARDED_BY(mu_);
  // By job: ShareCounts, and the serial of the job's plane last counted
  // closed (a plane closed at the end of its iteration and then at once,
  // the escalation, is closed once).
  struct JobShareCounts {
    ShareCounts counts;
    uint64_t closed_serial = 0;
  };
  std::map<std::string, JobShareCounts> share_counts_ ABSL_GUARDED_BY(mu_);
  // Optimizer time of the planes no longer in sessions_ with a session
  // (closing or closed), in Nanos: OptimizerSeconds adds the open ones'.
  int64_t closed_optimizer_nanos_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_serial_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SESSION_SESSION_MANAGER_H_
