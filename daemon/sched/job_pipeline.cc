// JobPipeline: its threads, and the calls between and within iterations.
// Opening a job's stored states: job_pipeline_open.cc; stages and passes:
// job_pipeline_stages.cc; the end of an iteration (clip, skip, commit,
// settle): job_pipeline_end.cc.

#include "daemon/sched/job_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "daemon/common/span_trace.h"
#include "daemon/common/thread_name.h"
#include "daemon/optim/half.h"
#include "daemon/optim/optim_types.h"
#include "daemon/sched/pipeline_util.h"
#include "daemon/store/aligned_buffer.h"
#include "layout/job_meta.h"
#include "layout/job_space.h"

namespace lohan {

using sched_internal::Annotate;
using sched_internal::IsNoPending;
using sched_internal::kBufferAlignment;

using sched_internal::RoundUp;

namespace {

// Each chunk's buffer, by flat index (forward order).
std::vector<ChunkBufferLayout> ChunkBuffers(const StateLayout& state,
                                            const ModelLayout& layout,
                                            const PipelineOptions& options) {
  std::vector<ChunkBufferLayout> buffers;
  for (size_t l = 0; l < state.num_layers(); ++l) {
    for (size_t c = 0; c < state.num_chunks(l); ++c) {
      buffers.push_back(ChunkBufferForCount(
          state, state.chunk_count(l, c), layout.grad_dtype,
          options.stream_gradients, options.stream_weight16));
    }
  }
  return buffers;
}

// The chunks whose read-ahead buffers fit in read_ahead_bytes, in forward
// order.
size_t ReadAheadChunks(const std::vector<ChunkBufferLayout>& buffers,
                       const PipelineOptions& options) {
  // With streamed gradients too: each chunk's read-ahead waits for the
  // gradient stores in flight (ReadAhead), so it fills the SSDs' idle time.
  if (options.clip_schedule != ClipSchedule::kDeferWhenCertain ||
      options.schedule != Schedule::kPipelined) {
    return 0;
  }
  uint64_t bytes = 0;
  size_t chunks = 0;
  while (chunks < buffers.size() &&
         bytes + buffers[chunks].bytes <= options.read_ahead_bytes) {
    bytes += buffers[chunks++].bytes;
  }
  return chunks;
}

// Each chunk's state bytes, by flat index (forward order).
std::vector<uint64_t> ChunkStateBytes(const StateLayout& state) {
  std::vector<uint64_t> bytes;
  for (size_t l = 0; l < state.num_layers(); ++l) {
    for (size_t c = 0; c < state.num_chunks(l); ++c) {
      bytes.push_back(state.state_bytes(state.chunk_count(l, c)));
    }
  }
  return bytes;
}

// Each chunk's gradient bytes, by flat index (forward order).
std::vector<uint64_t> ChunkGradBytes(const StateLayout& state,
                                     const ModelLayout& layout) {
  std::vector<uint64_t> bytes;
  for (size_t l = 0; l < state.num_layers(); ++l) {
    for (size_t c = 0; c < state.num_chunks(l); ++c) {
      bytes.push_back(state.chunk_count(l, c) * DTypeSize(layout.grad_dtype));
    }
  }
  return bytes;
}

// A chunk buffer: [state | streamed gradient | streamed 16-bit copy].
ChunkBufferLayout BufferOf(const StateLayout& state, const ModelLayout& layout,
                           const PipelineOptions& options) {
  return ChunkBufferFor(state, layout.grad_dtype, options.stream_gradients,
                        options.stream_weight16);
}

// The weight handoff's memory (none without hand_off_weights): the weights
// a fetch reads, the 16-bit copy or the fp32 masters.
WeightHandoff HandoffOf(const StateLayout& state,
                        const PipelineOptions& options, size_t buffers) {
  if (!options.hand_off_weights) return WeightHandoff(0, 0);
  const WeightHandoffSpace space =
      WeightHandoffFor(state, options.stream_weight16 ? 2 : 4, buffers);
  return WeightHandoff(space.slots, space.slot_bytes);
}

}  // namespace

JobPipeline::JobPipeline(TensorStore* store, const AdamUpdater& updater,
                         std::string job, const ModelLayout& layout,
                         const PipelineOptions& options)
    : store_(store),
      updater_(updater),
      job_(std::move(job)),
      layout_(layout),
      state_(layout),
      options_(options),
      fingerprint_(LayoutFingerprint(layout)),
      chunk_buffers_(ChunkBuffers(state_, layout, options)),
      buffer_bytes_(BufferOf(state_, layout, options).bytes),
      norm_updater_(updater.OnCallingThread()),
      pool_(options.schedule == Schedule::kSerialized ? 1 : options.buffers,
            buffer_bytes_, kBufferAlignment),
      handoff_(HandoffOf(state_, options, pool_.count())),
      decide_queue_(state_.total_chunks()),
      // Every chunk, and the read-ahead of this iteration and of the one
      // before (stale tasks the stage has not dropped yet).
      read_queue_(state_.total_chunks() +
                  2 * ReadAheadChunks(chunk_buffers_, options)),
      compute_queue_(pool_.count()),
      write_queue_(pool_.count()),
      read_ahead_chunks_(ReadAheadChunks(chunk_buffers_, options)),
      read_ahead_target_(read_ahead_chunks_),
      read_ahead_shares_(read_ahead_chunks_ > 0 ? options.read_ahead_shares
                                                : nullptr),
      tier_(job_, ChunkStateBytes(state_), options.state_tier,
            options.fair_group, options.weight),
      grad_scratch_(
          job_, ChunkGradBytes(state_, layout), options.state_tier,
          options.stream_gradients && options.streamed_gradients_in_tier) {
  if (read_ahead_shares_ != nullptr) {
    read_ahead_shares_->Join(job_, options.fair_group, options.weight);
  }
  for (size_t l = 0; l < state_.num_layers(); ++l) {
    chunk_base_.push_back(chunk_names_.size());
    for (size_t c = 0; c < state_.num_chunks(l); ++c) {
      chunk_names_.push_back(StateLayout::ChunkName(l, c));
      if (options_.stream_weight16) {
        weight16_names_.push_back(StateLayout::Weight16Name(l, c));
      }
      if (options_.stream_gradients) {
        scratch_names_.push_back(StateLayout::GradScratchName(l, c));
      }
    }
  }
  sum_squares_.assign(chunk_names_.size(), 0.0);
  norm_squares_.assign(chunk_names_.size(), 0.0);
  absl::MutexLock lock(&mu_);
  fates_.assign(chunk_names_.size(), Fate::kNone);
  staged_.resize(chunk_names_.size());
  layer_left_.assign(state_.num_layers(), 0);
  initialized_.assign(state_.num_layers(), false);
  submissions_.assign(state_.num_layers(), Submission{});
}

absl::StatusOr<std::unique_ptr<JobPipeline>> JobPipeline::Open(
    TensorStore* store, const AdamUpdater& updater, std::string job,
    const ModelLayout& layout, const PipelineOptions& options) {
  if (store == nullptr) {
    return absl::InvalidArgumentError("job pipeline: no store");
  }
  if (job.empty()) {
    return absl::InvalidArgumentError("job pipeline: empty job id");
  }
  absl::Status valid = ValidateLayout(layout);
  if (!valid.ok()) return valid;
  if (options.buffers == 0) {
    return absl::InvalidArgumentError("job pipeline: needs at least 1 buffer");
  }
  if (options.commit_interval == 0) {
    return absl::InvalidArgumentError(
        "job pipeline: commit_interval must be at least 1 (1: every "
        "iteration durable)");
  }
  if (!(options.durable_every_seconds >= 0.0) ||
      std::isinf(options.durable_every_seconds)) {
    return absl::InvalidArgumentError(
        "job pipeline: durable_every_seconds must be finite and >= 0");
  }
  if ((options.commit_interval > 1 || options.durable_every_seconds > 0.0) &&
      (options.keep_previous_commit ||
       options.clip_schedule != ClipSchedule::kDeferWhenCertain)) {
    return absl::InvalidArgumentError(
        "job pipeline: a commit_interval above 1 or a durable_every_seconds "
        "needs the default clip schedule and no kept commits (a "
        "data-parallel rank's job commits every iteration)");
  }
  if (options.fp32_weights_out &&
      (layout.grad_dtype != DType::kFloat32 || options.stream_weight16)) {
    return absl::InvalidArgumentError(
        "job pipeline: fp32_weights_out needs an fp32 layout whose weights "
        "are not streamed (stream_weight16)");
  }
  std::unique_ptr<JobPipeline> pipeline(
      new JobPipeline(store, updater, std::move(job), layout, options));
  absl::Status s = pipeline->OpenStates();
  if (!s.ok()) return s;
  pipeline->StartThreads();
  return pipeline;
}

void JobPipeline::StartThreads() {
  auto start = [this](const char* name, void (JobPipeline::*loop)()) {
    threads_.emplace_back([this, name, loop] {
      NameThisThread(name);
      (this->*loop)();
    });
  };
  start("lohan-settle", &JobPipeline::SettleLoop);
  start("lohan-decide", &JobPipeline::DecideLoop);
  start("lohan-read", &JobPipeline::ReadLoop);
  start("lohan-update", &JobPipeline::ComputeLoop);
  start("lohan-write", &JobPipeline::WriteLoop);
  if (read_ahead_chunks_ > 0) {
    start("lohan-buffers", &JobPipeline::MakeReadAheadBuffersLoop);
  }
}

JobPipeline::~JobPipeline() {
  bool in_iteration;
  {
    absl::MutexLock lock(&mu_);
    // A settling iteration was reported done to the caller: let it commit.
    mu_.Await(absl::Condition(
        +[](Phase* phase) { return *phase != Phase::kSettling; }, &phase_));
    stop_settler_ = true;
    shutting_down_ = true;
    in_iteration = phase_ != Phase::kIdle;
  }
  abandon_.store(true);
  decide_queue_.Close();
  read_queue_.Close();
  compute_queue_.Close();
  write_queue_.Close();
  pool_.Close();
  for (std::thread& t : threads_) t.join();
  if (in_iteration) {
    (void)RollbackAll();
    DropScratch();
  }
  {
    // What only the state tier holds reaches the store before the tier
    // goes (a session closing, lohand stopping); a failure leaves the job
    // at its last durable iteration.
    absl::MutexLock api(&api_mu_);
    (void)MakeDurableLocked();
  }
  // Its read-ahead buffers go with it.
  if (read_ahead_shares_ != nullptr) read_ahead_shares_->Leave(job_);
}

uint64_t JobPipeline::iteration() const {
  absl::MutexLock lock(&mu_);
  return iteration_;
}

uint64_t JobPipeline::durable_iteration() const {
  absl::MutexLock lock(&mu_);
  return durable_iteration_;
}

bool JobPipeline::layer_initialized(size_t layer) const {
  absl::MutexLock lock(&mu_);
  return layer < initialized_.size() && initialized_[layer];
}

// ---------------------------------------------------------------- API

absl::Status JobPipeline::InitializeWeights(size_t layer, const float* weights,
                                            void* weight_copy_out) {
  absl::MutexLock api(&api_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status in_range = LayerInRange(layer); !in_range.ok()) {
      return in_range;
    }
    if (weights == nullptr) {
      return absl::InvalidArgumentError("InitializeWeights: null weights");
    }
    if (absl::Status settled = AwaitSettledLocked(); !settled.ok()) {
      return settled;
    }
    if (phase_ != Phase::kIdle) {
      return absl::FailedPreconditionError(
          "InitializeWeights during an iteration");
    }
    if (initialized_[layer]) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", layer, " already has states"));
    }
  }
  // Committed outside the passes (durably, with everything else first): no
  // copy of the layer's old states stands.
  if (absl::Status durable = MakeDurableLocked(); !durable.ok()) {
    return durable;
  }
  tier_.Invalidate(FlatIndex(layer, 0), state_.num_chunks(layer));
  AlignedBuffer buffer(buffer_bytes_, kBufferAlignment);
  std::vector<std::string> names;
  absl::Status s;
  for (size_t c = 0; s.ok() && c < state_.num_chunks(layer); ++c) {
    const uint64_t count = state_.chunk_count(layer, c);
    const uint64_t bytes = state_.state_bytes(count);
    std::memset(buffer.data(), 0, bytes);
    std::memcpy(buffer.data(), weights + state_.chunk_begin(c), count * 4);
    names.push_back(chunk_names_[FlatIndex(layer, c)]);
    s = store_
            ->Write(job_, names.back(),
                    absl::MakeConstSpan(buffer.data(), bytes))
            .status();
    if (s.ok() && options_.stream_weight16) {
      uint8_t* copy =
          buffer.data() + chunk_buffers_[FlatIndex(layer, c)].weight16_offset;
      ToWeight16(weights + state_.chunk_begin(c), count,
                 reinterpret_cast<uint16_t*>(copy));
      names.push_back(weight16_names_[FlatIndex(layer, c)]);
      s = store_
              ->Write(job_, names.back(), absl::MakeConstSpan(copy, count * 2))
              .status();
    }
  }
  // At the committed iteration: the layer's states belong to it.
  if (s.ok()) {
    s = store_->CommitBatch(job_, names,
                            sched_internal::CommitTag(iteration()));
  }
  if (!s.ok()) {
    for (const std::string& name : names) (void)store_->Rollback(job_, name);
    return Annotate(s, absl::StrCat("initializing layer ", layer));
  }
  if (weight_copy_out != nullptr) {
    CopyWeights(weights, layout_.layer_elements[layer],
                static_cast<uint8_t*>(weight_copy_out));
  }
  absl::MutexLock lock(&mu_);
  initialized_[layer] = true;
  return absl::OkStatus();
}

absl::Status JobPipeline::LayerInRange(size_t layer) const {
  if (layer < state_.num_layers()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("layer ", layer, " out of range (the model has ",
                   state_.num_layers(), ")"));
}

absl::Status JobPipeline::CheckReadable(size_t layer, const void* out,
                                        absl::string_view what) const {
  absl::MutexLock lock(&mu_);
  if (absl::Status in_range = LayerInRange(layer); !in_range.ok()) {
    return in_range;
  }
  if (out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null output"));
  }
  if (!initialized_[layer]) {
    return absl::FailedPreconditionError(
        absl::StrCat("layer ", layer, " has no states yet"));
  }
  return absl::OkStatus();
}

absl::Status JobPipeline::ReadWeights(size_t layer, float* out,
                                      uint64_t* from_memory) const {
  SpanScope span("fetch_weights", layer);
  if (absl::Status readable = CheckReadable(layer, out, "ReadWeights");
      !readable.ok()) {
    return readable;
  }
  if (absl::Status updated = WaitLayer(layer); !updated.ok()) {
    return updated;
  }
  // The fp32 weights lead each chunk's state: read straight into `out`
  // (only the stripe units that hold them; no staging buffer, no copy).
  uint64_t in_memory = 0;
  const std::optional<uint64_t> handed_off = HandoffCurrent();
  for (size_t c = 0; c < state_.num_chunks(layer); ++c) {
    const size_t flat = FlatIndex(layer, c);
    const absl::Span<uint8_t> chunk_out =
        absl::MakeSpan(reinterpret_cast<uint8_t*>(out + state_.chunk_begin(c)),
                       state_.chunk_count(layer, c) * 4);
    if (handed_off && handoff_.Take(flat, chunk_out, *handed_off)) {
      in_memory += chunk_out.size();
      continue;
    }
    bool from_tier = false;
    absl::Status r = ReadCurrent(flat, chunk_out, /*prefix=*/true, &from_tier);
    if (!r.ok()) {
      return Annotate(r, absl::StrCat("reading the weights of layer ", layer,
                                      " chunk ", c));
    }
    if (from_tier) in_memory += chunk_out.size();
  }
  if (from_memory != nullptr) *from_memory = in_memory;
  return absl::OkStatus();
}

std::optional<uint64_t> JobPipeline::HandoffCurrent() const {
  // Read before the phase: BeginIteration clears the handoff after it
  // leaves kIdle, so a Take for a generation read while idle can take
  // nothing of the new iteration's.
  const uint64_t generation = handoff_.generation();
  absl::MutexLock lock(&mu_);
  if (phase_ != Phase::kSettling && phase_ != Phase::kIdle) return std::nullopt;
  return generation;
}

absl::Status JobPipeline::ReadWeightCopy(size_t layer, void* out) const {
  if (options_.fp32_weights_out) {
    return ReadWeights(layer, static_cast<float*>(out));
  }
  if (absl::Status readable = CheckReadable(layer, out, "ReadWeightCopy");
      !readable.ok()) {
    return readable;
  }
  std::vector<float> weights(layout_.layer_elements[layer]);
  if (absl::Status read = ReadWeights(layer, weights.data()); !read.ok()) {
    return read;
  }
  CopyWeights(weights.data(), weights.size(), static_cast<uint8_t*>(out));
  return absl::OkStatus();
}

absl::Status JobPipeline::RestoreWeightCopies() {
  std::vector<std::pair<size_t, void*>> outs;
  {
    absl::MutexLock lock(&mu_);
    for (size_t layer = 0; layer < submissions_.size(); ++layer) {
      const Submission& sub = submissions_[layer];
      if (sub.submitted && sub.out != nullptr) {
        outs.emplace_back(layer, sub.out);
      }
    }
  }
  absl::Status first;
  for (const auto& [layer, out] : outs) {
    absl::Status s = ReadWeightCopy(layer, out);
    if (!s.ok() && first.ok()) {
      first = Annotate(s, absl::StrCat("restoring the committed weights of "
                                       "layer ",
                                       layer));
    }
  }
  return first;
}

absl::Status JobPipeline::ForEachCommittedChunk(
    size_t layer, absl::FunctionRef<void(size_t, uint64_t, const uint8_t*)> use,
    bool current) const {
  AlignedBuffer buffer(RoundUp(state_.max_state_bytes(), kBufferAlignment),
                       kBufferAlignment);
  for (size_t c = 0; c < state_.num_chunks(layer); ++c) {
    const uint64_t count = state_.chunk_count(layer, c);
    const size_t flat = FlatIndex(layer, c);
    const absl::Span<uint8_t> out =
        absl::MakeSpan(buffer.data(), state_.state_bytes(count));
    absl::Status r = absl::OkStatus();
    if (current) {
      r = ReadCurrent(flat, out);
    } else if (!tier_.ReadCommitted(flat, out)) {
      r = store_->Read(job_, chunk_names_[flat], out).status();
    }
    if (!r.ok()) {
      return Annotate(
          r, absl::StrCat("reading the states of layer ", layer, " chunk ", c));
    }
    use(c, count, buffer.data());
  }
  return absl::OkStatus();
}

absl::Status JobPipeline::ReadWeight16(size_t layer, void* out,
                                       uint64_t* from_memory) const {
  SpanScope span("fetch_weight16", layer);
  if (!options_.stream_weight16) {
    return absl::FailedPreconditionError(
        "this pipeline does not stream 16-bit weights: they are written to "
        "the buffers given to SubmitGradients");
  }
  if (absl::Status readable = CheckReadable(layer, out, "ReadWeight16");
      !readable.ok()) {
    return readable;
  }
  if (absl::Status updated = WaitLayer(layer); !updated.ok()) {
    return updated;
  }
  uint8_t* dest = static_cast<uint8_t*>(out);
  uint64_t in_memory = 0;
  const std::optional<uint64_t> handed_off = HandoffCurrent();
  for (size_t c = 0; c < state_.num_chunks(layer); ++c) {
    const size_t flat = FlatIndex(layer, c);
    const absl::Span<uint8_t> chunk_out = absl::MakeSpan(
        dest + state_.chunk_begin(c) * 2, state_.chunk_count(layer, c) * 2);
    if (handed_off && handoff_.Take(flat, chunk_out, *handed_off)) {
      in_memory += chunk_out.size();
      continue;
    }
    absl::Status r = ReadCurrentStored(weight16_names_[flat], chunk_out);
    if (!r.ok()) return r;
  }
  if (from_memory != nullptr) *from_memory = in_memory;
  return absl::OkStatus();
}

absl::Status JobPipeline::CheckStateAccess(size_t layer, StatePart part,
                                           const void* data,
                                           absl::string_view what) const {
  if (absl::Status readable = CheckReadable(layer, data, what);
      !readable.ok()) {
    return readable;
  }
  if (part != StatePart::kExpAvg && part != StatePart::kExpAvgSq &&
      part != StatePart::kMaxExpAvgSq) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": part ", static_cast<int64_t>(part),
        " is not 1 (exp_avg), 2 (exp_avg_sq) or 3 (max_exp_avg_sq)"));
  }
  if (part == StatePart::kMaxExpAvgSq && !state_.amsgrad()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": max_exp_avg_sq exists only with AMSGrad, which job '", job_,
        "' does not use"));
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status settled = AwaitSettledLocked(); !settled.ok()) {
    return settled;
  }
  if (phase_ != Phase::kIdle) {
    return absl::FailedPreconditionError(
        absl::StrCat(what,
                     " during an iteration: optimizer states are read "
                     "and restored only between iterations"));
  }
  return absl::OkStatus();
}

absl::Status JobPipeline::ReadState(size_t layer, StatePart part,
                                    float* out) const {
  if (absl::Status access = CheckStateAccess(layer, part, out, "ReadState");
      !access.ok()) {
    return access;
  }
  const bool bf16 = layout_.moment_dtype == DType::kBFloat16;
  return ForEachCommittedChunk(
      layer, [&](size_t c, uint64_t count, const uint8_t* state) {
        const uint8_t* moment = state + state_.moment_offset(part, count);
        float* dest = out + state_.chunk_begin(c);
        if (bf16) {
          const uint16_t* halves = reinterpret_cast<const uint16_t*>(moment);
          for (uint64_t i = 0; i < count; ++i) dest[i] = Bf16ToFloat(halves[i]);
        } else {
          std::memcpy(dest, moment, count * 4);
        }
      });
}

absl::Status JobPipeline::InitState(size_t layer, StatePart part,
                                    const float* values) {
  // Held throughout: no iteration can begin while the batch is pending.
  absl::MutexLock api(&api_mu_);
  if (absl::Status access = CheckStateAccess(layer, part, values, "InitState");
      !access.ok()) {
    return access;
  }
  const bool bf16 = layout_.moment_dtype == DType::kBFloat16;
  // Committed outside the passes (durably, with everything else first): no
  // copy of the layer's old states stands.
  if (absl::Status durable = MakeDurableLocked(); !durable.ok()) {
    return durable;
  }
  tier_.Invalidate(FlatIndex(layer, 0), state_.num_chunks(layer));
  AlignedBuffer buffer(buffer_bytes_, kBufferAlignment);
  std::vector<std::string> names;
  absl::Status s;
  for (size_t c = 0; s.ok() && c < state_.num_chunks(layer); ++c) {
    const uint64_t count = state_.chunk_count(layer, c);
    const uint64_t bytes = state_.state_bytes(count);
    const std::string& name = chunk_names_[FlatIndex(layer, c)];
    // The committed state, with only this moment replaced: weights and the
    // other moments (and so the 16-bit copies made from the weights) stay.
    absl::StatusOr<uint64_t> r =
        store_->Read(job_, name, absl::MakeSpan(buffer.data(), bytes));
    if (!r.ok()) {
      s = r.status();
      break;
    }
    uint8_t* moment = buffer.data() + state_.moment_offset(part, count);
    const float* source = values + state_.chunk_begin(c);
    if (bf16) {
      uint16_t* halves = reinterpret_cast<uint16_t*>(moment);
      for (uint64_t i = 0; i < count; ++i) halves[i] = FloatToBf16(source[i]);
    } else {
      std::memcpy(moment, source, count * 4);
    }
    names.push_back(name);
    s = store_->Write(job_, name, absl::MakeConstSpan(buffer.data(), bytes))
            .status();
  }
  // At the committed iteration: the layer's states belong to it.
  if (s.ok()) {
    s = store_->CommitBatch(job_, names,
                            sched_internal::CommitTag(iteration()));
  }
  if (!s.ok()) {
    for (const std::string& name : names) (void)store_->Rollback(job_, name);
    return Annotate(s, absl::StrCat("restoring a moment of layer ", layer));
  }
  return absl::OkStatus();
}

absl::Status JobPipeline::BeginIteration(float grad_scale,
                                         std::optional<double> lr,
                                         const ClipOptions& clip) {
  // A natural pause to write the last iteration's spans out.
  FlushSpans();
  const double begun = SpanClock();
  RecordSpan("begin_iteration", begun, begun, 0);
  if (!(clip.max_grad_norm >= 0.0) || std::isinf(clip.max_grad_norm)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_grad_norm must be finite and >= 0 (0: no clipping), got ",
        clip.max_grad_norm));
  }
  if (!(grad_scale > 0.0f) || !std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient scale must be finite and > 0, got ", grad_scale));
  }
  if (lr.has_value() && (!(*lr >= 0.0) || !std::isfinite(*lr))) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning rate must be finite and >= 0, got ", *lr));
  }
  absl::MutexLock api(&api_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status settled = AwaitSettledLocked(); !settled.ok()) {
      return settled;
    }
    if (phase_ != Phase::kIdle) {
      return absl::FailedPreconditionError("an iteration is in progress");
    }
    for (size_t l = 0; l < initialized_.size(); ++l) {
      if (!initialized_[l]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "layer ", l, " has no states: call InitializeWeights first"));
      }
    }
  }
  // Every rank has committed the last iteration (the caller's contract):
  // the one before is needed no more, and its space is this iteration's.
  // Idle, under api_mu_: nothing else runs meanwhile.
  if (absl::Status released = ReleaseKeptStates(); !released.ok()) {
    return released;
  }
  // Another job's arrival or departure moves the tier's prefix now, between
  // iterations, when no copy is in use.
  PlaceTier();
  FitGradScratch();
  absl::MutexLock lock(&mu_);
  durable_this_ = DurableNextLocked();
  submissions_.assign(state_.num_layers(), Submission{});
  submit_order_.clear();
  grad_scale_ = grad_scale;
  lr_ = lr.value_or(layout_.adam.lr);
  clip_ = clip;
  running_sum_ = 0.0;
  for (Fate& fate : fates_) fate = Fate::kNone;
  for (double& sum : norm_squares_) sum = 0.0;
  deferring_ = defers() && (options_.schedule == Schedule::kAfterBackward ||
                            (options_.predict_clipping && last_clipped_ &&
                             clip.max_grad_norm > 0.0));
  started_deferred_ = deferring_;
  norm_known_ = false;
  ++read_ahead_epoch_;  // (Every end of an iteration started one, too.)
  BeginPassLocked();
  if (started_deferred_) EnqueueReadAheadLocked();
  phase_ = Phase::kInIteration;
  // The weights kept from the last iteration stop being what a fetch reads
  // once this one writes new versions; cleared after leaving kIdle (see
  // HandoffCurrent), before any gradient of this one arrives.
  handoff_.Clear();
  return absl::OkStatus();
}

absl::Status JobPipeline::CheckSubmitLocked(size_t layer, const void* grad,
                                            const void* weight16_out) const {
  if (phase_ != Phase::kInIteration) {
    return absl::FailedPreconditionError(
        phase_ == Phase::kIdle ? "gradients submitted outside an iteration"
                               : "gradients submitted after EndIteration");
  }
  if (absl::Status in_range = LayerInRange(layer); !in_range.ok()) {
    return in_range;
  }
  if (grad == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("null gradient for layer ", layer));
  }
  if (options_.stream_weight16 && weight16_out != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", layer,
        ": 16-bit weights are streamed to the store; no weight16_out"));
  }
  if (submissions_[layer].submitted) {
    return absl::AlreadyExistsError(
        absl::StrCat("the gradient of layer ", layer,
                     " was submitted twice this iteration"));
  }
  return absl::OkStatus();
}

absl::Status JobPipeline::SubmitGradients(size_t layer, const void* grad,
                                          void* weight16_out) {
  SpanScope span("submit_gradients", layer);
  if (!options_.stream_gradients) {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckSubmitLocked(layer, grad, weight16_out);
        !s.ok()) {
      return s;
    }
    submissions_[layer] = Submission{true, grad, weight16_out};
    submit_order_.push_back(layer);
    if (options_.schedule != Schedule::kAfterBackward) {
      EnqueueLayerLocked(layer, TaskKind::kUpdate, grad_scale_, defers());
    }
    return absl::OkStatus();
  }
  // Streamed: storing the gradient is this call's own work (the caller
  // reuses its buffer once it returns). api_mu_ keeps EndIteration and
  // other submissions out meanwhile; stage work never waits for it.
  absl::MutexLock api(&api_mu_);
  float grad_scale;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckSubmitLocked(layer, grad, weight16_out);
        !s.ok()) {
      return s;
    }
    scratch_layers_.push_back(layer);
    grad_scale = grad_scale_;
  }
  absl::Status written =
      WriteGradScratch(layer, static_cast<const uint8_t*>(grad), grad_scale);
  if (!written.ok()) return written;  // Its scratch goes with the iteration.
  absl::MutexLock lock(&mu_);
  submissions_[layer] = Submission{true, nullptr, weight16_out};
  submit_order_.push_back(layer);
  if (options_.schedule != Schedule::kAfterBackward) {
    EnqueueLayerLocked(layer, TaskKind::kUpdate, grad_scale_, defers());
  }
  return absl::OkStatus();
}

absl::Status JobPipeline::AbortIteration() {
  absl::MutexLock api(&api_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status ending = StartEndingLocked(); !ending.ok()) {
      return ending;
    }
    abandon_.store(true);  // the stages skip what they have not begun
  }
  (void)WaitPass();  // what is in progress lands as pending, rolled back
  absl::Status s = RollbackAll();
  // Updates that ran wrote new weights into the caller's buffers.
  if (absl::Status restored = RestoreWeightCopies(); s.ok()) s = restored;
  DropScratch();
  EndIterationIdle();
  return s;
}

}  // namespace lohan
