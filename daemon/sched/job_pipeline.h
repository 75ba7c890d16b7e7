#ifndef LOHAN_DAEMON_SCHED_JOB_PIPELINE_H_
#define LOHAN_DAEMON_SCHED_JOB_PIPELINE_H_

// The daemon-side update pipeline of one job (active gradient offloading,
// paper Figure 3b): as each layer's gradient arrives during backward, the
// layer's optimizer states are read from the SSD store chunk by chunk,
// updated with Adam on the CPU, written back as new pending versions, and the
// next iteration's 16-bit weights are written where the client reads them
// (its buffer, or store tensors when they are streamed). At the end of the
// iteration the global gradient norm decides: commit all chunks at once, redo
// with clipped gradients, or skip.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/optim/adam.h"
#include "daemon/sched/bounded_queue.h"
#include "daemon/sched/buffer_pool.h"
#include "daemon/sched/fair_queue.h"
#include "daemon/sched/grad_scratch.h"
#include "daemon/sched/memory_shares.h"
#include "daemon/sched/state_tier.h"
#include "daemon/sched/weight_handoff.h"
#include "daemon/store/aligned_buffer.h"
#include "daemon/store/tensor_store.h"
#include "layout/job_meta.h"
#include "layout/job_space.h"
#include "layout/model_layout.h"

namespace lohan {

enum class Schedule {
  // Figure 3b: reader, compute and writer threads overlap across chunks and
  // layers, and with the caller's backward pass (updates start at submit).
  kPipelined,
  // Figure 3a: starts at submit, but one chunk at a time:
  // read -> compute -> write, then the next chunk.
  kSerialized,
  // ZeRO-Offload/Infinity style: nothing runs until EndIteration, which
  // then runs every layer through the pipelined stages.
  kAfterBackward,
};

// What a clipped (or skipped) iteration costs.
enum class ClipSchedule {
  // Every chunk is updated as its gradient arrives; when the global norm
  // then calls for clipping, every update is rolled back and redone with
  // the clip scale (a second pass over all states).
  kRedoAll,
  // Each chunk's gradient sum of squares is taken before its update. While
  // the running sum leaves the outcome open, chunks update as they arrive;
  // once it makes clipping (or, with skip_nonfinite, a skip) certain, the
  // remaining chunks wait for EndIteration, which then runs them and redoes
  // only the chunks updated before, in forward order (layer 0 first). An
  // iteration may also start deferred (PipelineOptions::predict_clipping).
  // Results are bit-identical to kRedoAll's: the same norm (see
  // AdamUpdater::GradSumSquares), the same scale, the same updates.
  kDeferWhenCertain,
};

struct PipelineOptions {
  Schedule schedule = Schedule::kPipelined;
  ClipSchedule clip_schedule = ClipSchedule::kDeferWhenCertain;
  // kDeferWhenCertain: an iteration starts deferred (no chunk updated
  // before the norm is known) when the last committed iteration of this
  // pipeline clipped, since clipping runs in streaks (a run that clips
  // mostly clips again). Only the time depends on it: a wrong guess costs
  // updating after backward instead of during it, never an extra pass.
  // kAfterBackward always starts deferred.
  bool predict_clipping = true;
  // EndIteration returns once the global norm has decided the outcome; the
  // updates still to run then (deferred chunks, a clip redo) go on in
  // forward order, layer 0 first, while the caller runs its next forward,
  // and the iteration commits when they are done (IterationReport::
  // settling). The caller must WaitLayer(l) (ReadWeight16 and ReadWeights
  // do it) before it uses layer l's new 16-bit weights, so no weight is used
  // before its update; every other control call waits for the commit.
  bool settle_in_background = false;
  // Chunk buffers (each the largest chunk's state, block-aligned): the
  // host memory in flight. >= 3 lets a read, a compute and a write run at
  // once; kSerialized always uses 1.
  size_t buffers = kDefaultChunkBuffers;
  // kDeferWhenCertain, kPipelined: host memory (bytes: the buffers of as
  // many chunks as fit, in forward order, each sized for its chunk, see
  // read_ahead_buffer_bytes) this job may fill, during backward, with the
  // committed states of chunks whose updates wait for the norm, so that
  // those updates need no SSD read after it (with streamed gradients, in
  // the SSDs' time between gradient stores, and a gradient that comes
  // after its chunk's state stays beside it). Read ahead in forward order
  // (layer 0 first: the chunks the settle runs first) once waiting is
  // certain or predicted. Buffers are made as read-ahead first needs them
  // and kept while iterations use them. 0: no read-ahead. Only the time
  // depends on it, never the results.
  uint64_t read_ahead_bytes = 0;
  // read_ahead_bytes is a cap, and each iteration reads ahead as many
  // chunks as backward's idle SSD time fills: the cap at first; after an
  // iteration that queued them at its start (clipping predicted) and had
  // not read them all when the norm was known, as many as were; after one
  // that had, a quarter more (one at least). Spare buffers beyond the next
  // growth are given back, so the memory held follows what backward can use.
  // False: every iteration reads ahead up to the cap.
  bool read_ahead_adapts = false;
  // Shares the read-ahead memory with other jobs: a chunk is read ahead
  // into a new buffer only while this job (flow `job`, in the group
  // `fair_group`, weighed `weight`) is within its share, and buffers beyond
  // it are given back at the end of the iteration. Null: read_ahead_bytes
  // alone bounds it. REQUIRES: outlives the pipeline.
  MemoryShares* read_ahead_shares = nullptr;
  // Makes a read-ahead buffer of the given bytes (aligned, zero-filled);
  // null: AlignedBuffer. A seam for tests that hold an allocation up: new
  // buffers are made on a thread of their own, so the read stage never
  // waits for memory to be mapped and zeroed once the norm is known.
  std::function<std::unique_ptr<AlignedBuffer>(size_t)> make_read_ahead_buffer;
  // The state tier (state_tier.h): host memory that keeps copies of the
  // committed states of the job's first chunks in forward order, within
  // the job's share (flow `job`, group `fair_group`, `weight`), so their
  // updates read no state from the SSDs. Write-through: every version is
  // still written to the store, so durability and results are unchanged.
  // No shares: off. REQUIRES: the shares outlive the pipeline.
  StateTierMemory state_tier;
  // Durability by commit interval (with a state tier): iteration k is
  // committed durably when k is a multiple of this (and at MakeDurable,
  // InitializeWeights, InitState and destruction); in between, the new
  // states of the chunks the tier holds stay in RAM, unwritten, and the
  // store's other versions are committed volatile (TensorStore), so a
  // crash resumes at the last durable iteration, every tensor alike. A
  // chunk whose committed state only the tier holds updates only after the
  // iteration's outcome is known (no clip redo, no skip touches it); should
  // the iteration fail after such an update, the pipeline is done (ABORTED,
  // as after a failed settle): open the job again to resume at the last
  // durable iteration. 1: every iteration durable (the tier written
  // through). > 1 needs kDeferWhenCertain and no keep_previous_commit.
  uint32_t commit_interval = 1;
  // Durability by time instead (> 0; commit_interval is then not used):
  // an iteration is committed durably when at least this many seconds
  // passed since the last durable commit (or since Open), so a crash of
  // lohand loses at most about this much training; the same rules and
  // needs as a commit_interval above 1.
  double durable_every_seconds = 0.0;
  // With durable_every_seconds: > 0 stretches the spacing so that a durable
  // commit's state writes take at most this share of the time
  // (DurableSpacingSeconds, layout/durability.h; lohand's "auto").
  double durable_write_share = 0.0;
  // The clock durable_every_seconds is read on (seconds, monotonic); null:
  // the steady clock. Tests give their own.
  std::function<double()> durability_clock;
  // Streamed gradients (a client with fewer gradient buffers than layers):
  // SubmitGradients copies the gradient into per-iteration scratch tensors
  // of the store (StateLayout::GradScratchName) before it returns, so the
  // caller may reuse its buffer at once; the read stage reads each chunk's
  // gradient back next to its states, for the first pass and a clip redo.
  // Scratch is never committed; it is deleted when the iteration ends
  // (whatever the outcome), when the pipeline is destroyed, and at Open.
  // Costs per iteration: the gradients written once and read once per pass.
  // With a state tier whose share for the job has room beyond the states it
  // places, the scratch is host memory instead (grad_scratch.h; no SSD
  // traffic: one copy of the gradient into it) while
  // `streamed_gradients_in_tier`.
  bool stream_gradients = false;
  bool streamed_gradients_in_tier = true;
  // Streamed 16-bit weights (fewer weight buffers than layers): the new
  // 16-bit copy of each chunk goes to a store tensor
  // (StateLayout::Weight16Name) written as a pending version and committed
  // with the states, so a skipped, failed or abandoned iteration keeps the
  // committed copy; ReadWeight16 reads it. InitializeWeights writes the
  // initial copy; Open rebuilds copies that are missing or stale (written by
  // a run that did not stream them). SubmitGradients' weight16_out must then
  // be null.
  bool stream_weight16 = false;
  // An fp32 layout's weight16_out receives the updated fp32 weights
  // themselves (4 bytes each) rather than a 16-bit copy: a client keeps
  // its fp32 model's weights in that buffer and needs no read of the
  // states for them. Not with stream_weight16.
  bool fp32_weights_out = false;
  // Streamed weights: the client fetches each layer's new weights once its
  // update is done (ReadWeight16 with stream_weight16, else ReadWeights).
  // Each chunk's new weights are then kept in host memory as its update
  // writes them (WeightHandoffFor, layout/job_space.h: twice `buffers`
  // chunks', those the next forward fetches first) until fetched, rolled
  // back, or the next iteration begins; a fetch once the norm is known
  // (while the iteration settles, or after it) takes them instead of
  // reading the SSDs. Other chunks, and the masters of chunks the state
  // tier holds (its copy serves them), are fetched as without it. Only the
  // time and the SSD traffic depend on it, never what is fetched.
  bool hand_off_weights = false;
  // A job with no states yet (no meta, or a meta left by an earlier Open
  // before any layer got weights): the iteration its meta starts at, so the
  // first update is Adam step initial_iteration + 1 (a checkpoint restored
  // into a new job: InitializeWeights and InitState, then train on). A job
  // with states resumes at its committed iteration; a nonzero
  // initial_iteration other than that is FAILED_PRECONDITION at Open (0:
  // whatever is stored).
  uint64_t initial_iteration = 0;
  // A data-parallel rank's job (one shard of a run whose ranks commit each
  // iteration independently): each iteration's commit keeps the states it
  // replaces (TensorStore::CommitBatchKeepingPrevious), and BeginIteration
  // frees them first, so a rank whose peers stopped before committing an
  // iteration can go back to the one they all committed (revert_last_commit)
  // and no tensor ever holds more than two versions in an iteration.
  // REQUIRES of the caller: BeginIteration(k + 1) only once every rank has
  // committed iteration k (AwaitCommitted on each, then an agreement).
  bool keep_previous_commit = false;
  // Open goes back to the commit before the last one kept
  // (keep_previous_commit), before anything else: the job resumes one
  // iteration earlier. FAILED_PRECONDITION (nothing changed) if the job
  // keeps none (KeepsPreviousCommit).
  bool revert_last_commit = false;
  // The caller knows the store has held this job's states (lohand's
  // registry saw them made): a store with none (no committed meta) lost
  // them, and Open is DATA_LOSS naming the job instead of starting it anew.
  bool expect_stored_states = false;
  // Shares the optimizer with other jobs: each chunk's update waits for
  // this job's turn (its flow is the job, in the group `fair_group` (its
  // owner; empty: alone) weighed `weight`, cost the chunk's parameters).
  // Null: the pipeline updates as soon as it can.
  // REQUIRES: outlives the pipeline.
  FairQueue* optimizer_queue = nullptr;
  double weight = 1.0;
  std::string fair_group;
};

struct ClipOptions {
  // > 0: clip the global L2 norm of all gradients to this, as
  // torch.nn.utils.clip_grad_norm_ (scale = max/(norm + 1e-6), applied when
  // it is < 1). 0: off. Negative or NaN: INVALID_ARGUMENT.
  double max_grad_norm = 0.0;
  // A gradient with inf/NaN: true skips the iteration (states untouched,
  // step not advanced; every weight16_out chunk updated before the skip was
  // certain is re-filled from the committed weights, the others were not
  // written);
  // false commits the update as computed, as torch would (no clipping).
  bool skip_nonfinite = true;
};

struct StageBusy {  // Seconds each stage thread spent working.
  double read = 0.0;
  double compute = 0.0;
  double write = 0.0;
  // Streamed gradients: seconds SubmitGradients spent storing them (on the
  // caller's thread, before it returned).
  double grad_store = 0.0;
  // kDeferWhenCertain with resident gradients: seconds the read stage spent
  // taking chunks' gradient sums of squares before deciding.
  double norm = 0.0;
  // Chunks whose update found its state read ahead (read_ahead_bytes).
  uint64_t read_ahead_used = 0;
  // Of their streamed gradients, the bytes SubmitGradients copied into the
  // states' read-ahead buffers instead of storing them (the updates read
  // them there): the SSDs moved twice as many bytes less.
  uint64_t grad_bytes_kept_ahead = 0;
  // State bytes the state tier gave the updates instead of the store, and
  // of them those updated where the tier holds them (the rest copied).
  uint64_t bytes_from_tier = 0;
  uint64_t bytes_in_tier = 0;
  // Host memory bytes the updates read and wrote (states, gradients, the
  // weights' copies), and those the stages copied (memcpy) on top to run
  // them (states from and into the tier, fp32 weight copies); not the
  // store's transfers.
  uint64_t bytes_updated = 0;
  uint64_t bytes_copied = 0;
  // Of bytes_copied, the new weights kept for the client's fetch
  // (hand_off_weights).
  uint64_t bytes_handed_off = 0;
  // Bytes moved to and from the store: states, streamed gradients and
  // 16-bit copies (not the meta, nor the commit's sync).
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
};

struct IterationReport {
  uint64_t iteration = 0;  // Committed iterations (= Adam steps) after it.
  // Chunks updated before the norm was known, chunks left for EndIteration
  // (kDeferWhenCertain), and chunks updated twice (a clip redo).
  uint64_t eager_chunks = 0;
  uint64_t deferred_chunks = 0;
  uint64_t redone_chunks = 0;
  // Of the eager chunks, those whose update had not begun when the outcome
  // became certain: dropped then, run once after the norm (not redone).
  uint64_t dropped_chunks = 0;
  bool started_deferred = false;  // Predicted (or kAfterBackward).
  // Returned with updates still running (settle_in_background): `iteration`
  // is the one they commit. Their work is counted in the next report's busy.
  bool settling = false;
  // Of the submitted (unclipped) gradients; given a global sum of squares,
  // its square root.
  double global_norm = 0.0;
  bool nonfinite = false;     // A gradient held inf/NaN.
  bool clipped = false;       // The update was redone with scaled gradients.
  double clip_scale = 1.0;    // The gradient scale of the committed update.
  bool skipped = false;       // Nothing committed (non-finite, skipped).
  double wait_seconds = 0.0;  // From EndIteration's call to its return.
  // The pass after the norm is known: a clip redo, deferred updates, or a
  // 16-bit re-publish after a skip.
  double redo_seconds = 0.0;
  double commit_seconds = 0.0;  // Meta write + CommitBatch.
  StageBusy busy;               // All passes of the iteration.
};

// One job's states and update pipeline. The states live in `store` under
// job `job`: one tensor per (layer, chunk) (see StateLayout) and a meta
// tensor (JobMeta: layout fingerprint, iteration), committed together.
//
// Thread-safety: all methods may be called from any thread. Control calls
// (InitializeWeights, BeginIteration, EndIteration) run one at a time;
// SubmitGradients never waits for stage work. Owns four stage threads
// (decide, read, compute, write), joined by the destructor.
class JobPipeline {
 public:
  // Opens job `job`: a new one gets its tensors and a meta at iteration
  // options.initial_iteration (normally 0); an existing one must have the
  // same LayoutFingerprint (FAILED_PRECONDITION otherwise) and resumes at
  // its committed iteration (see PipelineOptions::initial_iteration).
  // Pending versions left by an earlier pipeline are rolled back.
  // REQUIRES: `store` outlives the pipeline; the updater's worker pool
  // outlives it; no other JobPipeline has `job` open.
  static absl::StatusOr<std::unique_ptr<JobPipeline>> Open(
      TensorStore* store, const AdamUpdater& updater, std::string job,
      const ModelLayout& layout, const PipelineOptions& options);

  JobPipeline(const JobPipeline&) = delete;
  JobPipeline& operator=(const JobPipeline&) = delete;
  // Stops the stages (an iteration in flight is abandoned: work not begun
  // is dropped, store calls in progress finish), joins the threads, and
  // rolls back pending versions (best effort). The committed states stay.
  // REQUIRES: no call in progress on another thread.
  ~JobPipeline();

  const std::string& job() const { return job_; }
  const StateLayout& state_layout() const { return state_; }
  uint64_t iteration() const ABSL_LOCKS_EXCLUDED(mu_);
  // The last iteration committed durably: what a restart resumes at
  // (PipelineOptions::commit_interval).
  uint64_t durable_iteration() const ABSL_LOCKS_EXCLUDED(mu_);
  // Between iterations: commits the job's states durably now, those only
  // the state tier holds written first (a drain, a checkpoint). A no-op
  // when they are; FAILED_PRECONDITION in an iteration.
  absl::Status MakeDurable() ABSL_LOCKS_EXCLUDED(api_mu_, mu_);
  bool layer_initialized(size_t layer) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the job keeps the commit before its last one, i.e. can go back
  // to iteration() - 1 (PipelineOptions::revert_last_commit at the next
  // Open).
  bool KeepsPreviousCommit() const;
  // Waits until the last iteration has committed (settle_in_background),
  // then the committed iteration; the settle's error if it failed
  // (ABORTED, see WaitLayer). Between iterations, what iteration() says.
  absl::StatusOr<uint64_t> AwaitCommitted() const ABSL_LOCKS_EXCLUDED(mu_);
  // Between iterations, once every rank has committed the last one (the
  // caller's agreement, as for BeginIteration): frees the states the last
  // commit kept now rather than at the next BeginIteration (a run closing:
  // an idle job holds one version of its states). FAILED_PRECONDITION in
  // an iteration; the settle's error if it failed. OK with nothing kept.
  absl::Status ReleasePreviousCommit() ABSL_LOCKS_EXCLUDED(api_mu_, mu_);

  // Stores `weights` (layer_elements(layer) floats) as the layer's fp32
  // master weights with zero moments (and, streaming 16-bit weights, their
  // 16-bit copy), committed (one CommitBatch per layer). Once committed,
  // a non-null `weight_copy_out` receives the weights as SubmitGradients'
  // weight16_out receives them (see ReadWeightCopy); on error it is not
  // written. FAILED_PRECONDITION if the layer already has states or an
  // iteration is in progress.
  absl::Status InitializeWeights(size_t layer, const float* weights,
                                 void* weight_copy_out = nullptr)
      ABSL_LOCKS_EXCLUDED(api_mu_, mu_);
  // The current fp32 master weights of `layer` into `out`
  // (layer_elements(layer) floats): during an iteration the committed ones
  // (the previous weights); while an iteration settles, once WaitLayer says
  // the layer is updated, its new (pending) ones; otherwise the committed
  // ones. A non-null `from_memory` receives how many of the bytes came
  // from lohand's memory (hand_off_weights, the state tier), not the SSDs.
  absl::Status ReadWeights(size_t layer, float* out,
                           uint64_t* from_memory = nullptr) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The weights ReadWeights reads, converted as the updates convert them
  // for SubmitGradients' weight16_out (layer_elements(layer) elements of
  // weight16_dtype, or fp32 with fp32_weights_out), into `out`: e.g. the
  // committed copy for a buffer that outlives this pipeline. Errors as
  // ReadWeights'.
  absl::Status ReadWeightCopy(size_t layer, void* out) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // With stream_weight16: the current 16-bit copy of `layer`'s weights
  // (layer_elements(layer) elements of weight16_dtype) into `out`, chosen
  // as ReadWeights chooses (the previous iteration's during one; the new
  // one of a settling iteration once the layer is updated).
  // FAILED_PRECONDITION without stream_weight16 or before the layer has
  // states; ABORTED after a failed settle (see WaitLayer). `from_memory`
  // as ReadWeights'.
  absl::Status ReadWeight16(size_t layer, void* out,
                            uint64_t* from_memory = nullptr) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The committed Adam moment `part` of `layer` into `out`
  // (layer_elements(layer) floats; widened from bf16 when the layout keeps
  // bf16 moments). INVALID_ARGUMENT: layer out of range, null `out`, a part
  // that is not a StatePart, kMaxExpAvgSq without AMSGrad.
  // FAILED_PRECONDITION: during an iteration, or before the layer has states.
  absl::Status ReadState(size_t layer, StatePart part, float* out) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces the committed Adam moment `part` of `layer` with `values`
  // (layer_elements(layer) floats; rounded to nearest even when the layout
  // keeps bf16 moments, as the optimizer rounds them), committed for all of
  // the layer's chunks at once (one CommitBatch): on error nothing changes.
  // The weights, their streamed 16-bit copies and the other moments stay
  // as they were. Errors as ReadState's (the layer needs states:
  // InitializeWeights first).
  absl::Status InitState(size_t layer, StatePart part, const float* values)
      ABSL_LOCKS_EXCLUDED(api_mu_, mu_);

  // Deletes every per-iteration scratch tensor (StateLayout::kScratchPrefix)
  // of `job`: what a pipeline that died mid-iteration (crash, kill) left.
  // Open does it; the daemon also does it for every job at start. REQUIRES:
  // no pipeline has `job` open. Returns the first error other than
  // NOT_FOUND.
  static absl::Status DropScratchTensors(TensorStore* store,
                                         absl::string_view job);

  // Starts an iteration whose gradients are all multiplied by `grad_scale`
  // (1/loss_scale with fp16 loss scaling; the global norm is then that of
  // the unscaled gradients). FAILED_PRECONDITION if one is in progress or a
  // layer has no states yet; INVALID_ARGUMENT for a scale that is not
  // finite and > 0, or a max_grad_norm that is not >= 0.
  // `lr` (>= 0; 0 too, the first step of a warmup) replaces the layout's
  // learning rate for this iteration (a schedule's value); nullopt keeps
  // it. `clip` is what EndIteration applies; it
  // is known from the start so that updates can wait for the norm once
  // clipping is certain (ClipSchedule::kDeferWhenCertain).
  absl::Status BeginIteration(float grad_scale = 1.0f,
                              std::optional<double> lr = std::nullopt,
                              const ClipOptions& clip = {})
      ABSL_LOCKS_EXCLUDED(api_mu_, mu_);
  // Hands over `layer`'s gradient (layer_elements(layer) elements of the
  // layout's grad_dtype) and where a copy of its new weights goes (as many
  // elements of weight16_dtype, or of fp32 with fp32_weights_out; null: no
  // copy, or streamed to the store).
  // Returns at once; the update runs in the stage threads (at EndIteration
  // for kAfterBackward).
  // REQUIRES: `grad` and `weight16_out` stay valid, `grad` unchanged and
  // `weight16_out` untouched by the caller, until EndIteration (or
  // AbortIteration) returns (or the pipeline is destroyed). With
  // stream_gradients, `grad` only until this returns: it returns once the
  // gradient is in the store (it waits for that write, never for stage work).
  // INVALID_ARGUMENT: layer out of range, null grad, a weight16_out while
  // streaming 16-bit weights. ALREADY_EXISTS: the layer was submitted
  // already in this iteration. FAILED_PRECONDITION: no iteration in
  // progress (or EndIteration already called). Streaming gradients, a store
  // error writing them (the layer then counts as not submitted).
  absl::Status SubmitGradients(size_t layer, const void* grad,
                               void* weight16_out)
      ABSL_LOCKS_EXCLUDED(api_mu_, mu_);
  // Waits for every submitted layer, then commits, clips or skips as the
  // iteration's ClipOptions say (running the deferred chunks and redoing
  // the updated ones as needed, see ClipSchedule). Every layer must have been
  // submitted (FAILED_PRECONDITION otherwise). On any error the iteration ends
  // with every pending version rolled back and the step not advanced, and
  // every weight16_out buffer given this iteration holds the committed
  // weights again (ReadWeightCopy's values, bit for bit), so the caller's
  // next forward needs no repair; should reading them back fail too, the
  // error says so and those buffers hold unspecified values. Store errors
  // name the layer, chunk and tensor. (ABORTED for an earlier iteration
  // whose settle failed, see WaitLayer, ends nothing: the pipeline is done.)
  //
  // `global_sum_squares` (data-parallel ranks whose pipelines each hold one
  // shard of every layer): the sum of squares of every rank's gradients
  // times grad_scale, as ChunkSumSquares counts them, the same on every
  // rank. Given, it alone decides the outcome (nonfinite, skip, clip scale)
  // and global_norm is its square root; this pipeline's own sum, a lower
  // bound of it, only lets updates wait early (kDeferWhenCertain), which
  // never changes the result: should the given sum decide otherwise (it
  // may be rounded below the own sum), the waiting chunks run unclipped,
  // and updates made before a clip the own sum did not foresee are redone.
  // So pipelines holding parts of a model, each given the sum over all of
  // them, commit what one pipeline of the whole model commits, bit for bit,
  // when the sums agree. inf/NaN: a non-finite gradient somewhere.
  // INVALID_ARGUMENT when it is negative (-0.0 too), with the iteration
  // still in progress, nothing changed.
  absl::StatusOr<IterationReport> EndIteration(
      std::optional<double> global_sum_squares = std::nullopt)
      ABSL_LOCKS_EXCLUDED(api_mu_, mu_);
  // With settle_in_background: waits until `layer`'s updates of the
  // iteration settling now are done (its new 16-bit copy written), at once
  // when none is settling or the layer has none left. ABORTED when that
  // iteration's updates failed: it is rolled back (iteration() stays at the
  // one before), and this pipeline refuses every later call with that
  // error (open the job again to go on from the committed iteration).
  // INVALID_ARGUMENT for a layer out of range.
  absl::Status WaitLayer(size_t layer) const ABSL_LOCKS_EXCLUDED(mu_);
  // Layers whose updates of the settling iteration are not all done yet
  // (0 when none is settling): how far the optimizer trails the caller.
  size_t layers_settling() const ABSL_LOCKS_EXCLUDED(mu_);
  // Read-ahead (PipelineOptions::read_ahead_bytes): the chunks the budget
  // holds (0: off), and those whose states are read ahead now, waiting for
  // their update.
  size_t read_ahead_budget_chunks() const { return read_ahead_chunks_; }
  // The chunks the next iteration reads ahead at most (the budget's, or
  // with read_ahead_adapts what backward filled last).
  size_t read_ahead_target_chunks() const ABSL_LOCKS_EXCLUDED(mu_);
  // The bytes of each chunk buffer (one read-ahead takes one), and of the
  // fixed pool of them (PipelineOptions::buffers; read-ahead not counted).
  uint64_t chunk_buffer_bytes() const { return buffer_bytes_; }
  // The bytes of chunk `flat`'s read-ahead buffer: its own parts' (a small
  // chunk, such as a layer's last, takes no more).
  uint64_t read_ahead_buffer_bytes(size_t flat) const {
    return chunk_buffers_[flat].bytes;
  }
  uint64_t chunk_pool_bytes() const {
    return pool_.count() * pool_.buffer_bytes();
  }
  // The most host memory the weight handoff takes (hand_off_weights; 0:
  // off), and the chunks it holds now.
  uint64_t handoff_bytes() const { return handoff_.capacity_bytes(); }
  size_t chunks_handed_off() const { return handoff_.chunks_kept(); }
  size_t chunks_read_ahead() const ABSL_LOCKS_EXCLUDED(mu_);
  // The state tier's use by this job now (PipelineOptions::state_tier).
  StateTier::Stats tier_stats() const { return tier_.stats(); }
  // Of the job's tier share, what keeps its streamed gradients now.
  uint64_t tier_grad_bytes() const { return grad_scratch_.bytes_held(); }
  uint32_t commit_interval() const { return options_.commit_interval; }
  // With durability by time, the seconds from one durable iteration to the
  // next now (durable_write_share may stretch durable_every_seconds); 0
  // by steps.
  double durable_every_seconds() const ABSL_LOCKS_EXCLUDED(mu_);
  // What the last durable commit wrote only to be durable (the states of
  // chunks the tier holds; chunks on the SSDs alone are written every
  // iteration): the writes whose time durable_write_share weighs.
  uint64_t last_durable_write_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Seconds since the last durable commit (or Open): with durable_iteration
  // and iteration, what a crash of lohand would lose now.
  double seconds_since_durable() const ABSL_LOCKS_EXCLUDED(mu_);

  // Ends the iteration in progress with nothing committed: work not begun
  // is dropped, work in progress finishes, every pending version and the
  // iteration's scratch are dropped, the step does not advance (the
  // client's backward failed half-way, say). Every weight16_out buffer
  // given this iteration then holds the committed weights again, as after
  // a failed EndIteration. FAILED_PRECONDITION when no iteration is in
  // progress; otherwise a store error from the rollback or from reading
  // the committed weights back (the iteration is over either way; a buffer
  // whose read failed holds unspecified values).
  absl::Status AbortIteration() ABSL_LOCKS_EXCLUDED(api_mu_, mu_);

 private:
  // kSettling: EndIteration returned, its last updates still run.
  enum class Phase { kIdle, kInIteration, kEnding, kSettling };
  // kReadAhead: read a chunk's committed state into a buffer of its own
  // and keep it (staged_) for the chunk's update after the norm.
  enum class TaskKind : uint8_t { kUpdate, kRepublish, kReadAhead };
  struct Task {  // One chunk through the stages.
    uint32_t layer = 0;
    uint32_t chunk = 0;
    TaskKind kind = TaskKind::kUpdate;
    float inv_scale = 1.0f;
    // The first pass of kDeferWhenCertain: the read stage takes the chunk's
    // gradient sum of squares first and defers the chunk when the running
    // sum makes its update certain to be redone or dropped.
    bool decide = false;
    // The pass it was enqueued in (pass_ then): a count of an earlier,
    // abandoned pass is never taken off the current one's. kReadAhead: the
    // read-ahead epoch instead (read_ahead_epoch_ then).
    uint64_t pass = 0;
    double lr = 0.0;   // of the iteration
    int64_t step = 0;  // Adam steps the chunk's committed state has.
    // The chunk's first gradient element (streamed: in `buffer`, once read).
    const uint8_t* grad = nullptr;
    // Its first 16-bit weight (streamed: in `buffer`), or null.
    uint8_t* out = nullptr;
    uint8_t* buffer = nullptr;  // From pool_ (or staged_), once read.
    // `buffer` is the chunk's read-ahead buffer (staged_), not pool_'s.
    bool staged = false;
    // The staged buffer holds the chunk's streamed gradient as well.
    bool staged_grad = false;
    // The chunk's state, once read: in `buffer`, or (`lent`) the state
    // tier's copy itself, updated in place (StateTier::Lend).
    uint8_t* state = nullptr;
    bool lent = false;
  };
  // What became of a chunk in an iteration's first pass. kDropped: decided
  // eager, but not begun when the outcome became certain (so never updated
  // before the norm).
  enum class Fate : uint8_t { kNone, kEager, kDeferred, kDropped };
  // A chunk's state read ahead for its update after the norm.
  struct Staged {
    std::unique_ptr<AlignedBuffer> buffer;
    bool taken = false;  // An update task holds it (Finish frees it).
    // The chunk's streamed gradient is in `buffer` too, at its grad_offset
    // (KeepGradWithState), and nowhere else.
    bool holds_grad = false;
  };
  struct Submission {
    bool submitted = false;
    const void* grad = nullptr;
    void* out = nullptr;
  };

  // INVALID_ARGUMENT naming the model's layer count unless `layer` < it.
  absl::Status LayerInRange(size_t layer) const;
  // OK when `layer` exists, has states and `out` is not null; `what` names
  // the caller in the error.
  absl::Status CheckReadable(size_t layer, const void* out,
                             absl::string_view what) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // CheckReadable, plus: `part` is a StatePart this layout stores and no
  // iteration is in progress.
  absl::Status CheckStateAccess(size_t layer, StatePart part, const void* data,
                                absl::string_view what) const
      ABSL_LOCKS_EXCLUDED(mu_);

  JobPipeline(TensorStore* store, const AdamUpdater& updater, std::string job,
              const ModelLayout& layout, const PipelineOptions& options);
  absl::Status OpenStates();
  // The job's tensor `name` of `bytes`, created if missing when `create`
  // (DATA_LOSS naming `what` otherwise), checked for its size, with any
  // pending version rolled back.
  absl::StatusOr<TensorInfo> OpenTensor(const std::string& name, uint64_t bytes,
                                        bool create, absl::string_view what);
  // Streaming 16-bit weights: creates the weight16 tensors and rebuilds
  // the copies of initialized layers that are missing or stale (`meta`:
  // the committed one), committing them with a meta that marks them
  // current. REQUIRES: OpenStates' checks done.
  absl::Status OpenWeight16(const JobMeta& meta,
                            const std::vector<bool>& initialized);
  void StartThreads();
  // The checks SubmitGradients makes before it takes the gradient.
  absl::Status CheckSubmitLocked(size_t layer, const void* grad,
                                 const void* weight16_out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Streaming gradients: writes `layer`'s gradient into its scratch tensors
  // (kDeferWhenCertain: and takes each chunk's sum of squares, the gradient
  // times `inv_scale`, into norm_squares_ on the way).
  absl::Status WriteGradScratch(size_t layer, const uint8_t* grad,
                                float inv_scale);
  // Copies chunk `flat`'s streamed gradient (`bytes` at `grad`) into the
  // buffer its state was read ahead into, when there is one and the chunk
  // is certain to be updated once, after the norm (deferring_ already:
  // decided deferred, never redone): the update then finds state and
  // gradient together and the SSDs never see the gradient. False (the
  // caller stores it) otherwise.
  bool KeepGradWithState(size_t flat, const uint8_t* grad, uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes the scratch tensors of this iteration's layers (best effort;
  // the next Open sweeps what is left).
  void DropScratch() ABSL_LOCKS_EXCLUDED(mu_);
  // Writes the meta (this pipeline's fingerprint, `iteration`, and whether
  // it keeps the 16-bit copies in the store current) as a pending version.
  absl::Status WriteMeta(uint64_t iteration);
  // The committed meta of a stored job, checked against this layout.
  absl::StatusOr<JobMeta> ReadMeta(const TensorInfo& info) const;
  // Whether the stored states of the job belong together, before it
  // resumes on them (DATA_LOSS naming the job and what is wrong, nothing
  // changed): `meta` (null: none committed) and its store tag, every
  // chunk's info by flat index, which layers have states. States without a
  // meta, a chunk committed at another iteration than the meta, a layer
  // without states in a job that has trained: records the catalog lost.
  absl::Status CheckStatesBelongTogether(
      const JobMeta* meta, uint64_t meta_tag,
      const std::vector<TensorInfo>& chunks,
      const std::vector<bool>& initialized) const;
  // The 16-bit copy of `count` fp32 weights.
  void ToWeight16(const float* weights, uint64_t count, uint16_t* out) const;
  // Bytes per element of the weight copy written to weight16_out: 4 with
  // fp32_weights_out, else 2.
  size_t WeightCopySize() const;
  // The copy of `count` committed or updated fp32 weights into `out`, in
  // the copy's dtype.
  void CopyWeights(const float* weights, uint64_t count, uint8_t* out) const;

  // The Adam update of an update task's chunk (its state in task.buffer):
  // one AdamUpdater::Step per StateLayout::ChunkPieces piece, with its
  // element group's lr and weight decay; the pieces' gradient sums of squares
  // added in order, their non-finite flags or-ed.
  // Reads each chunk's committed state of `layer` in turn into one buffer
  // and hands it to use(chunk, count, state); a failed read names the layer
  // and chunk.
  // `current`: the version ReadCurrent reads instead of the committed one.
  absl::Status ForEachCommittedChunk(
      size_t layer,
      absl::FunctionRef<void(size_t, uint64_t, const uint8_t*)> use,
      bool current = false) const;
  absl::StatusOr<StepStats> StepChunk(const Task& task) const;
  // The gradient sum of squares StepChunk would return for `layer`'s chunk
  // `chunk`, whose first gradient element is `grad`, bit for bit.
  absl::StatusOr<double> ChunkSumSquares(size_t layer, size_t chunk,
                                         const uint8_t* grad,
                                         float inv_scale) const;
  // A decide task's chunk (on the decide thread): its sum of squares into
  // norm_squares_ (resident gradients; streamed ones had it taken at
  // submit), added to the running sum. Returns whether the chunk waits for
  // EndIteration.
  absl::StatusOr<bool> DecideChunk(const Task& task) ABSL_LOCKS_EXCLUDED(mu_);
  // With the running sum `sum_squares` of some gradients, the iteration
  // will certainly clip (or skip): an update made now would be redone or
  // dropped.
  bool OutcomeCertain(double sum_squares) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stage loops, one thread each. The decide stage (kDeferWhenCertain)
  // runs ahead of the read stage, so sums of squares never wait for SSD
  // reads and reads never wait for them.
  void DecideLoop();
  void ReadLoop();
  // The read stage's kReadAhead task: the state into a new buffer, kept in
  // staged_ unless its iteration ended meanwhile. A failed read is
  // dropped: the update reads again, and reports the error. Each of its
  // parts (the store's gate unit) begins only while no streamed gradient
  // is being stored, so it takes the SSDs' idle time in backward and
  // delays a store by one part's read at most.
  void ReadAhead(const Task& task);
  // An update task after the norm takes its chunk's read-ahead state;
  // a first-pass eager task not begun once the outcome is certain is
  // dropped (kDropped). Returns whether the task is done (dropped).
  bool TakeStagedOrDrop(Task& task) ABSL_LOCKS_EXCLUDED(mu_);
  // Frees spare read-ahead buffers, the smallest first: all, or those
  // beyond the job's share of read_ahead_shares_ or beyond `keep` buffers
  // in all.
  void TrimSpareLocked(bool all, size_t keep = SIZE_MAX)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // read_ahead_adapts, at the end of an iteration that read ahead: the
  // next one's target from what this one's backward read before the norm.
  void AdaptReadAheadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Chunks whose state a read-ahead holds, no update having taken it (at
  // the norm none has: only updates after it take them).
  size_t CountStagedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues read-ahead of the first read_ahead_target_ chunks the tier does
  // not hold, in forward order (once per iteration).
  void EnqueueReadAheadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At the end of an iteration: the read-ahead states no task took go
  // back to spare_ (freed, with every spare, when this iteration read
  // nothing ahead: buffers are kept only while iterations use them), and
  // a new epoch starts (read-ahead still in flight is then dropped).
  void EndReadAheadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The smallest spare read-ahead buffer of at least `bytes`, or null when
  // there is none.
  std::unique_ptr<AlignedBuffer> TakeSpareLocked(uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sizes of the buffers the chunks queued for read-ahead from
  // buffer_wanted_from_ on still lack: theirs, less the spares that fit
  // them (smallest first).
  std::vector<uint64_t> BuffersWantedLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits (or rolls back) an iteration once its settling pass is done.
  void SettleLoop();
  // Once a read-ahead finds no spare buffer (buffer_wanted_), makes
  // buffers into spare_ one after another, as many as the iteration
  // queued read-aheads (read_ahead_target_ at most), within the job's
  // share, while iterations read ahead. Allocating and zeroing tens of MiB can
  // take a second on a busy or virtual machine, and holds the training process
  // up beside it: made all at once, in the first iteration that reads ahead,
  // and not one or two more in every backward. On this thread, a read-ahead
  // waits for a buffer only until the norm is known (the read stage is needed
  // then), and a buffer is kept for the next one.
  void MakeReadAheadBuffersLoop();
  // EndIteration's and AbortIteration's start: once no iteration settles,
  // the one in progress moves to kEnding (FAILED_PRECONDITION without one;
  // a failed settle's error).
  absl::Status StartEndingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits while an iteration settles; then its error, if it failed.
  absl::Status AwaitSettledLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads `name`'s version a reader of the weights should see: while an
  // iteration settles (its chunks all have their new pending version),
  // that one; otherwise the committed one. `prefix`: only out.size()
  // bytes of it (TensorStore::ReadPrefix).
  absl::Status ReadCurrentStored(const std::string& name,
                                 absl::Span<uint8_t> out,
                                 bool prefix = false) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // As ReadCurrentStored of chunk `flat`'s state, the state tier's copy
  // standing in for the store when it holds that version.
  absl::Status ReadCurrent(size_t flat, absl::Span<uint8_t> out,
                           bool prefix = false, bool* from_tier = nullptr) const
      ABSL_LOCKS_EXCLUDED(mu_);
  void ComputeLoop();
  void WriteLoop();
  // Ends a task: releases its buffer (if any), records the first error.
  // hand_off_weights: keeps the new weights `task` just wrote for the
  // client's fetch (the masters only where the tier does not hold them;
  // written in backward, only the chunks the handoff would still hold at
  // its end); the bytes copied to keep them.
  uint64_t HandOff(const Task& task, bool in_tier, bool in_backward)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The handoff's generation if what it keeps is what a fetch reads now
  // (the pending versions of a settling iteration, or, idle, the committed
  // ones), for its Take; none during an iteration or while EndIteration
  // decides.
  std::optional<uint64_t> HandoffCurrent() const ABSL_LOCKS_EXCLUDED(mu_);
  void Finish(Task& task, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  size_t FlatIndex(size_t layer, size_t chunk) const {
    return chunk_base_[layer] + chunk;
  }

  // Starts a pass: resets the counters and first error.
  void BeginPassLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `decide`: the chunks' tasks are first-pass decide tasks (Task::decide).
  void EnqueueLayerLocked(size_t layer, TaskKind kind, float inv_scale,
                          bool decide = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnqueueChunkLocked(size_t layer, size_t chunk, TaskKind kind,
                          float inv_scale, bool decide)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PassDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done_ == enqueued_;
  }
  // Waits until every task of the pass finished; its first error.
  absl::Status WaitPass() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every decide task of the pass has decided; the pass's
  // first error.
  absl::Status WaitDecisions() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs a whole pass over every layer (after the first one).
  // `wait` false: returns once they are enqueued.
  absl::Status RunPass(TaskKind kind, float inv_scale, bool wait = true)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Runs a pass over the chunks `include` takes (by flat index), in
  // forward order. `wait` false: returns once they are enqueued. `append`:
  // adds them to the pass in progress (its counters and first error go on).
  absl::Status RunChunkPass(TaskKind kind, float inv_scale,
                            absl::FunctionRef<bool(size_t)> include,
                            bool wait = true, bool append = false)
      ABSL_LOCKS_EXCLUDED(mu_);
  // kDeferWhenCertain's end of an iteration, once the norm decided: the
  // work left (see ClipSchedule), counted in `report`. With `wait` false an
  // update pass is left running; returns whether one is. REQUIRES: the
  // first pass done.
  absl::StatusOr<bool> FinishDeferred(IterationReport& report, float grad_scale,
                                      bool wait) ABSL_LOCKS_EXCLUDED(mu_);
  // kRedoAll's: roll back and redo or republish everything as needed.
  absl::StatusOr<bool> FinishRedoAll(IterationReport& report, float grad_scale,
                                     bool wait) ABSL_LOCKS_EXCLUDED(mu_);
  bool defers() const {
    return options_.clip_schedule == ClipSchedule::kDeferWhenCertain;
  }
  double DurabilityClock() const;
  // Whether the iteration beginning now is committed durably
  // (commit_interval, durable_every_seconds).
  bool DurableNextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double DurableSpacingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every pending version of the job's tensors; NOT_FOUND and "no
  // pending version" are fine. Returns the first other error.
  absl::Status RollbackAll();
  // After an iteration ended with nothing committed (no stage work left,
  // pending versions rolled back): the committed weights' copy into every
  // weight16_out buffer submitted this iteration. The first error.
  absl::Status RestoreWeightCopies() ABSL_LOCKS_EXCLUDED(mu_);
  // Commits the iteration's versions: durably in a durable iteration,
  // volatile otherwise (those only the tier holds not written).
  absl::Status Commit(uint64_t new_iteration);
  // Commit's between durable iterations: the store's pending versions
  // committed volatile, the tier's copies made committed.
  absl::Status CommitVolatile(uint64_t tag);
  // MakeDurable's work. REQUIRES: api_mu_ held, no iteration in progress.
  absl::Status MakeDurableLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(api_mu_);
  // Writes what only the tier holds and commits every tensor of the job
  // durably at the committed iteration.
  absl::Status WriteDurable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(api_mu_);
  // At an iteration's start: the tier's placement, the copies it gives
  // back that the store lacks written and committed (volatile) first.
  void PlaceTier() ABSL_EXCLUSIVE_LOCKS_REQUIRED(api_mu_);
  // After PlaceTier: the streamed gradients' host memory fitted to what
  // the tier's share leaves beside the states.
  void FitGradScratch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(api_mu_);
  // RollbackAll found a version only the tier held overwritten: the job
  // can only go back to its durable iteration (sticky ABORTED).
  void LostTierVersion() ABSL_LOCKS_EXCLUDED(mu_);
  // With keep_previous_commit, the store's ReleasePrevious of the job.
  // REQUIRES: api_mu_ held, no iteration in progress or settling.
  absl::Status ReleaseKeptStates();
  // Open's revert_last_commit: the job's kept commit made current again.
  absl::Status RevertLastCommit();
  void EndIterationIdle() ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  TensorStore* const store_;
  const AdamUpdater updater_;
  const std::string job_;
  const ModelLayout layout_;
  const StateLayout state_;
  const PipelineOptions options_;
  const uint64_t fingerprint_;
  // The iteration the job started at, as its meta says (unknown for a meta
  // written before it did); set by Open, then constant.
  std::optional<uint64_t> first_iteration_;
  std::vector<size_t> chunk_base_;        // Flat index of each layer's chunk 0.
  std::vector<std::string> chunk_names_;  // By flat index.
  // By flat index, when streaming (else empty).
  std::vector<std::string> weight16_names_;
  std::vector<std::string> scratch_names_;
  // By flat index: each chunk's buffer layout, its streamed gradient and
  // 16-bit copy after its state, packed for its own size (in a pool buffer,
  // which fits the largest chunk's, or a read-ahead buffer of that size).
  std::vector<ChunkBufferLayout> chunk_buffers_;
  size_t buffer_bytes_ = 0;  // a pool buffer's: the largest chunk's

  // Written by the compute thread for the task it runs, read by
  // EndIteration after WaitPass (which orders them): per-chunk gradient
  // sums of squares of the current pass, by flat index.
  std::vector<double> sum_squares_;
  // kDeferWhenCertain: per-chunk gradient sums of squares of the iteration
  // (GradSumSquares), by flat index; the global norm comes from them.
  // Written by the read stage (resident gradients) or SubmitGradients
  // (streamed, before the chunk is enqueued), read by the read stage and
  // by EndIteration after the first pass (ordered by the queues and mu_).
  std::vector<double> norm_squares_;

  // Takes gradient sums of squares on the decide thread, not on the
  // optimizer's worker pool (whose loops the compute stage runs).
  const AdamUpdater norm_updater_;

  BufferPool pool_;
  // New weights kept for the client's fetches (hand_off_weights): each
  // chunk's latest version written, cleared whenever those are rolled back
  // and when an iteration begins. Taken only while that version is what a
  // fetch reads (HandoffCurrent).
  mutable WeightHandoff handoff_;
  // Each holds every chunk: Push never waits.
  BoundedQueue<Task> decide_queue_;
  BoundedQueue<Task> read_queue_;
  BoundedQueue<Task> compute_queue_;
  BoundedQueue<Task> write_queue_;
  std::vector<std::thread> threads_;

  // Serializes control calls; held across their I/O.
  absl::Mutex api_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kIdle;
  uint64_t iteration_ ABSL_GUARDED_BY(mu_) = 0;
  float grad_scale_ ABSL_GUARDED_BY(mu_) = 1.0f;  // of this iteration
  ClipOptions clip_ ABSL_GUARDED_BY(mu_);         // of this iteration
  // kDeferWhenCertain, this iteration: the running sum of the chunks'
  // gradient sums of squares in the order they were decided, whether
  // updates now wait for the norm, and each chunk's fate (by flat index).
  double running_sum_ ABSL_GUARDED_BY(mu_) = 0.0;
  bool deferring_ ABSL_GUARDED_BY(mu_) = false;
  bool started_deferred_ ABSL_GUARDED_BY(mu_) = false;
  // EndIteration has taken the chunks' fates: none is dropped any more.
  bool norm_known_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Fate> fates_ ABSL_GUARDED_BY(mu_);
  // Read-ahead (PipelineOptions::read_ahead_bytes): chunks it may hold at
  // once (0: off), the states it holds by flat index, buffers kept for the
  // next iteration's (allocating and faulting in hundreds of MiB each
  // iteration costs as much as reading them), the epoch its tasks belong
  // to (one per iteration), whether this iteration's was queued.
  const size_t read_ahead_chunks_;
  // The chunks an iteration queues (read_ahead_chunks_ unless
  // read_ahead_adapts), and those this one had read when the norm became
  // known (set then, if it read ahead).
  size_t read_ahead_target_ ABSL_GUARDED_BY(mu_);
  std::optional<size_t> read_ahead_ready_at_norm_ ABSL_GUARDED_BY(mu_);
  std::vector<Staged> staged_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<AlignedBuffer>> spare_ ABSL_GUARDED_BY(mu_);
  MemoryShares* const read_ahead_shares_;  // null: none
  // A read-ahead waits for a new buffer (MakeReadAheadBuffersLoop), and
  // how many requests were answered (made, or refused by the share).
  bool buffer_wanted_ ABSL_GUARDED_BY(mu_) = false;
  size_t buffer_wanted_from_ ABSL_GUARDED_BY(mu_) = 0;  // its flat index
  uint64_t buffers_answered_ ABSL_GUARDED_BY(mu_) = 0;
  // Read-ahead buffers that exist (spare, staged or taken).
  size_t read_ahead_buffers_ ABSL_GUARDED_BY(mu_) = 0;
  // Streamed gradients' writes SubmitGradients has under way now: each
  // part of a read-ahead starts only while there are none (backward waits
  // for each store).
  uint32_t grad_stores_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Copies of committed states in host memory (PipelineOptions::state_tier).
  // Mutable: reading a copy is const to the pipeline.
  mutable StateTier tier_;
  // Streamed gradients kept in host memory (declared after tier_: it gives
  // its memory back to the shares the tier leaves).
  GradScratch grad_scratch_;
  uint64_t read_ahead_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool read_ahead_queued_ ABSL_GUARDED_BY(mu_) = false;
  size_t read_ahead_queued_chunks_ ABSL_GUARDED_BY(mu_) = 0;  // this one's
  std::vector<size_t> read_ahead_queued_flats_ ABSL_GUARDED_BY(mu_);
  // Whether the last committed iteration clipped (predict_clipping).
  bool last_clipped_ ABSL_GUARDED_BY(mu_) = false;
  // commit_interval: whether this iteration commits durably, the last
  // iteration that did, and whether volatile commits came since.
  bool durable_this_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t durable_iteration_ ABSL_GUARDED_BY(mu_) = 0;
  // When durable_iteration_ was made durable (or the pipeline opened), on
  // DurabilityClock().
  double durable_since_ ABSL_GUARDED_BY(mu_) = 0.0;
  // Seconds and bytes the write stage spent on writes that only make the
  // iteration durable (chunks the tier holds), and the last durable
  // commit's (durable_write_share).
  double durable_write_seconds_ ABSL_GUARDED_BY(mu_) = 0.0;
  double last_durable_write_seconds_ ABSL_GUARDED_BY(mu_) = 0.0;
  uint64_t durable_write_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_durable_write_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool volatile_since_durable_ ABSL_GUARDED_BY(mu_) = false;
  double lr_ ABSL_GUARDED_BY(mu_) = 0.0;  // of this iteration
  std::vector<bool> initialized_ ABSL_GUARDED_BY(mu_);
  std::vector<Submission> submissions_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> submit_order_ ABSL_GUARDED_BY(mu_);
  // Layers whose gradient scratch tensors may exist this iteration.
  std::vector<size_t> scratch_layers_ ABSL_GUARDED_BY(mu_);
  // Decide tasks not decided yet (EndIteration waits for these alone when
  // it settles in the background: the norm needs no update to be done).
  size_t decide_left_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pass_ ABSL_GUARDED_BY(mu_) = 0;  // passes begun
  // Chunks of the current pass not finished yet, per layer (WaitLayer).
  std::vector<size_t> layer_left_ ABSL_GUARDED_BY(mu_);
  // The iteration a settling pass commits; the error of one that failed
  // (sticky).
  uint64_t settle_iteration_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status settle_error_ ABSL_GUARDED_BY(mu_);
  bool stop_settler_ ABSL_GUARDED_BY(mu_) = false;
  size_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // Stage work since the last report (a settle pass's goes into the next).
  StageBusy busy_ ABSL_GUARDED_BY(mu_);
  // Set with first_error_ or at shutdown: stages skip work still queued.
  std::atomic<bool> abandon_{false};
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_JOB_PIPELINE_H_
