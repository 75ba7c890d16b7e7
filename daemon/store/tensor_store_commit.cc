// TensorStore's commits: one tensor, a batch (durable or volatile), and the
// batch that keeps the versions it replaces (see tensor_store.h).

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/store/catalog_record.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/tensor_store_entry.h"

namespace lohan {

absl::Status TensorStore::Commit(absl::string_view job, absl::string_view name,
                                 uint64_t tag) {
  absl::StatusOr<std::shared_ptr<Entry>> found = BeginMutation(job, name);
  if (!found.ok()) return found.status();
  Entry& entry = **found;
  std::shared_ptr<const Version> pending;
  {
    absl::MutexLock lock(&mu_);
    pending = entry.pending;
  }
  if (pending == nullptr) {
    EndMutation(entry);
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", job, "/", name, "' has no version to commit"));
  }
  // The data must be durable before the record that points at it.
  absl::Status s = array_->FlushAll();
  if (s.ok()) {
    CatalogRecord commit;
    commit.kind = CatalogRecord::Kind::kCommit;
    commit.job = std::string(job);
    commit.name = std::string(name);
    commit.version = pending->number;
    commit.placement = pending->placement;
    commit.tag = tag;
    s = AppendToCatalog(std::move(commit), /*sync=*/true);
  }
  absl::MutexLock lock(&mu_);
  entry.busy = false;
  if (!s.ok()) return s;
  // The old one (and any kept previous or durable one) frees its space.
  pending->tag = tag;
  entry.committed = std::move(entry.pending);
  entry.previous.reset();
  entry.MakeDurable();
  return absl::OkStatus();
}

absl::Status TensorStore::CommitBatch(absl::string_view job,
                                      absl::Span<const std::string> names,
                                      uint64_t tag) {
  return CommitBatchImpl(job, names, CommitKind::kDurable, tag);
}

absl::Status TensorStore::CommitBatchKeepingPrevious(
    absl::string_view job, absl::Span<const std::string> names, uint64_t tag) {
  return CommitBatchImpl(job, names, CommitKind::kKeepingPrevious, tag);
}

absl::Status TensorStore::CommitBatchVolatile(
    absl::string_view job, absl::Span<const std::string> names, uint64_t tag) {
  return CommitBatchImpl(job, names, CommitKind::kVolatile, tag);
}

absl::Status TensorStore::CommitBatchImpl(absl::string_view job,
                                          absl::Span<const std::string> names,
                                          CommitKind kind, uint64_t tag) {
  if (names.empty()) {
    return absl::InvalidArgumentError("a commit batch needs at least one name");
  }
  std::vector<std::string> sorted(names.begin(), names.end());
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError(
        "a commit batch names the same tensor twice");
  }
  // Taken in name order: two batches never wait for each other in a cycle.
  std::vector<std::shared_ptr<Entry>> entries;
  entries.reserve(sorted.size());
  auto release_all = [&]() {
    absl::MutexLock lock(&mu_);
    for (const auto& e : entries) e->busy = false;
  };
  for (const std::string& name : sorted) {
    absl::StatusOr<std::shared_ptr<Entry>> found = BeginMutation(job, name);
    if (!found.ok()) {
      release_all();
      return found.status();
    }
    entries.push_back(*std::move(found));
  }
  CatalogRecord batch;
  batch.kind = kind == CommitKind::kKeepingPrevious
                   ? CatalogRecord::Kind::kCommitBatchKeepingPrevious
                   : CatalogRecord::Kind::kCommitBatch;
  batch.job = std::string(job);
  batch.tag = tag;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < entries.size(); ++i) {
      absl::Status refused = CheckCommittableLocked(*entries[i], kind);
      if (!refused.ok()) {
        for (const auto& e : entries) e->busy = false;
        return absl::Status(
            refused.code(),
            absl::StrCat("tensor '", job, "/", sorted[i], "' ",
                         refused.message(), " (batch not committed)"));
      }
      // A volatile committed version without a pending one is made durable
      // as it is.
      const Version& version = entries[i]->pending != nullptr
                                   ? *entries[i]->pending
                                   : *entries[i]->committed;
      batch.commits.push_back(CatalogRecord::CommittedVersion{
          sorted[i], version.number, version.placement});
    }
  }
  if (kind == CommitKind::kVolatile) {
    // Nothing reaches the catalog: a restart finds the durable versions.
    absl::MutexLock lock(&mu_);
    for (const auto& e : entries) {
      e->busy = false;
      e->CommitVolatile(tag);
    }
    return absl::OkStatus();
  }
  // The data must be durable before the record that points at it.
  absl::Status s = array_->FlushAll();
  if (s.ok()) s = AppendToCatalog(std::move(batch), /*sync=*/true);
  absl::MutexLock lock(&mu_);
  for (const auto& e : entries) {
    e->busy = false;
    if (!s.ok()) continue;
    if (e->pending == nullptr) {  // a volatile version made durable
      e->committed->tag = tag;
      e->MakeDurable();
      continue;
    }
    // Not kept: the old committed version (and any previous one left by
    // an earlier kept commit) frees its space.
    e->previous = kind == CommitKind::kKeepingPrevious ? std::move(e->committed)
                                                       : nullptr;
    e->pending->tag = tag;
    e->committed = std::move(e->pending);
    e->MakeDurable();
  }
  return s;
}

size_t TensorStore::RevertVolatile(absl::string_view job) {
  size_t reverted = 0;
  for (const std::shared_ptr<Entry>& entry : BeginJobMutation(job)) {
    absl::MutexLock lock(&mu_);
    entry->busy = false;
    if (!entry->volatile_commit) continue;
    entry->committed = std::move(entry->durable);
    entry->MakeDurable();
    ++reverted;
  }
  return reverted;
}

absl::Status TensorStore::CheckCommittableLocked(const Entry& entry,
                                                 CommitKind kind) const {
  if (kind == CommitKind::kDurable && entry.pending == nullptr &&
      entry.volatile_commit) {
    return absl::OkStatus();
  }
  if (entry.pending == nullptr) {
    return absl::FailedPreconditionError("has no version to commit");
  }
  // A kept previous version is a durable one; a volatile commit keeps the
  // durable version instead, and never both.
  if (kind == CommitKind::kKeepingPrevious && entry.volatile_commit) {
    return absl::FailedPreconditionError(
        "has a volatile commit: it cannot keep its previous version");
  }
  if (kind == CommitKind::kVolatile && entry.previous != nullptr) {
    return absl::FailedPreconditionError(
        "keeps a previous version: it cannot be committed volatile");
  }
  return absl::OkStatus();
}

}  // namespace lohan
