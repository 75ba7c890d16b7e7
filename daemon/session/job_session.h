#ifndef LOHAN_DAEMON_SESSION_JOB_SESSION_H_
#define LOHAN_DAEMON_SESSION_JOB_SESSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/common/log_limiter.h"
#include "daemon/ipc/entry_validator.h"
#include "daemon/optim/adam.h"
#include "daemon/pool/host_pool.h"
#include "daemon/pool/slot_allocator.h"
#include "daemon/quota/space_ledger.h"
#include "daemon/sched/activation_swap.h"
#include "daemon/sched/fair_queue.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/sched/memory_shares.h"
#include "daemon/session/job_settings.h"
#include "daemon/session/serve_lanes.h"
#include "daemon/store/tensor_store.h"
#include "proto/lohan.pb.h"
#include "wire/arena_grant.h"
#include "wire/ring.h"
#include "wire/ring_entry.h"

namespace lohan {

// One job's data plane while its process is connected: the job's arena from
// the host pool (shared memory, locked in RAM), its slot allocator, the
// submission and completion rings in two control slots of it, and, once the
// model is registered, the job's update pipeline and the thread that serves
// the rings: every submission is checked (EntryValidator, plus the session's
// own checks for the staging ops: weights and optimizer states in and out),
// acted on through the JobPipeline and answered with a completion carrying
// the same request id. A bad entry fails that request with a clear code (its
// text in the error slot); it never crashes the daemon or touches another
// job.
// Destroying the session stops the thread, abandons an iteration in flight
// (its pending versions are rolled back; the last committed iteration stays),
// gives back the model's SSD set-aside and returns the arena's bytes to the
// pool.
class JobSession {
 public:
  // Entries per ring unless [pool] ring_entries says otherwise.
  static constexpr uint32_t kRingCapacity = 1024;
  // The error text area: kErrorTextRecords records (ring_entry.h).
  static constexpr uint64_t kErrorTextBytes =
      kErrorTextRecords * kErrorTextRecordBytes;

  // The session's arena with its two rings of `ring_entries` entries each.
  // RESOURCE_EXHAUSTED when the pool cannot hold `arena_bytes` (rounded up
  // to 4 KiB) or the arena is too small for the rings; INVALID_ARGUMENT for
  // a ring size that is not a power of two; ALREADY_EXISTS while the job
  // has an arena. REQUIRES: `pool` outlives the session.
  static absl::StatusOr<std::unique_ptr<JobSession>> Create(
      HostPool* pool, const std::string& job_id, uint64_t arena_bytes,
      uint32_t ring_entries = kRingCapacity);

  JobSession(const JobSession&) = delete;
  JobSession& operator=(const JobSession&) = delete;
  ~JobSession();

  const std::string& job_id() const { return arena_->job_id(); }

  // Progress for `lohanctl status` (pid is the manager's to fill in).
  v1::SessionStatus Status() const ABSL_LOCKS_EXCLUDED(stats_mu_);
  const ArenaGrant& grant() const { return grant_; }

  // Ends serving once no iteration is in progress and every request
  // admitted has run and been answered (at once between iterations, else
  // after ITER_END or ITER_ABORT: an ITER_END admitted commits and is
  // answered first), then calls `drained` (on the serving thread): the
  // owner closes the session. Entries the client sent after that iteration
  // are left unserved. False when serving has stopped already (lohand's
  // side of a ring broke): nothing will call `drained`, end it otherwise.
  // REQUIRES: SetDrainedCallback before RegisterModel.
  bool RequestDrain();
  // Stops serving now: the serving thread ends, the lanes drop what has not
  // begun and finish what runs (an ITER_END running commits and is
  // answered). Afterwards Status() is final: its iteration is the one the
  // job keeps. Idempotent; the destructor calls it. REQUIRES: called by
  // the session's owner, not concurrently with itself or the destructor.
  void StopServing();
  void SetDrainedCallback(std::function<void()> drained) {
    on_drained_ = std::move(drained);
  }
  // Told of each failure on the daemon's side (see LogFailure), as often
  // as the log is. REQUIRES: set before RegisterModel, as the above.
  void SetFailureCallback(std::function<void(const absl::Status&)> failed) {
    on_failure_ = std::move(failed);
  }
  // Asked at each ITER_END that succeeded, with no lock of the session
  // held: the arena the job's client is asked to move to (its completion's
  // arena_asked; 0: nothing). REQUIRES: set before RegisterModel, as the
  // above.
  void SetArenaAskCallback(std::function<uint64_t()> ask) {
    on_arena_ask_ = std::move(ask);
  }
  // The job's swapped activations outlive this session: its plane closes
  // to move to another arena and the job's next one takes them over
  // (UpdateParts::adopt_activations). REQUIRES: called before the session
  // is destroyed, by its owner.
  void KeepActivations() { keep_activations_ = true; }
  // Whether RegisterModel succeeded (and serving began). Thread-safe.
  bool registered() const { return registered_.load(); }
  // Whether the session has begun an iteration (an ITER_BEGIN ran): a
  // plane that has is training, one that has not is only holding memory.
  bool HasBegunAnIteration() const { return iterations_begun_.load() > 0; }
  // Whether an iteration is in progress (between ITER_BEGIN and its end).
  // REQUIRES: the model is registered.
  bool InIteration() const ABSL_LOCKS_EXCLUDED(validator_mu_);
  // Whether the registered model's weights are resident in the arena (a
  // weight buffer per layer), not streamed from the store.
  // REQUIRES: registered().
  bool weights_resident() const;
  // The registered spec's layer_elements and layer_places (the rest of it
  // cleared): where each layer lies in the model, for the job's plan.
  // REQUIRES: registered().
  const v1::ModelSpec& registered_layers() const;
  // The job's share of the state tier (0 before its pipeline starts or
  // with no tier) and its commit interval, for its plan.
  struct TierUse {
    uint64_t share_bytes = 0;
    uint32_t commit_interval = 1;
    double durable_every_seconds = 0.0;  // > 0: by time instead
  };
  TierUse tier_use() const;
  // Keeps `plan` as the job's activation plan (SessionStatus.plan): the
  // iterations begun after now and committed are counted in
  // planned_iterations and planned_mean_iteration_seconds, from zero.
  void SetPlan(v1::JobPlan plan) ABSL_LOCKS_EXCLUDED(stats_mu_);
  // The plan SetPlan kept, whole (Status() carries its summary); none
  // before one was set.
  std::optional<v1::JobPlan> Plan() const ABSL_LOCKS_EXCLUDED(stats_mu_);
  // The bytes the kept plan holds (kept serialized); 0 without one.
  uint64_t plan_bytes() const ABSL_LOCKS_EXCLUDED(stats_mu_);
  int arena_fd() const { return arena_->arena().fd(); }

  // Lays out the model's slots in the arena, opens (or reopens) its states
  // in `store` and starts serving the rings. Gradient and weight slots are
  // "resident" (one per layer) or "streamed" (spec.grad_slots /
  // weight_slots of them, shared by all layers, the layers' data kept in
  // the store instead; see ModelSpec). INVALID_ARGUMENT for a bad spec;
  // RESOURCE_EXHAUSTED when the slots do not fit the arena (the message
  // suggests streaming) or `ledger` cannot set aside the SSD space the
  // model's updates need (SpaceLedger::SetAside; kept until the session's
  // owner clears it); FAILED_PRECONDITION when a model is registered
  // already or the job's stored states have another shape. The spec is
  // checked whole (CheckModelSpec) before anything is allocated.
  // What a registered model's updates run on and share.
  struct UpdateParts {
    TensorStore* store = nullptr;
    const AdamUpdater* updater = nullptr;
    // May be null: no quotas. Else SetAside's ledger (see above).
    SpaceLedger* ledger = nullptr;
    // May be null. Shares the optimizer with other jobs (the job's flow
    // weighed and grouped as `job` says: PipelineOptions).
    FairQueue* optimizer_queue = nullptr;
    // The daemon's per-job defaults and what it knows of the job, which
    // the spec is resolved against (ResolveJobSettings, job_settings.h)
    // into what the job's pipeline runs with.
    JobDefaults defaults;
    JobContext job;
    // [quotas] daemon_memory (daemon/quota/daemon_memory.h): the job's
    // owner, what the owner holds beside this job's tensors and the limit;
    // a model whose tensors would pass it is refused before any is made.
    uid_t owner = 0;
    uint64_t daemon_memory_held = 0;
    uint64_t daemon_memory_limit = UINT64_MAX;
    // The job's last plane closed to move (KeepActivations): this one
    // takes over the activations it kept instead of freeing them.
    bool adopt_activations = false;
    // Why this plane holds less than its job's arena, as what follows
    // "less than" ("its job's arena of N bytes (..): the job was asked to
    // shrink ..."); empty: it holds its job's arena. A model that does not
    // fit the plane is then refused saying so, and told to lay itself out
    // within it, not to ask for a larger arena.
    std::string smaller_arena;
  };
  // REQUIRES: every part (and the updater's worker pool) outlives the
  // session.
  absl::StatusOr<v1::RegisterModelResponse> RegisterModel(
      const v1::ModelSpec& spec, const UpdateParts& parts)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Model {
    ModelLayout layout;
    v1::ModelSpec layers;  // registered_layers()
    ClipOptions clip;
    v1::DType dtype = v1::DTYPE_UNSPECIFIED;
    uint64_t element_bytes = 0;
    // One per layer (resident) or K < layers (streamed); layer i uses
    // slot i % size() unless the client names another of a streamed K.
    std::vector<Slot> grad_slots;
    std::vector<Slot> weight_slots;
    bool streamed_grads = false;
    bool streamed_weights = false;
    Slot staging;
    Slot error_text;
    std::optional<Slot> activations;
    TensorStore* store = nullptr;
    std::unique_ptr<JobPipeline> pipeline;
    // The job's swapped activations, through the store's fair gate.
    std::unique_ptr<ActivationSwap> activation_swap;
  };

  JobSession(std::unique_ptr<PooledArena> arena,
             std::unique_ptr<SlotAllocator> slots, ArenaGrant grant,
             uint32_t ring_entries);
  uint8_t* base() const { return arena_->arena().base(); }
  // Makes the validator of `model`'s entries: its layout, the next
  // iteration, and, streamed, the K slots an entry must name exactly.
  void MakeValidator(const Model& model, RingDtype dtype);
  // Where `model`'s buffers are, for the client.
  static v1::RegisterModelResponse ResponseFor(const Model& model);
  // Allocates `model`'s slots in the arena for `spec` (its buffers as
  // ChooseArena lays them out in this arena, the staging slot, the error
  // text, the activation area), appending each slot's offset to `taken`
  // (the caller frees them if the registration fails).
  // RESOURCE_EXHAUSTED saying how to fit when the arena cannot hold them,
  // and why it is smaller than its job's (`smaller_arena`,
  // UpdateParts::smaller_arena) when it is.
  absl::Status TakeSlots(const v1::ModelSpec& spec,
                         absl::string_view smaller_arena, Model& model,
                         std::vector<uint64_t>& taken)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The SSD space the job's updates need at most: the tensors a pipeline
  // of `layout` keeps (what its Open makes) in `store`'s blocks.
  static uint64_t UpdateSpace(const TensorStore& store,
                              const ModelLayout& layout,
                              const PipelineOptions& options);

  void Serve();
  // Serve's end when the client broke its submission ring: logged, noted
  // as the job's failure, the data plane closed.
  void StopServingBrokenRing(const absl::Status& why);
  // The lane a request runs in (ServeLanes) unless an earlier request on
  // the same activation is still queued (then it follows that one).
  static ServeLanes::Lane LaneOf(RingOp op);
  // Admits one submission and posts it to its lane, or completes it with
  // the refusal. The serving thread makes no store call.
  void Dispatch(const SubmissionEntry& entry);
  // The admission of an ordered request (staging, ITER_*): its checks and
  // the validator's step, in ring order.
  absl::Status AdmitOrdered(const SubmissionEntry& entry);
  // Acts on an admitted ordered request, on the ordered lane; returns the
  // completion's status, setting `detail`/`flags` for ops that report
  // something.
  absl::Status Handle(const SubmissionEntry& entry, uint64_t& detail,
                      uint32_t& flags);
  // Acts on an admitted urgent or bulk request (GRAD_READY, FETCH_PARAMS,
  // ACT_PUT, ACT_GET, ACT_FREE), on its lane's thread.
  absl::Status Execute(const SubmissionEntry& entry, uint64_t& detail,
                       uint32_t& flags);
  absl::Status AcceptEntry(const SubmissionEntry& entry)
      ABSL_LOCKS_EXCLUDED(validator_mu_);
  // A staging op (INIT/READ_WEIGHTS, READ/INIT_STATE): its fields
  // (CheckStagingEntry), the layer, the staging slot's offset and the
  // layer's fp32 length, and no iteration in progress.
  absl::Status CheckStaging(const SubmissionEntry& entry) const;
  // Resident weights: the layer's weight slot, where the pipeline writes
  // its weights in the model's dtype (updates, INIT_WEIGHTS, a reopened
  // job's committed ones, and the committed ones back after a failed or
  // aborted iteration). Streamed: null (the weights stay in the store until
  // FETCH_PARAMS).
  uint8_t* ResidentWeights(size_t layer) const;
  void Complete(const SubmissionEntry& entry, const absl::Status& status,
                uint64_t detail, uint32_t flags);
  // Activations swapped out through the daemon live in the store as
  // "act.<id>" tensors of the job, for the life of the session.
  absl::Status SwapActivation(const SubmissionEntry& entry);
  void DropActivations();
  // Adds to the session's SSD byte counts (status).
  void CountSsd(uint64_t read, uint64_t written) ABSL_LOCKS_EXCLUDED(stats_mu_);
  // A failed request in the log: at warn when the daemon's side failed
  // (full or failing SSD, damaged data), else at debug.
  void LogFailure(const SubmissionEntry& entry, const absl::Status& status);
  // Adds to the session's count of swapped-out activations (status).
  void CountSwapped(int64_t activations, int64_t bytes)
      ABSL_LOCKS_EXCLUDED(stats_mu_);

  std::unique_ptr<PooledArena> arena_;
  std::unique_ptr<SlotAllocator> slots_;
  const ArenaGrant grant_;
  const uint32_t ring_entries_;

  absl::Mutex mu_;
  // Set once by RegisterModel, then used by the serving thread and the
  // lanes.
  std::optional<Model> model_ ABSL_GUARDED_BY(mu_);
  Model* served_ = nullptr;              // = &*model_ once serving
  std::atomic<bool> registered_{false};  // RegisterModel has returned it
  // Holds the model's SSD set-aside, given back when the session ends.
  SpaceLedger* ledger_ ABSL_GUARDED_BY(mu_) = nullptr;
  mutable absl::Mutex validator_mu_;
  std::optional<EntryValidator> validator_;  // Accept under validator_mu_
  std::optional<RingConsumer> submissions_;  // the serving thread's
  // Completions come from the serving thread (refusals) and the lanes.
  absl::Mutex complete_mu_;
  std::optional<RingProducer> completions_ ABSL_GUARDED_BY(complete_mu_);
  uint64_t error_sequence_ ABSL_GUARDED_BY(complete_mu_) = 0;
  std::unique_ptr<ServeLanes> lanes_;  // created before serving starts
  std::atomic<const ServeLanes*> lanes_ready_{nullptr};      // for Status()
  std::atomic<const JobPipeline*> pipeline_ready_{nullptr};  // likewise
  // The read-ahead memory's shares, once registered (may stay null).
  std::atomic<const MemoryShares*> read_ahead_shares_{nullptr};
  std::atomic<bool> drain_requested_{false};
  std::function<void()> on_drained_;
  std::function<void(const absl::Status&)> on_failure_;
  std::function<uint64_t()> on_arena_ask_;
  // Activation requests posted and not done, by activation id: the lane
  // they run on and how many.
  absl::Mutex activations_mu_;
  absl::flat_hash_map<uint64_t, std::pair<ServeLanes::Lane, size_t>>
      activations_in_flight_ ABSL_GUARDED_BY(activations_mu_);
  // Written by the lanes (and RegisterModel), read by Status().
  // Failures the operator must see, a few a minute per kind.
  LogLimiter failure_log_{3, absl::Seconds(60)};
  mutable absl::Mutex stats_mu_;
  // stats_.plan is the summary of the plan kept serialized in plan_ (a
  // tenth of its bytes as a message: it holds a string per decision).
  v1::SessionStatus stats_ ABSL_GUARDED_BY(stats_mu_);
  std::optional<std::string> plan_ ABSL_GUARDED_BY(stats_mu_);
  // ITER_BEGINs handled (the ordered lane counts), and how many there had
  // been when the plan was set: later ones are the plan's.
  std::atomic<uint64_t> iterations_begun_{0};
  uint64_t begun_before_plan_ ABSL_GUARDED_BY(stats_mu_) = 0;
  absl::Time iteration_began_;  // the ordered lane only
  std::atomic<bool> stopping_{false};
  bool keep_activations_ = false;  // KeepActivations
  bool serving_stopped_ = false;   // StopServing's, on the owner's thread
  std::thread server_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SESSION_JOB_SESSION_H_
