// JobPipeline: opening a job's stored states (a new job's created, a
// stored one's checked to belong together before it resumes).

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "daemon/optim/half.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/sched/pipeline_util.h"
#include "daemon/store/aligned_buffer.h"
#include "layout/job_meta.h"

namespace lohan {

using sched_internal::Annotate;
using sched_internal::CommitTag;
using sched_internal::IsNoPending;
using sched_internal::kBufferAlignment;

namespace {

// What a refusal of stored states that do not belong together tells the
// user to do about it.
constexpr absl::string_view kLostRecords =
    "the store's catalog lost records (a damaged catalog salvaged with "
    "`lohand --salvage`, or one cut short), and resuming would train on "
    "states from different steps. Nothing was changed. Restore the job from "
    "a checkpoint into a new job (lohan.init(..., resume=\"<checkpoint>\")) "
    "or delete it (`lohanctl jobs delete <id>`)";

}  // namespace

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
  // A pipeline that could not make its last iterations durable (they were
  // partly in its host memory) leaves the job at its durable iteration, as
  // a restart would.
  (void)store_->RevertVolatile(job_);
  const std::string meta_name = StateLayout::MetaName();
  if (options_.revert_last_commit) {
    if (absl::Status s = RevertLastCommit(); !s.ok()) return s;
  }
  absl::StatusOr<TensorInfo> meta_info = store_->Stat(job_, meta_name);
  if (!meta_info.ok() &&
      meta_info.status().code() != absl::StatusCode::kNotFound) {
    return meta_info.status();
  }
  const bool existing = meta_info.ok() && meta_info->committed_version != 0;
  // The committed meta (a new job's once written below).
  JobMeta committed_meta;
  if (existing) {
    absl::StatusOr<JobMeta> meta = ReadMeta(*meta_info);
    if (!meta.ok()) return meta.status();
    committed_meta = *meta;
  }
  uint64_t iteration = committed_meta.iteration;
  if (!existing) {
    // Judged before anything is created: a refusal changes nothing.
    std::vector<TensorInfo> found(state_.total_chunks());
    for (size_t i = 0; i < chunk_names_.size(); ++i) {
      absl::StatusOr<TensorInfo> info = store_->Stat(job_, chunk_names_[i]);
      if (info.ok()) found[i] = *info;
    }
    if (absl::Status s = CheckStatesBelongTogether(nullptr, 0, found, {});
        !s.ok()) {
      return s;
    }
  }
  // Chunk tensors: created if new (or left half-created by a crash), and
  // checked either way.
  std::vector<TensorInfo> chunks(state_.total_chunks());
  std::vector<bool> initialized(state_.num_layers(), true);
  for (size_t l = 0; l < state_.num_layers(); ++l) {
    for (size_t c = 0; c < state_.num_chunks(l); ++c) {
      const std::string& name = chunk_names_[FlatIndex(l, c)];
      const uint64_t bytes = state_.state_bytes(state_.chunk_count(l, c));
      absl::StatusOr<TensorInfo> info =
          OpenTensor(name, bytes, /*create=*/!existing, "state tensor");
      if (!info.ok()) return info.status();
      if (info->committed_version == 0) initialized[l] = false;
      chunks[FlatIndex(l, c)] = *info;
    }
  }
  if (existing) {
    if (absl::Status s = CheckStatesBelongTogether(
            &committed_meta, meta_info->committed_tag, chunks, initialized);
        !s.ok()) {
      return s;
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
  first_iteration_ = committed_meta.first_iteration;
  // A new job, or one whose earlier Open wrote a meta but no layer got
  // weights: its meta (re)starts at `initial`.
  if (!existing || (!has_states && initial != 0 && initial != iteration)) {
    if (!meta_info.ok()) {
      absl::Status s = store_->Create(job_, meta_name, JobMeta::kBytes);
      if (!s.ok()) return s;
    }
    first_iteration_ = initial;
    absl::Status s = WriteMeta(initial);
    if (s.ok()) s = store_->Commit(job_, meta_name, CommitTag(initial));
    if (!s.ok()) return s;
    iteration = initial;
    committed_meta.layout_fingerprint = fingerprint_;
    committed_meta.iteration = initial;
    committed_meta.first_iteration = initial;
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
  durable_iteration_ = iteration;
  durable_since_ = DurabilityClock();
  for (size_t l = 0; l < initialized.size(); ++l) {
    initialized_[l] = initialized[l];
  }
  return absl::OkStatus();
}

absl::StatusOr<JobMeta> JobPipeline::ReadMeta(const TensorInfo& info) const {
  if (info.bytes != JobMeta::kBytes) {
    return absl::DataLossError(absl::StrCat(
        "job '", job_, "': meta tensor has ", info.bytes, " bytes"));
  }
  std::string bytes(JobMeta::kBytes, '\0');
  absl::StatusOr<uint64_t> r = store_->Read(
      job_, StateLayout::MetaName(),
      absl::MakeSpan(reinterpret_cast<uint8_t*>(bytes.data()), bytes.size()));
  if (!r.ok()) return r.status();
  absl::StatusOr<JobMeta> meta = JobMeta::Decode(bytes);
  if (!meta.ok()) {
    return Annotate(meta.status(), absl::StrCat("job '", job_, "'"));
  }
  if (meta->layout_fingerprint != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_, "' was created with another model layout (fingerprint ",
        meta->layout_fingerprint, ", this layout's ", fingerprint_,
        "): layer sizes, chunk size, moment dtype and AMSGrad must match"));
  }
  return meta;
}

absl::Status JobPipeline::CheckStatesBelongTogether(
    const JobMeta* meta, uint64_t meta_tag,
    const std::vector<TensorInfo>& chunks,
    const std::vector<bool>& initialized) const {
  auto where = [this](size_t flat) {
    size_t layer = 0;
    while (layer + 1 < chunk_base_.size() && chunk_base_[layer + 1] <= flat) {
      ++layer;
    }
    return absl::StrCat("layer ", layer, " chunk ", flat - chunk_base_[layer]);
  };
  if (meta == nullptr) {
    // A job's meta is committed before any of its states, and never
    // dropped while they stay: states without one lost it.
    size_t held = 0, first = 0;
    for (size_t i = chunks.size(); i-- > 0;) {
      if (chunks[i].committed_version == 0) continue;
      ++held;
      first = i;
    }
    if (held > 0) {
      return absl::DataLossError(absl::StrCat(
          "job '", job_, "': ", held, " of its ", chunks.size(),
          " state tensors (", where(first),
          " first) hold committed optimizer states, but the job's meta, the "
          "step they belong to, is missing: ",
          kLostRecords));
    }
    if (options_.expect_stored_states) {
      return absl::DataLossError(
          absl::StrCat("job '", job_,
                       "': the store holds none of its states (its meta is "
                       "missing), though it has held them: ",
                       kLostRecords));
    }
    return absl::OkStatus();
  }
  if (meta_tag != 0 && meta_tag != CommitTag(meta->iteration)) {
    return absl::DataLossError(absl::StrCat(
        "job '", job_, "': its meta reads iteration ", meta->iteration,
        " but was committed as iteration ", meta_tag - 1, ": ", kLostRecords));
  }
  for (size_t i = 0; meta_tag != 0 && i < chunks.size(); ++i) {
    const uint64_t tag = chunks[i].committed_tag;
    if (tag != 0 && tag != meta_tag) {
      return absl::DataLossError(absl::StrCat(
          "job '", job_, "': ", where(i), " holds the states of iteration ",
          tag - 1, ", but the job's meta says iteration ", meta->iteration,
          ": ", kLostRecords));
    }
  }
  // Training needs every layer's states, and none is ever dropped: a job
  // past its first iteration with a layer without states lost them.
  if (meta->first_iteration.has_value() &&
      meta->iteration > *meta->first_iteration) {
    for (size_t l = 0; l < initialized.size(); ++l) {
      if (initialized[l]) continue;
      return absl::DataLossError(absl::StrCat(
          "job '", job_, "': layer ", l,
          " has no committed states, but the job has trained from iteration ",
          *meta->first_iteration, " to ", meta->iteration, ": ", kLostRecords));
    }
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
      // A layer initialized by a pipeline that did not stream them, or a
      // copy of another step (records lost): stale, rebuilt.
      const uint64_t tag = info->committed_tag;
      if (info->committed_version == 0 ||
          (tag != 0 && tag != CommitTag(meta.iteration))) {
        complete = false;
      }
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
      uint8_t* copy =
          buffer.data() + chunk_buffers_[FlatIndex(l, c)].weight16_offset;
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
    s = store_->CommitBatch(job_, names, CommitTag(meta.iteration));
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

}  // namespace lohan
