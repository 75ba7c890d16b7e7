// TensorStore's kept commits: a job's versions of the commit before the
// last, kept until released or gone back to (see tensor_store.h).

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/store/catalog_record.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/tensor_store_entry.h"

namespace lohan {

std::vector<std::shared_ptr<TensorStore::Entry>> TensorStore::BeginJobMutation(
    absl::string_view job) {
  std::vector<std::shared_ptr<Entry>> entries;
  for (const std::string& name : List(job)) {  // sorted
    absl::StatusOr<std::shared_ptr<Entry>> found = BeginMutation(job, name);
    if (found.ok()) entries.push_back(*std::move(found));  // else deleted
  }
  return entries;
}

size_t TensorStore::CountPrevious(
    const std::vector<std::shared_ptr<Entry>>& entries) const {
  absl::MutexLock lock(&mu_);
  size_t kept = 0;
  for (const auto& e : entries) kept += e->previous != nullptr ? 1 : 0;
  return kept;
}

absl::Status TensorStore::AppendJobRecord(CatalogRecord::Kind kind,
                                          absl::string_view job) {
  CatalogRecord record;
  record.kind = kind;
  record.job = std::string(job);
  return AppendToCatalog(std::move(record), /*sync=*/true);
}

void TensorStore::EndJobMutation(
    const std::vector<std::shared_ptr<Entry>>& entries, bool apply,
    absl::FunctionRef<void(Entry&)> change) {
  absl::MutexLock lock(&mu_);
  for (const auto& e : entries) {
    e->busy = false;
    if (apply && e->previous != nullptr) change(*e);
  }
}

absl::StatusOr<size_t> TensorStore::ReleasePrevious(absl::string_view job) {
  std::vector<std::shared_ptr<Entry>> entries = BeginJobMutation(job);
  const size_t kept = CountPrevious(entries);
  // Synced before the space is free: a crash must not bring back a
  // previous version whose space a later write reused.
  const absl::Status s =
      kept > 0 ? AppendJobRecord(CatalogRecord::Kind::kReleasePrevious, job)
               : absl::OkStatus();
  EndJobMutation(entries, s.ok(), [](Entry& e) { e.previous.reset(); });
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("releasing job '", job,
                                     "'s previous versions: ", s.message()));
  }
  return kept;
}

absl::StatusOr<size_t> TensorStore::RevertToPrevious(absl::string_view job) {
  std::vector<std::shared_ptr<Entry>> entries = BeginJobMutation(job);
  const size_t kept = CountPrevious(entries);
  const absl::Status s =
      kept == 0
          ? absl::FailedPreconditionError(absl::StrCat(
                "job '", job, "' keeps no previous versions to go back to"))
          : AppendJobRecord(CatalogRecord::Kind::kRevertToPrevious, job);
  EndJobMutation(entries, s.ok(), [](Entry& e) {
    e.pending.reset();
    e.committed = std::move(e.previous);  // The newer one frees its space.
  });
  if (!s.ok()) return s;
  return kept;
}

}  // namespace lohan
