// JobPipeline's stages (decide, read, compute, write) and passes.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "daemon/common/span_trace.h"
#include "daemon/optim/half.h"
#include "daemon/optim/optim_types.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/sched/pipeline_util.h"
#include "layout/job_meta.h"

namespace lohan {

using sched_internal::Annotate;
using sched_internal::IsNoPending;
using sched_internal::Now;

namespace {

// An adapting read-ahead's next target after an iteration that read all it
// queued in time: a quarter more, one at least, within the cap.
size_t GrownTarget(size_t target, size_t cap) {
  return std::min(cap, target + std::max<size_t>(1, target / 4));
}

}  // namespace

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
    // (EndIteration reorders that queue once everything is decided). By
    // now the chunk may be finished and its pass over (an abort waits only
    // for that), and a new pass begun: its count is not this chunk's.
    absl::MutexLock lock(&mu_);
    if (task->pass == pass_ && decide_left_ > 0) --decide_left_;
  }
}

void JobPipeline::ReadLoop() {
  while (std::optional<Task> task = read_queue_.Pop()) {
    if (task->kind == TaskKind::kReadAhead) {
      ReadAhead(*task);
      continue;
    }
    if (abandon_.load()) {
      Finish(*task, absl::OkStatus());
      continue;
    }
    if (TakeStagedOrDrop(*task)) continue;
    const size_t flat = FlatIndex(task->layer, task->chunk);
    const uint64_t count = state_.chunk_count(task->layer, task->chunk);
    const bool update = task->kind == TaskKind::kUpdate;
    // A state the tier holds is updated where it is. Not under kRedoAll,
    // whose clip redoes every update: its redo would have to read the
    // committed state back from the SSDs.
    if (update && !task->staged &&
        options_.clip_schedule == ClipSchedule::kDeferWhenCertain) {
      task->state = tier_.Lend(flat);
      task->lent = task->state != nullptr;
    }
    // The streamed gradient SubmitGradients kept in host memory, if it did.
    const uint8_t* grad_in_ram = update && options_.stream_gradients
                                     ? grad_scratch_.Find(flat)
                                     : nullptr;
    // A chunk buffer holds the state (unless the tier lent it), a streamed
    // gradient (unless in host memory) and a streamed 16-bit copy.
    if (!task->staged &&
        (!task->lent || (options_.stream_gradients && grad_in_ram == nullptr) ||
         options_.stream_weight16)) {
      task->buffer = pool_.Acquire();
      if (task->buffer == nullptr) {  // Shutting down.
        Finish(*task, absl::OkStatus());
        continue;
      }
    }
    if (!task->lent) task->state = task->buffer;
    uint64_t bytes = 0;
    const double start = Now();
    absl::StatusOr<uint64_t> r = uint64_t{0};
    uint64_t from_tier = 0;
    uint64_t in_tier = 0;
    if (task->lent) {
      in_tier = state_.state_bytes(count);
    } else if (!task->staged) {
      bytes = state_.state_bytes(count);
      if (tier_.ReadCommitted(flat, absl::MakeSpan(task->buffer, bytes))) {
        from_tier = bytes;
        bytes = 0;
      } else {
        r = store_->Read(job_, chunk_names_[flat],
                         absl::MakeSpan(task->buffer, bytes));
      }
    }
    const ChunkBufferLayout& parts = chunk_buffers_[flat];
    if (grad_in_ram != nullptr) {
      task->grad = grad_in_ram;
    } else if (task->staged_grad) {
      task->grad = task->buffer + parts.grad_offset;
    } else if (r.ok() && update && options_.stream_gradients) {
      // The gradient SubmitGradients stored, next to the states it updates.
      const uint64_t grad_bytes = count * DTypeSize(layout_.grad_dtype);
      r = store_->ReadPending(
          job_, scratch_names_[flat],
          absl::MakeSpan(task->buffer + parts.grad_offset, grad_bytes));
      task->grad = task->buffer + parts.grad_offset;
      bytes += grad_bytes;
    }
    if (update && options_.stream_weight16) {
      task->out = task->buffer + parts.weight16_offset;
    }
    const double seconds = Now() - start;
    RecordSpan("read", start, start + seconds, task->layer, task->chunk,
               r.ok() ? bytes : 0);
    {
      absl::MutexLock lock(&mu_);
      busy_.read += seconds;
      if (r.ok()) busy_.bytes_read += bytes;
      busy_.bytes_from_tier += from_tier + in_tier;
      busy_.bytes_in_tier += in_tier;
      busy_.bytes_copied += from_tier;
      if (task->staged) ++busy_.read_ahead_used;
      if (task->staged_grad) {
        busy_.grad_bytes_kept_ahead += count * DTypeSize(layout_.grad_dtype);
      }
    }
    if (!r.ok()) {
      Finish(*task, r.status());
      continue;
    }
    Task next = *task;
    if (!compute_queue_.Push(next)) Finish(*task, absl::OkStatus());
  }
}

bool JobPipeline::TakeStagedOrDrop(Task& task) {
  if (task.kind != TaskKind::kUpdate) return false;
  const size_t flat = FlatIndex(task.layer, task.chunk);
  {
    absl::MutexLock lock(&mu_);
    if (task.decide) {
      // Decided eager, and the outcome is certain now: its update would be
      // redone or dropped, and it has not begun. After the norm it runs
      // once (clipped) or not at all (skipped).
      if (!deferring_ || started_deferred_ || norm_known_ ||
          fates_[flat] != Fate::kEager) {
        return false;
      }
      fates_[flat] = Fate::kDropped;
    } else {
      Staged& staged = staged_[flat];
      if (staged.buffer != nullptr && !staged.taken) {
        staged.taken = true;
        task.buffer = staged.buffer->data();
        task.staged = true;
        task.staged_grad = staged.holds_grad;
      }
      return false;
    }
  }
  Finish(task, absl::OkStatus());
  return true;
}

void JobPipeline::ReadAhead(const Task& task) {
  const size_t flat = FlatIndex(task.layer, task.chunk);
  // Once the norm is known the chunk's update is queued behind this task:
  // reading ahead then would only hold it up.
  auto current = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !abandon_.load() && task.pass == read_ahead_epoch_ && !norm_known_ &&
           staged_[flat].buffer == nullptr;
  };
  // Backward waits for each streamed gradient's store: none may wait for
  // more of a read-ahead than the part in flight when it began. So each
  // part waits while a store is under way (re-checked every 50 ms:
  // abandon_ is set without mu_); once the chunk is no longer wanted
  // ahead, the rest of a read begun goes at full speed.
  // Returns the seconds it waited.
  auto yield_to_stores = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto may_go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return grad_stores_in_flight_ == 0 || !current();
    };
    const double start = Now();
    while (!mu_.AwaitWithTimeout(absl::Condition(&may_go),
                                 absl::Milliseconds(50))) {
    }
    return Now() - start;
  };
  std::unique_ptr<AlignedBuffer> buffer;
  {
    absl::MutexLock lock(&mu_);
    yield_to_stores();
    if (!current()) return;
    const uint64_t need = chunk_buffers_[flat].bytes;
    buffer = TakeSpareLocked(need);
    if (buffer == nullptr) {
      // A new one, made on its own thread: once the norm is known this
      // thread reads for the updates, whatever the allocation still takes.
      const uint64_t asked = buffers_answered_;
      buffer_wanted_ = true;
      buffer_wanted_from_ = flat;
      auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return buffers_answered_ != asked || !current() || shutting_down_;
      };
      while (!mu_.AwaitWithTimeout(absl::Condition(&answered),
                                   absl::Milliseconds(50))) {
      }
      if (!current()) return;  // A buffer made later stays spare.
      buffer = TakeSpareLocked(need);
      if (buffer == nullptr) return;  // Beyond the share: the update reads.
    }
  }
  const uint64_t bytes =
      state_.state_bytes(state_.chunk_count(task.layer, task.chunk));
  const double start = Now();
  double yielded = 0;  // not read time
  absl::StatusOr<uint64_t> r = store_->ReadYielding(
      job_, chunk_names_[flat], absl::MakeSpan(buffer->data(), bytes), [&] {
        absl::MutexLock lock(&mu_);
        yielded += yield_to_stores();
      });
  const double seconds = Now() - start - yielded;
  RecordSpan("read_ahead", start, start + seconds + yielded, task.layer,
             task.chunk, r.ok() ? bytes : 0);
  absl::MutexLock lock(&mu_);
  busy_.read += seconds;
  if (r.ok()) busy_.bytes_read += bytes;
  // Late (the norm came meanwhile) it is still good: the update finds it
  // unless it has begun. A failed read leaves the update to read again.
  if (r.ok() && !abandon_.load() && task.pass == read_ahead_epoch_ &&
      staged_[flat].buffer == nullptr) {
    staged_[flat].buffer = std::move(buffer);
  } else {
    spare_.push_back(std::move(buffer));
  }
}

void JobPipeline::MakeReadAheadBuffersLoop() {
  absl::MutexLock lock(&mu_);
  auto wanted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return buffer_wanted_ || shutting_down_;
  };
  while (true) {
    mu_.Await(absl::Condition(&wanted));
    if (shutting_down_) return;
    for (uint64_t bytes : BuffersWantedLocked()) {
      if (shutting_down_ || !read_ahead_queued_) break;
      buffer_wanted_ = false;
      mu_.Unlock();
      std::unique_ptr<AlignedBuffer> buffer;
      if (read_ahead_shares_ == nullptr ||
          read_ahead_shares_->TryTake(job_, bytes)) {
        buffer = options_.make_read_ahead_buffer
                     ? options_.make_read_ahead_buffer(bytes)
                     : std::make_unique<AlignedBuffer>(
                           bytes, sched_internal::kBufferAlignment,
                           AlignedBuffer::Pages::kSmall);
        if (buffer == nullptr && read_ahead_shares_ != nullptr) {
          read_ahead_shares_->Give(job_, bytes);
        }
      }
      mu_.Lock();
      ++buffers_answered_;
      if (buffer == nullptr) break;  // Refused: the share is full.
      spare_.push_back(std::move(buffer));
      ++read_ahead_buffers_;
    }
    // Asked when no more may be made: answered with none.
    if (buffer_wanted_) {
      buffer_wanted_ = false;
      ++buffers_answered_;
    }
  }
}

std::vector<uint64_t> JobPipeline::BuffersWantedLocked() const {
  std::multiset<uint64_t> spares;
  for (const std::unique_ptr<AlignedBuffer>& spare : spare_) {
    spares.insert(spare->size());
  }
  std::vector<uint64_t> wanted;
  for (size_t flat : read_ahead_queued_flats_) {
    if (flat < buffer_wanted_from_ || staged_[flat].buffer != nullptr) {
      continue;
    }
    const uint64_t need = chunk_buffers_[flat].bytes;
    auto fits = spares.lower_bound(need);
    if (fits != spares.end()) {
      spares.erase(fits);
    } else {
      wanted.push_back(need);
    }
  }
  return wanted;
}

std::unique_ptr<AlignedBuffer> JobPipeline::TakeSpareLocked(uint64_t bytes) {
  auto best = spare_.end();
  for (auto it = spare_.begin(); it != spare_.end(); ++it) {
    if ((*it)->size() >= bytes &&
        (best == spare_.end() || (*it)->size() < (*best)->size())) {
      best = it;
    }
  }
  if (best == spare_.end()) return nullptr;
  std::unique_ptr<AlignedBuffer> buffer = std::move(*best);
  spare_.erase(best);
  return buffer;
}

void JobPipeline::EnqueueReadAheadLocked() {
  if (read_ahead_chunks_ == 0 || read_ahead_queued_) return;
  read_ahead_queued_ = true;
  read_ahead_queued_chunks_ = 0;
  read_ahead_queued_flats_.clear();
  // Kept buffers beyond the job's share go back first (a job joined).
  TrimSpareLocked(/*all=*/false);
  for (size_t l = 0; l < state_.num_layers(); ++l) {
    for (size_t c = 0; c < state_.num_chunks(l); ++c) {
      // A chunk the tier holds needs no read: the budget goes on.
      if (tier_.HoldsCommitted(FlatIndex(l, c))) continue;
      if (read_ahead_queued_chunks_ == read_ahead_target_) return;
      Task task;
      task.layer = static_cast<uint32_t>(l);
      task.chunk = static_cast<uint32_t>(c);
      task.kind = TaskKind::kReadAhead;
      task.pass = read_ahead_epoch_;
      // Never waits: the queue has room for two iterations' read-ahead.
      if (!read_queue_.Push(task)) return;  // Shutting down.
      ++read_ahead_queued_chunks_;
      read_ahead_queued_flats_.push_back(FlatIndex(l, c));
    }
  }
}

void JobPipeline::EndReadAheadLocked() {
  ++read_ahead_epoch_;
  for (Staged& staged : staged_) {
    if (staged.taken) continue;  // Finish frees it.
    if (staged.buffer != nullptr) spare_.push_back(std::move(staged.buffer));
    staged = Staged{};
  }
  AdaptReadAheadLocked();
  // Buffers are kept for the next iteration unless this one read nothing
  // ahead.
  TrimSpareLocked(/*all=*/!read_ahead_queued_,
                  GrownTarget(read_ahead_target_, read_ahead_chunks_));
  read_ahead_queued_ = false;
}

void JobPipeline::AdaptReadAheadLocked() {
  const std::optional<size_t> ready =
      std::exchange(read_ahead_ready_at_norm_, std::nullopt);
  if (!options_.read_ahead_adapts || !ready.has_value()) return;
  if (*ready < read_ahead_queued_chunks_) {
    // The norm came first. Only a read-ahead queued at BeginIteration had
    // all of backward: one queued once clipping became certain says
    // nothing of backward's idle time.
    if (started_deferred_) read_ahead_target_ = std::max<size_t>(*ready, 1);
  } else if (read_ahead_queued_chunks_ == read_ahead_target_) {
    // All read in time, and the target (not the chunks left beside the
    // tier) bounded it: backward may have time for more.
    read_ahead_target_ = GrownTarget(read_ahead_target_, read_ahead_chunks_);
  }
}

size_t JobPipeline::CountStagedLocked() const {
  return static_cast<size_t>(
      std::count_if(staged_.begin(), staged_.end(), [](const Staged& staged) {
        return staged.buffer != nullptr && !staged.taken;
      }));
}

size_t JobPipeline::read_ahead_target_chunks() const {
  absl::MutexLock lock(&mu_);
  return read_ahead_target_;
}

void JobPipeline::TrimSpareLocked(bool all, size_t keep) {
  while (!spare_.empty() && (all || read_ahead_buffers_ > keep ||
                             (read_ahead_shares_ != nullptr &&
                              read_ahead_shares_->Excess(job_) > 0))) {
    // The smallest first: a larger spare fits any chunk a smaller one does.
    auto smallest =
        std::min_element(spare_.begin(), spare_.end(),
                         [](const std::unique_ptr<AlignedBuffer>& a,
                            const std::unique_ptr<AlignedBuffer>& b) {
                           return a->size() < b->size();
                         });
    const uint64_t bytes = (*smallest)->size();
    spare_.erase(smallest);
    --read_ahead_buffers_;
    if (read_ahead_shares_ != nullptr) read_ahead_shares_->Give(job_, bytes);
  }
}

absl::StatusOr<StepStats> JobPipeline::StepChunk(const Task& task) const {
  const uint64_t count = state_.chunk_count(task.layer, task.chunk);
  uint8_t* const state = task.state;
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
    const bool full_copy = WeightCopySize() == 4;
    HalfOutput out{
        task.out == nullptr || full_copy ? nullptr : task.out + at * 2,
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
    if (full_copy && task.out != nullptr) {
      std::memcpy(task.out + at * 4, tensor.weight, piece.count * 4);
    }
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
  double seconds = 0.0;
  if (!options_.stream_gradients) {
    // The gradient is in the client's buffer: a pass over host memory (2 or
    // 4 bytes a parameter), far cheaper than the state read it may save.
    const double start = Now();
    absl::StatusOr<double> sum =
        ChunkSumSquares(task.layer, task.chunk, task.grad, task.inv_scale);
    if (!sum.ok()) return sum.status();
    norm_squares_[flat] = *sum;
    seconds = Now() - start;
  }
  absl::MutexLock lock(&mu_);
  busy_.norm += seconds;
  running_sum_ += norm_squares_[flat];
  if (!deferring_ && OutcomeCertain(running_sum_)) {
    deferring_ = true;
    // Clipping is certain: every chunk's update runs after the norm, from
    // its committed state. (A skip needs no state.)
    if (std::isfinite(running_sum_)) EnqueueReadAheadLocked();
  }
  // A state only the tier holds is updated once the outcome is known:
  // nothing could bring it back from a redo or a skip.
  const bool defer = deferring_ || tier_.HoldsCommittedOnly(flat);
  fates_[flat] = defer ? Fate::kDeferred : Fate::kEager;
  return defer;
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
    // The job's turn on the optimizer's threads (not counted as busy).
    FairQueue::Grant turn;
    const double asked = Now();
    if (options_.optimizer_queue != nullptr &&
        task->kind == TaskKind::kUpdate) {
      turn = options_.optimizer_queue->Acquire(job_, options_.weight, count,
                                               /*urgent=*/false,
                                               options_.fair_group);
    }
    const double start = Now();
    absl::Status s;
    if (task->kind == TaskKind::kRepublish) {
      // The committed weights' copy (no update).
      CopyWeights(reinterpret_cast<const float*>(task->state), count,
                  task->out);
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
    turn = FairQueue::Grant();  // the optimizer is free for the next job
    RecordSpan("optimizer_turn", asked, start, task->layer, task->chunk);
    RecordSpan("update", start, start + seconds, task->layer, task->chunk);
    {
      absl::MutexLock lock(&mu_);
      busy_.compute += seconds;
      // An fp32 copy of the weights is a memcpy (a 16-bit one is made by
      // the update's own pass).
      const uint64_t copy_bytes =
          task->out != nullptr ? count * WeightCopySize() : 0;
      const bool memcpy_copy = WeightCopySize() == 4;
      if (memcpy_copy) busy_.bytes_copied += copy_bytes;
      if (task->kind == TaskKind::kUpdate) {
        busy_.bytes_updated += 2 * state_.state_bytes(count) +
                               count * DTypeSize(layout_.grad_dtype) +
                               (memcpy_copy ? 0 : copy_bytes);
      }
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
    const absl::Span<const uint8_t> state =
        absl::MakeConstSpan(task->state, bytes);
    bool durable;
    bool in_backward;
    {
      absl::MutexLock lock(&mu_);
      durable = durable_this_;
      in_backward = phase_ == Phase::kInIteration;
    }
    absl::StatusOr<uint64_t> w = uint64_t{0};
    // Whether the tier holds the version written (its copy serves a fetch
    // of the masters).
    bool in_tier = task->lent;
    uint64_t copied = 0;
    // Whether this write is there only to make the iteration durable (the
    // tier holds the chunk, which a volatile iteration leaves unwritten):
    // what durable_write_share weighs. A chunk on the SSDs alone is
    // written every iteration, durable or not.
    bool for_durability = false;
    if (task->lent) {
      // Updated in the tier: written through from there, or (between
      // durable commits) left there alone.
      if (durable) {
        w = store_->Write(job_, chunk_names_[flat], state);
        for_durability = true;
      } else {
        bytes = 0;
      }
      tier_.GiveBack(flat, /*stored=*/durable && w.ok());
      task->lent = false;
    } else if (!durable && tier_.KeepPending(flat, state, /*stored=*/false)) {
      // Between durable commits the tier alone takes a chunk it can hold.
      bytes = 0;
      copied = state.size();
      in_tier = true;
    } else {
      w = store_->Write(job_, chunk_names_[flat], state);
      // The tier's copy is the version just written, or none.
      if (tier_.KeepPending(flat,
                            w.ok() ? state : absl::Span<const uint8_t>())) {
        copied = state.size();
        for_durability = durable;
        in_tier = true;
      }
    }
    const double state_seconds = Now() - start;
    const uint64_t state_bytes = bytes;
    if (w.ok() && options_.stream_weight16) {
      // The new 16-bit copy, pending with the states it was made from.
      w = store_->Write(
          job_, weight16_names_[flat],
          absl::MakeConstSpan(
              task->buffer + chunk_buffers_[flat].weight16_offset, count * 2));
      bytes += count * 2;
    }
    // Before Finish: a fetch waits for the layer's last chunk to finish.
    const uint64_t handed_off =
        w.ok() ? HandOff(*task, in_tier, in_backward) : 0;
    const double seconds = Now() - start;
    {
      absl::MutexLock lock(&mu_);
      busy_.write += seconds;
      if (for_durability && w.ok()) {
        durable_write_seconds_ += state_seconds;
        durable_write_bytes_ += state_bytes;
      }
      if (w.ok()) busy_.bytes_written += bytes;
      busy_.bytes_copied += copied + handed_off;
      busy_.bytes_handed_off += handed_off;
    }
    RecordSpan("write", start, start + seconds, task->layer, task->chunk,
               w.ok() ? bytes : 0);
    Finish(*task, w.status());
  }
}

uint64_t JobPipeline::HandOff(const Task& task, bool in_tier,
                              bool in_backward) {
  if (!options_.hand_off_weights) return 0;
  const size_t flat = FlatIndex(task.layer, task.chunk);
  const uint64_t count = state_.chunk_count(task.layer, task.chunk);
  absl::Span<const uint8_t> weights;
  // An update in backward comes before every chunk at a lower flat index
  // (each is updated this iteration, and backward hands them over last
  // layer first): only the first slots' chunks would stay, so the others
  // are not copied only to give way.
  if (!in_backward || flat < handoff_.slots()) {
    if (options_.stream_weight16) {
      weights = absl::MakeConstSpan(
          task.buffer + chunk_buffers_[flat].weight16_offset, count * 2);
    } else if (!in_tier) {
      weights = absl::MakeConstSpan(task.state, count * 4);
    }
  }
  if (weights.empty()) {
    handoff_.Drop(flat);  // An older version must not outlive this one.
    return 0;
  }
  return handoff_.Keep(flat, weights) ? weights.size() : 0;
}

void JobPipeline::Finish(Task& task, const absl::Status& status) {
  if (task.buffer != nullptr && !task.staged) pool_.Release(task.buffer);
  task.buffer = nullptr;
  // Dropped before its write (abandoned, failed): the iteration rolls
  // back, voiding the lent copy.
  if (task.lent) {
    tier_.GiveBack(FlatIndex(task.layer, task.chunk), /*stored=*/false);
    task.lent = false;
  }
  task.state = nullptr;
  absl::MutexLock lock(&mu_);
  if (task.staged) {
    Staged& staged = staged_[FlatIndex(task.layer, task.chunk)];
    spare_.push_back(std::move(staged.buffer));
    staged = Staged{};
    task.staged = false;
    task.staged_grad = false;
  }
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
  ++pass_;
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
  task.pass = pass_;
  const uint64_t begin = state_.chunk_begin(chunk);
  // Streamed gradients: the read stage points it into the task's buffer.
  if (sub.grad != nullptr) {
    task.grad = static_cast<const uint8_t*>(sub.grad) + begin * grad_size;
  }
  if (sub.out != nullptr) {
    task.out = static_cast<uint8_t*>(sub.out) + begin * WeightCopySize();
  }
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
  handoff_.Clear();
  if (!tier_.DropPending()) LostTierVersion();
  return first;
}

absl::Status JobPipeline::WriteMeta(uint64_t iteration) {
  JobMeta meta;
  meta.layout_fingerprint = fingerprint_;
  meta.iteration = iteration;
  meta.first_iteration = first_iteration_;
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
  bool durable;
  {
    absl::MutexLock lock(&mu_);
    durable = durable_this_;
  }
  const uint64_t tag = sched_internal::CommitTag(new_iteration);
  if (!durable) return CommitVolatile(tag);
  std::vector<std::string> names = chunk_names_;
  names.insert(names.end(), weight16_names_.begin(), weight16_names_.end());
  names.push_back(StateLayout::MetaName());
  absl::Status s = options_.keep_previous_commit
                       ? store_->CommitBatchKeepingPrevious(job_, names, tag)
                       : store_->CommitBatch(job_, names, tag);
  if (s.ok()) tier_.CommitPending();
  absl::MutexLock lock(&mu_);
  if (s.ok()) {
    durable_iteration_ = new_iteration;
    durable_since_ = DurabilityClock();
    volatile_since_durable_ = false;
    last_durable_write_seconds_ = durable_write_seconds_;
    last_durable_write_bytes_ = durable_write_bytes_;
  }
  durable_write_seconds_ = 0.0;
  durable_write_bytes_ = 0;
  return s;
}

size_t JobPipeline::WeightCopySize() const {
  return options_.fp32_weights_out ? 4 : 2;
}

void JobPipeline::CopyWeights(const float* weights, uint64_t count,
                              uint8_t* out) const {
  if (WeightCopySize() == 4) {
    std::memcpy(out, weights, count * 4);
  } else {
    ToWeight16(weights, count, reinterpret_cast<uint16_t*>(out));
  }
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
  uint64_t copied = 0;  // into host memory (grad_scratch_)
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
    const uint8_t* chunk_grad = grad + state_.chunk_begin(c) * grad_size;
    if (uint8_t* in_ram = grad_scratch_.Take(FlatIndex(layer, c))) {
      std::memcpy(in_ram, chunk_grad, bytes);
      copied += bytes;
      continue;
    }
    if (KeepGradWithState(FlatIndex(layer, c), chunk_grad, bytes)) {
      copied += bytes;
      continue;
    }
    s = store_->Create(job_, name, bytes);
    if (s.code() == absl::StatusCode::kAlreadyExists) s = absl::OkStatus();
    if (s.ok()) {
      // A read-ahead yields the SSDs while the store is under way (not
      // while the sum of squares above is taken: that is the CPU's).
      {
        absl::MutexLock lock(&mu_);
        ++grad_stores_in_flight_;
      }
      s = store_->Write(job_, name, absl::MakeConstSpan(chunk_grad, bytes))
              .status();
      absl::MutexLock lock(&mu_);
      --grad_stores_in_flight_;
    }
    if (s.ok()) written += bytes;
    if (!s.ok()) {
      s = Annotate(s, absl::StrCat("job '", job_, "' layer ", layer, " chunk ",
                                   c, ": storing the streamed gradient"));
    }
  }
  const double seconds = Now() - start;
  RecordSpan("grad_store", start, start + seconds, layer, written, copied);
  absl::MutexLock lock(&mu_);
  busy_.grad_store += seconds;
  busy_.bytes_written += written;
  busy_.bytes_copied += copied;
  return s;
}

bool JobPipeline::KeepGradWithState(size_t flat, const uint8_t* grad,
                                    uint64_t bytes) {
  uint8_t* into;
  {
    absl::MutexLock lock(&mu_);
    Staged& staged = staged_[flat];
    // Only a chunk decided deferred: an eager update could be redone after
    // the norm, by when its staged buffer is gone.
    if (!deferring_ || staged.buffer == nullptr || staged.taken ||
        chunk_buffers_[flat].grad_offset + bytes > staged.buffer->size()) {
      return false;
    }
    into = staged.buffer->data() + chunk_buffers_[flat].grad_offset;
    // Marked before the copy: nothing else touches the buffer until this
    // chunk's update takes it, which the caller enqueues only after this
    // returns (SubmitGradients holds api_mu_ against the end of the
    // iteration that frees staged buffers).
    staged.holds_grad = true;
  }
  std::memcpy(into, grad, bytes);
  return true;
}

void JobPipeline::DropScratch() {
  std::vector<size_t> layers;
  {
    absl::MutexLock lock(&mu_);
    layers.swap(scratch_layers_);
  }
  for (size_t layer : layers) {
    for (size_t c = 0; c < state_.num_chunks(layer); ++c) {
      const size_t flat = FlatIndex(layer, c);
      if (grad_scratch_.Find(flat) != nullptr) continue;  // kept in RAM
      // NOT_FOUND: the layer's write failed before this chunk. Anything
      // else leaves a tensor that the next Open deletes.
      (void)store_->Delete(job_, scratch_names_[flat]);
    }
  }
}

void JobPipeline::EndIterationIdle() {
  absl::MutexLock lock(&mu_);
  EndReadAheadLocked();
  busy_ = StageBusy{};
  phase_ = Phase::kIdle;
}

}  // namespace lohan
