#include "daemon/sched/job_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "daemon/common/check.h"
#include "daemon/optim/half.h"
#include "daemon/optim/optim_types.h"
#include "daemon/sched/job_meta.h"
#include "daemon/store/aligned_buffer.h"

namespace lohan {
namespace {

// O_DIRECT-friendly alignment for chunk buffers (the store copies through
// bounce buffers otherwise).
constexpr size_t kBufferAlignment = 4096;

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

size_t RoundUp(size_t n, size_t unit) { return (n + unit - 1) / unit * unit; }

absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

bool IsNoPending(const absl::Status& s) {
  return s.code() == absl::StatusCode::kFailedPrecondition;
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
      // A chunk buffer: [state | streamed gradient | streamed 16-bit copy],
      // each part aligned for O_DIRECT.
      grad_offset_(RoundUp(state_.max_state_bytes(), kBufferAlignment)),
      weight16_offset_(grad_offset_ +
                       (options.stream_gradients
                            ? RoundUp(state_.max_chunk_count() *
                                          DTypeSize(layout.grad_dtype),
                                      kBufferAlignment)
                            : 0)),
      buffer_bytes_(
          weight16_offset_ +
          (options.stream_weight16
               ? RoundUp(state_.max_chunk_count() * 2, kBufferAlignment)
               : 0)),
      norm_updater_(updater.OnCallingThread()),
      pool_(options.schedule == Schedule::kSerialized ? 1 : options.buffers,
            buffer_bytes_, kBufferAlignment),
      decide_queue_(state_.total_chunks()),
      read_queue_(state_.total_chunks()),
      compute_queue_(pool_.count()),
      write_queue_(pool_.count()) {
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
  std::unique_ptr<JobPipeline> pipeline(
      new JobPipeline(store, updater, std::move(job), layout, options));
  absl::Status s = pipeline->OpenStates();
  if (!s.ok()) return s;
  pipeline->StartThreads();
  return pipeline;
}

absl::StatusOr<TensorInfo> JobPipeline::OpenTensor(const std::string& name,
                                                   uint64_t bytes, bool create,
                                                   absl::string_view what) {
  absl::StatusOr<TensorInfo> info = store_->Stat(job_, name);
  if (!info.ok() && info.status().code() == absl::StatusCode::kNotFound) {
    if (!create) {
      return absl::DataLossError(
          absl::StrCat("job '", job_, "': ", what, " ", name, " is missing"));
    }
    absl::Status s = store_->Create(job_, name, bytes);
    if (!s.ok()) return s;
    info = store_->Stat(job_, name);
  }
  if (!info.ok()) return info.status();
  if (info->bytes != bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_, "': ", what, " ", name, " has ",
                     info->bytes, " bytes, the layout needs ", bytes));
  }
  if (info->pending_version != 0) {
    absl::Status s = store_->Rollback(job_, name);
    if (!s.ok() && !IsNoPending(s)) return s;
    info->pending_version = 0;
  }
  return info;
}

absl::Status JobPipeline::OpenStates() {
  // Gradients of an iteration a dead pipeline never finished.
  if (absl::Status s = DropScratchTensors(store_, job_); !s.ok()) return s;
  const std::string meta_name = StateLayout::MetaName();
  absl::StatusOr<TensorInfo> meta_info = store_->Stat(job_, meta_name);
  if (!meta_info.ok() &&
      meta_info.status().code() != absl::StatusCode::kNotFound) {
    return meta_info.status();
  }
  const bool existing = meta_info.ok() && meta_info->committed_version != 0;
  uint64_t iteration = 0;
  // The committed meta (a new job's once written below).
  JobMeta committed_meta;
  if (existing) {
    std::string bytes(JobMeta::kBytes, '\0');
    if (meta_info->bytes != JobMeta::kBytes) {
      return absl::DataLossError(absl::StrCat(
          "job '", job_, "': meta tensor has ", meta_info->bytes, " bytes"));
    }
    absl::StatusOr<uint64_t> r = store_->Read(
        job_, meta_name,
        absl::MakeSpan(reinterpret_cast<uint8_t*>(bytes.data()), bytes.size()));
    if (!r.ok()) return r.status();
    absl::StatusOr<JobMeta> meta = JobMeta::Decode(bytes);
    if (!meta.ok())
      return Annotate(meta.status(), absl::StrCat("job '", job_, "'"));
    if (meta->layout_fingerprint != fingerprint_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", job_,
          "' was created with another model layout (fingerprint ",
          meta->layout_fingerprint, ", this layout's ", fingerprint_,
          "): layer sizes, chunk size, moment dtype and AMSGrad must match"));
    }
    iteration = meta->iteration;
    committed_meta = *meta;
  }
  // Chunk tensors: created if new (or left half-created by a crash), and
  // checked either way.
  std::vector<bool> initialized(state_.num_layers(), true);
  for (size_t l = 0; l < state_.num_layers(); ++l) {
    for (size_t c = 0; c < state_.num_chunks(l); ++c) {
      const std::string& name = chunk_names_[FlatIndex(l, c)];
      const uint64_t bytes = state_.state_bytes(state_.chunk_count(l, c));
      absl::StatusOr<TensorInfo> info =
          OpenTensor(name, bytes, /*create=*/!existing, "state tensor");
      if (!info.ok()) return info.status();
      if (info->committed_version == 0) initialized[l] = false;
    }
  }
  const uint64_t initial = options_.initial_iteration;
  const bool has_states = std::find(initialized.begin(), initialized.end(),
                                    true) != initialized.end();
  if (existing && has_states && initial != 0 && initial != iteration) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_, "' has states at iteration ", iteration,
        "; it cannot start at initial_iteration ", initial,
        " (0 resumes at the stored iteration; a checkpoint from another "
        "step goes into a new job)"));
  }
  if (existing && meta_info->pending_version != 0) {
    absl::Status s = store_->Rollback(job_, meta_name);
    if (!s.ok() && !IsNoPending(s)) return s;
  }
  // A new job, or one whose earlier Open wrote a meta but no layer got
  // weights: its meta (re)starts at `initial`.
  if (!existing || (!has_states && initial != 0 && initial != iteration)) {
    if (!meta_info.ok()) {
      absl::Status s = store_->Create(job_, meta_name, JobMeta::kBytes);
      if (!s.ok()) return s;
    }
    absl::Status s = WriteMeta(initial);
    if (s.ok()) s = store_->Commit(job_, meta_name);
    if (!s.ok()) return s;
    iteration = initial;
    committed_meta.layout_fingerprint = fingerprint_;
    committed_meta.iteration = initial;
    // No layer has weights yet, so every 16-bit copy there is is current.
    committed_meta.has_weight16 = options_.stream_weight16;
    committed_meta.weight16_dtype = layout_.weight16_dtype;
  }
  if (options_.stream_weight16) {
    absl::Status s = OpenWeight16(committed_meta, initialized);
    if (!s.ok()) return Annotate(s, absl::StrCat("job '", job_, "'"));
  }
  absl::MutexLock lock(&mu_);
  iteration_ = iteration;
  for (size_t l = 0; l < initialized.size(); ++l) {
    initialized_[l] = initialized[l];
  }
  return absl::OkStatus();
}

absl::Status JobPipeline::OpenWeight16(const JobMeta& meta,
                                       const std::vector<bool>& initialized) {
  // Copies are current only if the last commit was a streaming pipeline's
  // in the same dtype; otherwise (a run that kept them in the client's
  // buffers, or another dtype) they are rebuilt from the master weights.
  const bool current =
      meta.has_weight16 && meta.weight16_dtype == layout_.weight16_dtype;
  std::vector<size_t> rebuild;
  for (size_t l = 0; l < state_.num_layers(); ++l) {
    bool complete = true;
    for (size_t c = 0; c < state_.num_chunks(l); ++c) {
      const std::string& name = weight16_names_[FlatIndex(l, c)];
      const uint64_t bytes = state_.chunk_count(l, c) * 2;
      absl::StatusOr<TensorInfo> info =
          OpenTensor(name, bytes, /*create=*/true, "16-bit weight tensor");
      if (!info.ok()) return info.status();
      // A layer initialized by a pipeline that did not stream them.
      if (info->committed_version == 0) complete = false;
    }
    if (initialized[l] && (!current || !complete)) rebuild.push_back(l);
  }
  if (current && rebuild.empty()) return absl::OkStatus();

  AlignedBuffer buffer(buffer_bytes_, kBufferAlignment);
  std::vector<std::string> names;
  absl::Status s;
  for (size_t l : rebuild) {
    for (size_t c = 0; s.ok() && c < state_.num_chunks(l); ++c) {
      const uint64_t count = state_.chunk_count(l, c);
      absl::StatusOr<uint64_t> r = store_->Read(
          job_, chunk_names_[FlatIndex(l, c)],
          absl::MakeSpan(buffer.data(), state_.state_bytes(count)));
      if (!r.ok()) {
        s = r.status();
        break;
      }
      uint8_t* copy = buffer.data() + weight16_offset_;
      ToWeight16(reinterpret_cast<const float*>(buffer.data()), count,
                 reinterpret_cast<uint16_t*>(copy));
      names.push_back(weight16_names_[FlatIndex(l, c)]);
      s = store_
              ->Write(job_, names.back(), absl::MakeConstSpan(copy, count * 2))
              .status();
    }
  }
  // The same batch marks them current: a crash leaves either the old
  // copies and meta or the new ones.
  if (s.ok()) s = WriteMeta(meta.iteration);
  if (s.ok()) {
    names.push_back(StateLayout::MetaName());
    s = store_->CommitBatch(job_, names);
  }
  if (!s.ok()) {
    for (const std::string& name : names) (void)store_->Rollback(job_, name);
    (void)store_->Rollback(job_, StateLayout::MetaName());
    return Annotate(s, "rebuilding the 16-bit weight copies");
  }
  return absl::OkStatus();
}

absl::Status JobPipeline::DropScratchTensors(TensorStore* store,
                                             absl::string_view job) {
  absl::Status first;
  for (const std::string& name : store->List(job)) {
    if (name.rfind(StateLayout::kScratchPrefix, 0) != 0) continue;
    absl::Status s = store->Delete(job, name);
    if (!s.ok() && s.code() != absl::StatusCode::kNotFound && first.ok()) {
      first = s;
    }
  }
  return first;
}

void JobPipeline::StartThreads() {
  threads_.emplace_back([this] { SettleLoop(); });
  threads_.emplace_back([this] { DecideLoop(); });
  threads_.emplace_back([this] { ReadLoop(); });
  threads_.emplace_back([this] { ComputeLoop(); });
  threads_.emplace_back([this] { WriteLoop(); });
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
}

uint64_t JobPipeline::iteration() const {
  absl::MutexLock lock(&mu_);
  return iteration_;
}

bool JobPipeline::layer_initialized(size_t layer) const {
  absl::MutexLock lock(&mu_);
  return layer < initialized_.size() && initialized_[layer];
}

// ---------------------------------------------------------------- stages

void JobPipeline::DecideLoop() {
  while (std::optional<Task> task = decide_queue_.Pop()) {
    // Before any state is read: a deferred chunk costs no SSD traffic now.
    // An abandoned one counts as deferred (nothing to do).
    absl::StatusOr<bool> deferred =
        abandon_.load() ? absl::StatusOr<bool>(true) : DecideChunk(*task);
    if (!deferred.ok() || *deferred) {
      Finish(*task, deferred.status());
    } else {
      Task next = *task;
      if (!read_queue_.Push(next)) Finish(*task, absl::OkStatus());
    }
    // Only now: a chunk counted as decided is in the read queue already
    // (EndIteration reorders that queue once everything is decided).
    absl::MutexLock lock(&mu_);
    --decide_left_;
  }
}

void JobPipeline::ReadLoop() {
  while (std::optional<Task> task = read_queue_.Pop()) {
    if (abandon_.load()) {
      Finish(*task, absl::OkStatus());
      continue;
    }
    task->buffer = pool_.Acquire();
    if (task->buffer == nullptr) {  // Shutting down.
      Finish(*task, absl::OkStatus());
      continue;
    }
    const size_t flat = FlatIndex(task->layer, task->chunk);
    const uint64_t count = state_.chunk_count(task->layer, task->chunk);
    const bool update = task->kind == TaskKind::kUpdate;
    uint64_t bytes = state_.state_bytes(count);
    const double start = Now();
    absl::StatusOr<uint64_t> r = store_->Read(
        job_, chunk_names_[flat], absl::MakeSpan(task->buffer, bytes));
    if (r.ok() && update && options_.stream_gradients) {
      // The gradient SubmitGradients stored, next to the states it updates.
      const uint64_t grad_bytes = count * DTypeSize(layout_.grad_dtype);
      r = store_->ReadPending(
          job_, scratch_names_[flat],
          absl::MakeSpan(task->buffer + grad_offset_, grad_bytes));
      task->grad = task->buffer + grad_offset_;
      bytes += grad_bytes;
    }
    if (update && options_.stream_weight16) {
      task->out = task->buffer + weight16_offset_;
    }
    const double seconds = Now() - start;
    {
      absl::MutexLock lock(&mu_);
      busy_.read += seconds;
      if (r.ok()) busy_.bytes_read += bytes;
    }
    if (!r.ok()) {
      Finish(*task, r.status());
      continue;
    }
    Task next = *task;
    if (!compute_queue_.Push(next)) Finish(*task, absl::OkStatus());
  }
}

absl::StatusOr<StepStats> JobPipeline::StepChunk(const Task& task) const {
  const uint64_t count = state_.chunk_count(task.layer, task.chunk);
  uint8_t* const state = task.buffer;
  const size_t moment_size = state_.moment_size();
  const size_t grad_size = DTypeSize(layout_.grad_dtype);
  AdamOptions adam = layout_.adam;
  adam.lr = task.lr;
  // The chunk's pieces, each with its element group's lr and weight decay
  // (one piece, the whole chunk, unless group ranges fall in it), each one
  // Step from the same committed step, with its own offset into every
  // buffer.
  StepStats total;
  bool first = true;
  for (const StateLayout::Piece& piece :
       state_.ChunkPieces(task.layer, task.chunk)) {
    const uint64_t at = piece.begin;
    AdamTensor tensor;
    tensor.size = piece.count;
    tensor.weight = reinterpret_cast<float*>(state) + at;
    tensor.exp_avg = state + state_.exp_avg_offset(count) + at * moment_size;
    tensor.exp_avg_sq =
        state + state_.exp_avg_sq_offset(count) + at * moment_size;
    if (state_.amsgrad()) {
      tensor.max_exp_avg_sq =
          state + state_.max_exp_avg_sq_offset(count) + at * moment_size;
    }
    tensor.moment_dtype = layout_.moment_dtype;
    tensor.step = task.step;
    GradientView grad{task.grad + at * grad_size, layout_.grad_dtype,
                      task.inv_scale};
    HalfOutput out{task.out == nullptr ? nullptr : task.out + at * 2,
                   layout_.weight16_dtype};
    AdamOptions piece_adam = adam;
    if (piece.group != StateLayout::kNoGroup) {
      const ElementGroup& group = state_.group(piece.group);
      piece_adam.lr = adam.lr * group.lr_scale;
      piece_adam.weight_decay = group.weight_decay;
    }
    absl::StatusOr<StepStats> stats =
        updater_.Step(piece_adam, tensor, grad, out);
    if (!stats.ok()) return stats.status();
    if (first) {
      total = *stats;  // A chunk of one piece: exactly that Step's stats.
      first = false;
    } else {
      total.grad_sum_squares += stats->grad_sum_squares;
      total.grad_nonfinite = total.grad_nonfinite || stats->grad_nonfinite;
    }
  }
  return total;
}

absl::StatusOr<double> JobPipeline::ChunkSumSquares(size_t layer, size_t chunk,
                                                    const uint8_t* grad,
                                                    float inv_scale) const {
  // StepChunk's pieces, summed in the same order.
  const size_t grad_size = DTypeSize(layout_.grad_dtype);
  double sum = 0.0;
  for (const StateLayout::Piece& piece : state_.ChunkPieces(layer, chunk)) {
    absl::StatusOr<double> part = norm_updater_.GradSumSquares(
        GradientView{grad + piece.begin * grad_size, layout_.grad_dtype,
                     inv_scale},
        piece.count);
    if (!part.ok()) return part.status();
    sum += *part;
  }
  return sum;
}

absl::StatusOr<bool> JobPipeline::DecideChunk(const Task& task) {
  const size_t flat = FlatIndex(task.layer, task.chunk);
  if (!options_.stream_gradients) {
    // The gradient is in the client's buffer: a pass over host memory (2 or
    // 4 bytes a parameter), far cheaper than the state read it may save.
    const double start = Now();
    absl::StatusOr<double> sum =
        ChunkSumSquares(task.layer, task.chunk, task.grad, task.inv_scale);
    if (!sum.ok()) return sum.status();
    norm_squares_[flat] = *sum;
    absl::MutexLock lock(&mu_);
    busy_.norm += Now() - start;
  }
  absl::MutexLock lock(&mu_);
  running_sum_ += norm_squares_[flat];
  if (!deferring_ && OutcomeCertain(running_sum_)) deferring_ = true;
  fates_[flat] = deferring_ ? Fate::kDeferred : Fate::kEager;
  return deferring_;
}

bool JobPipeline::OutcomeCertain(double sum_squares) const {
  // Sums of squares only grow, so what holds for a part holds for the
  // whole; EndIteration decides again on the exact sum either way.
  if (!std::isfinite(sum_squares)) return clip_.skip_nonfinite;
  return clip_.max_grad_norm > 0.0 &&
         clip_.max_grad_norm / (std::sqrt(sum_squares) + 1e-6) < 1.0;
}

void JobPipeline::ComputeLoop() {
  while (std::optional<Task> task = compute_queue_.Pop()) {
    if (abandon_.load()) {
      Finish(*task, absl::OkStatus());
      continue;
    }
    const uint64_t count = state_.chunk_count(task->layer, task->chunk);
    const double start = Now();
    absl::Status s;
    if (task->kind == TaskKind::kRepublish) {
      // The committed weights' 16-bit copy (no update).
      ToWeight16(reinterpret_cast<const float*>(task->buffer), count,
                 reinterpret_cast<uint16_t*>(task->out));
    } else {
      absl::StatusOr<StepStats> stats = StepChunk(*task);
      if (stats.ok()) {
        sum_squares_[FlatIndex(task->layer, task->chunk)] =
            stats->grad_sum_squares;
      } else {
        s = stats.status();
      }
    }
    const double seconds = Now() - start;
    {
      absl::MutexLock lock(&mu_);
      busy_.compute += seconds;
    }
    if (!s.ok() || task->kind == TaskKind::kRepublish) {
      Finish(*task, s);
      continue;
    }
    Task next = *task;
    if (!write_queue_.Push(next)) Finish(*task, absl::OkStatus());
  }
}

void JobPipeline::WriteLoop() {
  while (std::optional<Task> task = write_queue_.Pop()) {
    if (abandon_.load()) {
      Finish(*task, absl::OkStatus());
      continue;
    }
    const size_t flat = FlatIndex(task->layer, task->chunk);
    const uint64_t count = state_.chunk_count(task->layer, task->chunk);
    uint64_t bytes = state_.state_bytes(count);
    const double start = Now();
    absl::StatusOr<uint64_t> w = store_->Write(
        job_, chunk_names_[flat], absl::MakeConstSpan(task->buffer, bytes));
    if (w.ok() && options_.stream_weight16) {
      // The new 16-bit copy, pending with the states it was made from.
      w = store_->Write(
          job_, weight16_names_[flat],
          absl::MakeConstSpan(task->buffer + weight16_offset_, count * 2));
      bytes += count * 2;
    }
    const double seconds = Now() - start;
    {
      absl::MutexLock lock(&mu_);
      busy_.write += seconds;
      if (w.ok()) busy_.bytes_written += bytes;
    }
    Finish(*task, w.status());
  }
}

void JobPipeline::Finish(Task& task, const absl::Status& status) {
  if (task.buffer != nullptr) {
    pool_.Release(task.buffer);
    task.buffer = nullptr;
  }
  absl::MutexLock lock(&mu_);
  if (!status.ok() && first_error_.ok()) {
    first_error_ =
        Annotate(status, absl::StrCat("job '", job_, "' layer ", task.layer,
                                      " chunk ", task.chunk));
    abandon_.store(true);
  }
  if (layer_left_[task.layer] > 0) --layer_left_[task.layer];
  ++done_;
}

// ---------------------------------------------------------------- passes

void JobPipeline::BeginPassLocked() {
  for (size_t& left : layer_left_) left = 0;
  decide_left_ = 0;
  enqueued_ = 0;
  done_ = 0;
  first_error_ = absl::OkStatus();
  abandon_.store(shutting_down_);
  for (double& s : sum_squares_) s = 0.0;
}

void JobPipeline::EnqueueLayerLocked(size_t layer, TaskKind kind,
                                     float inv_scale, bool decide) {
  for (size_t c = 0; c < state_.num_chunks(layer); ++c) {
    EnqueueChunkLocked(layer, c, kind, inv_scale, decide);
  }
}

void JobPipeline::EnqueueChunkLocked(size_t layer, size_t chunk, TaskKind kind,
                                     float inv_scale, bool decide) {
  const Submission& sub = submissions_[layer];
  if (kind == TaskKind::kRepublish && sub.out == nullptr) return;
  const size_t grad_size = DTypeSize(layout_.grad_dtype);
  Task task;
  task.layer = static_cast<uint32_t>(layer);
  task.chunk = static_cast<uint32_t>(chunk);
  task.kind = kind;
  task.inv_scale = inv_scale;
  task.decide = decide;
  task.lr = lr_;
  task.step = static_cast<int64_t>(iteration_);
  const uint64_t begin = state_.chunk_begin(chunk);
  // Streamed gradients: the read stage points it into the task's buffer.
  if (sub.grad != nullptr) {
    task.grad = static_cast<const uint8_t*>(sub.grad) + begin * grad_size;
  }
  if (sub.out != nullptr) task.out = static_cast<uint8_t*>(sub.out) + begin * 2;
  ++enqueued_;
  ++layer_left_[layer];
  if (decide) ++decide_left_;
  // Never waits: the queues hold every chunk of the job, and a pass
  // enqueues each chunk once.
  BoundedQueue<Task>& queue = decide ? decide_queue_ : read_queue_;
  if (!queue.Push(task)) {  // Shutting down.
    ++done_;
    --layer_left_[layer];
    if (decide) --decide_left_;
  }
}

absl::Status JobPipeline::WaitDecisions() {
  absl::MutexLock lock(&mu_);
  auto decided = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return decide_left_ == 0 || !first_error_.ok();
  };
  mu_.Await(absl::Condition(&decided));
  if (shutting_down_ && first_error_.ok()) {
    return absl::CancelledError("job pipeline is shutting down");
  }
  return first_error_;
}

absl::Status JobPipeline::WaitPass() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &JobPipeline::PassDone));
  if (shutting_down_ && first_error_.ok()) {
    return absl::CancelledError("job pipeline is shutting down");
  }
  return first_error_;
}

absl::Status JobPipeline::RunPass(TaskKind kind, float inv_scale, bool wait) {
  {
    absl::MutexLock lock(&mu_);
    BeginPassLocked();
    for (size_t layer : submit_order_)
      EnqueueLayerLocked(layer, kind, inv_scale);
  }
  return wait ? WaitPass() : absl::OkStatus();
}

absl::Status JobPipeline::RunChunkPass(TaskKind kind, float inv_scale,
                                       absl::FunctionRef<bool(size_t)> include,
                                       bool wait, bool append) {
  {
    absl::MutexLock lock(&mu_);
    if (!append) BeginPassLocked();
    for (size_t l = 0; l < state_.num_layers(); ++l) {
      for (size_t c = 0; c < state_.num_chunks(l); ++c) {
        if (include(FlatIndex(l, c))) {
          EnqueueChunkLocked(l, c, kind, inv_scale, /*decide=*/false);
        }
      }
    }
  }
  return wait ? WaitPass() : absl::OkStatus();
}

absl::Status JobPipeline::RollbackAll() {
  absl::Status first;
  auto rollback = [&](const std::string& name) {
    absl::Status s = store_->Rollback(job_, name);
    if (!s.ok() && !IsNoPending(s) && s.code() != absl::StatusCode::kNotFound &&
        first.ok()) {
      first = s;
    }
  };
  for (const std::string& name : chunk_names_) rollback(name);
  for (const std::string& name : weight16_names_) rollback(name);
  rollback(StateLayout::MetaName());
  return first;
}

absl::Status JobPipeline::WriteMeta(uint64_t iteration) {
  JobMeta meta;
  meta.layout_fingerprint = fingerprint_;
  meta.iteration = iteration;
  // A commit by a pipeline that does not stream them leaves the 16-bit
  // copies in the store stale.
  meta.has_weight16 = options_.stream_weight16;
  meta.weight16_dtype = layout_.weight16_dtype;
  const std::string bytes = meta.Encode();
  return store_
      ->Write(job_, StateLayout::MetaName(),
              absl::MakeConstSpan(
                  reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()))
      .status();
}

absl::Status JobPipeline::Commit(uint64_t new_iteration) {
  if (absl::Status s = WriteMeta(new_iteration); !s.ok()) return s;
  std::vector<std::string> names = chunk_names_;
  names.insert(names.end(), weight16_names_.begin(), weight16_names_.end());
  names.push_back(StateLayout::MetaName());
  return store_->CommitBatch(job_, names);
}

void JobPipeline::ToWeight16(const float* weights, uint64_t count,
                             uint16_t* out) const {
  const bool bf16 = layout_.weight16_dtype == DType::kBFloat16;
  for (uint64_t i = 0; i < count; ++i) {
    out[i] = bf16 ? FloatToBf16(weights[i]) : FloatToFp16(weights[i]);
  }
}

absl::Status JobPipeline::WriteGradScratch(size_t layer, const uint8_t* grad,
                                           float inv_scale) {
  const size_t grad_size = DTypeSize(layout_.grad_dtype);
  uint64_t written = 0;
  const double start = Now();
  absl::Status s;
  for (size_t c = 0; s.ok() && c < state_.num_chunks(layer); ++c) {
    const std::string& name = scratch_names_[FlatIndex(layer, c)];
    const uint64_t bytes = state_.chunk_count(layer, c) * grad_size;
    if (defers()) {
      // Now, while the gradient is in memory: a deferred chunk's decision
      // then needs no read of it from the store.
      absl::StatusOr<double> sum = ChunkSumSquares(
          layer, c, grad + state_.chunk_begin(c) * grad_size, inv_scale);
      if (!sum.ok()) {
        s = sum.status();
        break;
      }
      norm_squares_[FlatIndex(layer, c)] = *sum;
    }
    s = store_->Create(job_, name, bytes);
    if (s.code() == absl::StatusCode::kAlreadyExists) s = absl::OkStatus();
    if (s.ok()) {
      s = store_
              ->Write(job_, name,
                      absl::MakeConstSpan(
                          grad + state_.chunk_begin(c) * grad_size, bytes))
              .status();
    }
    if (s.ok()) written += bytes;
    if (!s.ok()) {
      s = Annotate(s, absl::StrCat("job '", job_, "' layer ", layer, " chunk ",
                                   c, ": storing the streamed gradient"));
    }
  }
  const double seconds = Now() - start;
  absl::MutexLock lock(&mu_);
  busy_.grad_store += seconds;
  busy_.bytes_written += written;
  return s;
}

void JobPipeline::DropScratch() {
  std::vector<size_t> layers;
  {
    absl::MutexLock lock(&mu_);
    layers.swap(scratch_layers_);
  }
  for (size_t layer : layers) {
    for (size_t c = 0; c < state_.num_chunks(layer); ++c) {
      // NOT_FOUND: the layer's write failed before this chunk. Anything
      // else leaves a tensor that the next Open deletes.
      (void)store_->Delete(job_, scratch_names_[FlatIndex(layer, c)]);
    }
  }
}

void JobPipeline::EndIterationIdle() {
  absl::MutexLock lock(&mu_);
  busy_ = StageBusy{};
  phase_ = Phase::kIdle;
}

// ---------------------------------------------------------------- API

absl::Status JobPipeline::InitializeWeights(size_t layer,
                                            const float* weights) {
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
      uint8_t* copy = buffer.data() + weight16_offset_;
      ToWeight16(weights + state_.chunk_begin(c), count,
                 reinterpret_cast<uint16_t*>(copy));
      names.push_back(weight16_names_[FlatIndex(layer, c)]);
      s = store_
              ->Write(job_, names.back(), absl::MakeConstSpan(copy, count * 2))
              .status();
    }
  }
  if (s.ok()) s = store_->CommitBatch(job_, names);
  if (!s.ok()) {
    for (const std::string& name : names) (void)store_->Rollback(job_, name);
    return Annotate(s, absl::StrCat("initializing layer ", layer));
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

absl::Status JobPipeline::ReadWeights(size_t layer, float* out) const {
  if (absl::Status readable = CheckReadable(layer, out, "ReadWeights");
      !readable.ok()) {
    return readable;
  }
  if (absl::Status updated = WaitLayer(layer); !updated.ok()) {
    return updated;
  }
  return ForEachCommittedChunk(
      layer,
      [&](size_t c, uint64_t count, const uint8_t* state) {
        std::memcpy(out + state_.chunk_begin(c), state, count * 4);
      },
      /*current=*/true);
}

absl::Status JobPipeline::ForEachCommittedChunk(
    size_t layer, absl::FunctionRef<void(size_t, uint64_t, const uint8_t*)> use,
    bool current) const {
  AlignedBuffer buffer(RoundUp(state_.max_state_bytes(), kBufferAlignment),
                       kBufferAlignment);
  for (size_t c = 0; c < state_.num_chunks(layer); ++c) {
    const uint64_t count = state_.chunk_count(layer, c);
    const std::string& name = chunk_names_[FlatIndex(layer, c)];
    const absl::Span<uint8_t> out =
        absl::MakeSpan(buffer.data(), state_.state_bytes(count));
    absl::StatusOr<uint64_t> r =
        current ? ReadCurrent(name, out) : store_->Read(job_, name, out);
    if (!r.ok()) {
      return Annotate(r.status(), absl::StrCat("reading the states of layer ",
                                               layer, " chunk ", c));
    }
    use(c, count, buffer.data());
  }
  return absl::OkStatus();
}

absl::Status JobPipeline::ReadWeight16(size_t layer, void* out) const {
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
  for (size_t c = 0; c < state_.num_chunks(layer); ++c) {
    const uint64_t count = state_.chunk_count(layer, c);
    absl::StatusOr<uint64_t> r = ReadCurrent(
        weight16_names_[FlatIndex(layer, c)],
        absl::MakeSpan(dest + state_.chunk_begin(c) * 2, count * 2));
    if (!r.ok()) return r.status();
  }
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
  if (s.ok()) s = store_->CommitBatch(job_, names);
  if (!s.ok()) {
    for (const std::string& name : names) (void)store_->Rollback(job_, name);
    return Annotate(s, absl::StrCat("restoring a moment of layer ", layer));
  }
  return absl::OkStatus();
}

absl::Status JobPipeline::BeginIteration(float grad_scale, double lr,
                                         const ClipOptions& clip) {
  if (!(clip.max_grad_norm >= 0.0) || std::isinf(clip.max_grad_norm)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_grad_norm must be finite and >= 0 (0: no clipping), got ",
        clip.max_grad_norm));
  }
  if (!(grad_scale > 0.0f) || !std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient scale must be finite and > 0, got ", grad_scale));
  }
  if (!(lr >= 0.0) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning rate must be finite and >= 0, got ", lr));
  }
  absl::MutexLock api(&api_mu_);
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
  submissions_.assign(state_.num_layers(), Submission{});
  submit_order_.clear();
  grad_scale_ = grad_scale;
  lr_ = lr > 0.0 ? lr : layout_.adam.lr;
  clip_ = clip;
  running_sum_ = 0.0;
  for (Fate& fate : fates_) fate = Fate::kNone;
  for (double& sum : norm_squares_) sum = 0.0;
  deferring_ = defers() && (options_.schedule == Schedule::kAfterBackward ||
                            (options_.predict_clipping && last_clipped_ &&
                             clip.max_grad_norm > 0.0));
  started_deferred_ = deferring_;
  BeginPassLocked();
  phase_ = Phase::kInIteration;
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
    if (absl::Status settled = AwaitSettledLocked(); !settled.ok()) {
      return settled;
    }
    if (phase_ != Phase::kInIteration) {
      return absl::FailedPreconditionError("no iteration in progress");
    }
    phase_ = Phase::kEnding;
    abandon_.store(true);  // the stages skip what they have not begun
  }
  (void)WaitPass();  // what is in progress lands as pending, rolled back
  absl::Status s = RollbackAll();
  DropScratch();
  EndIterationIdle();
  return s;
}

absl::StatusOr<IterationReport> JobPipeline::EndIteration() {
  const double start = Now();
  absl::MutexLock api(&api_mu_);
  uint64_t iteration;
  ClipOptions clip;
  float grad_scale;
  bool started_deferred;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status settled = AwaitSettledLocked(); !settled.ok()) {
      return settled;
    }
    if (phase_ != Phase::kInIteration) {
      return absl::FailedPreconditionError("no iteration in progress");
    }
    phase_ = Phase::kEnding;
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
    DropScratch();
    EndIterationIdle();
    return error;
  };
  if (!s.ok()) return fail(s);

  IterationReport report;
  report.started_deferred = started_deferred;
  double sum = 0.0;
  // Fixed (layer, chunk) order; both sources hold the same bits.
  for (double x : defers() ? norm_squares_ : sum_squares_) sum += x;
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
    fates = fates_;
  }
  for (Fate fate : fates) {
    if (fate == Fate::kEager) ++report.eager_chunks;
    if (fate == Fate::kDeferred) ++report.deferred_chunks;
  }
  auto eager = [&](size_t flat) { return fates[flat] == Fate::kEager; };
  auto deferred = [&](size_t flat) { return fates[flat] == Fate::kDeferred; };
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
    if (report.eager_chunks > 0) {
      s = RollbackAll();
      if (s.ok()) s = RunChunkPass(TaskKind::kRepublish, 1.0f, eager);
    }
    if (!s.ok()) return s;
    return false;
  }
  if (report.clipped) {
    report.redone_chunks = report.eager_chunks;
    if (report.eager_chunks > 0) s = RollbackAll();
    if (s.ok()) {
      s = RunChunkPass(
          TaskKind::kUpdate, static_cast<float>(report.clip_scale * grad_scale),
          [](size_t) { return true; }, wait);
    }
  } else {
    // Unclipped: the eager updates stand; the deferred ones join them.
    if (report.deferred_chunks > 0) {
      s = RunChunkPass(TaskKind::kUpdate, grad_scale, deferred, wait,
                       /*append=*/true);
    } else if (wait) {
      s = WaitPass();
    }
    if (!s.ok()) return s;
    if (!wait) {
      // Eager updates not begun were queued in backward order; the next
      // forward needs layer 0 first.
      read_queue_.Sort([this](const Task& a, const Task& b) {
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

absl::Status JobPipeline::AwaitSettledLocked() const {
  mu_.Await(absl::Condition(
      +[](const Phase* phase) { return *phase != Phase::kSettling; }, &phase_));
  return settle_error_;
}

absl::Status JobPipeline::WaitLayer(size_t layer) const {
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

absl::StatusOr<uint64_t> JobPipeline::ReadCurrent(
    const std::string& name, absl::Span<uint8_t> out) const {
  bool settling;
  {
    absl::MutexLock lock(&mu_);
    settling = phase_ == Phase::kSettling;
  }
  if (settling) {
    absl::StatusOr<uint64_t> r = store_->ReadPending(job_, name, out);
    // Committed meanwhile: the same bytes are now the committed version.
    if (r.ok() || !IsNoPending(r.status())) return r;
  }
  return store_->Read(job_, name, out);
}

}  // namespace lohan
