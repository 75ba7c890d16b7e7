#include "daemon/store/catalog_state.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "daemon/store/record_log.h"

namespace lohan {
namespace {

std::string Describe(const std::string& job, const std::string& name,
                     uint64_t version) {
  return absl::StrCat("'", job, "/", name, "' version ", version);
}

// A commit must name a tensor that exists, with its size.
absl::Status CheckCommitted(
    const std::map<CatalogState::Key, CatalogState::Tensor>& tensors,
    const std::string& job, const std::string& name, uint64_t version,
    uint64_t bytes, absl::string_view what) {
  auto it = tensors.find(CatalogState::Key(job, name));
  if (it == tensors.end() || it->second.bytes != bytes) {
    return absl::DataLossError(absl::StrCat(what, "commits unknown tensor ",
                                            Describe(job, name, version)));
  }
  return absl::OkStatus();
}

// A snapshot's record of one version of a tensor (kCommit or kPrevious),
// encoded.
std::string VersionRecord(CatalogRecord::Kind kind,
                          const CatalogState::Key& key, uint64_t version,
                          const Placement& placement, uint64_t tag) {
  CatalogRecord record;
  record.kind = kind;
  record.job = key.first;
  record.name = key.second;
  record.version = version;
  record.placement = placement;
  record.tag = tag;
  return record.Encode();
}

}  // namespace

absl::Status CatalogState::Check(const CatalogRecord& record) const {
  switch (record.kind) {
    case CatalogRecord::Kind::kCreate:
    case CatalogRecord::Kind::kDelete:
    case CatalogRecord::Kind::kSyncMark:
    case CatalogRecord::Kind::kReleasePrevious:
    case CatalogRecord::Kind::kRevertToPrevious:
      return absl::OkStatus();
    case CatalogRecord::Kind::kCommit:
      return CheckCommitted(tensors_, record.job, record.name, record.version,
                            record.placement.bytes, "");
    case CatalogRecord::Kind::kPrevious: {
      if (absl::Status s =
              CheckCommitted(tensors_, record.job, record.name, record.version,
                             record.placement.bytes, "(previous) ");
          !s.ok()) {
        return s;
      }
      // A previous version comes after the committed one it preceded.
      auto it = tensors_.find(Key(record.job, record.name));
      if (!it->second.placement.has_value()) {
        return absl::DataLossError(
            absl::StrCat("keeps previous ",
                         Describe(record.job, record.name, record.version),
                         " of a tensor with no committed version"));
      }
      return absl::OkStatus();
    }
    case CatalogRecord::Kind::kCommitBatch:
    case CatalogRecord::Kind::kCommitBatchKeepingPrevious:
      for (const CatalogRecord::CommittedVersion& c : record.commits) {
        if (absl::Status s =
                CheckCommitted(tensors_, record.job, c.name, c.version,
                               c.placement.bytes, "(batch) ");
            !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    case CatalogRecord::Kind::kStoreInfo:
      break;
  }
  return absl::DataLossError("repeats the store record");
}

absl::Status CatalogState::Apply(CatalogRecord record) {
  if (absl::Status valid = Check(record); !valid.ok()) return valid;
  switch (record.kind) {
    case CatalogRecord::Kind::kCreate:
      tensors_[Key(record.job, record.name)] = Tensor{record.bytes, 0, {}};
      break;
    case CatalogRecord::Kind::kCommit: {
      Tensor& t = tensors_[Key(record.job, record.name)];
      t.committed_version = record.version;
      t.placement = std::move(record.placement);
      t.committed_tag = record.tag;
      t.previous_version = 0;  // Only a kept commit keeps one.
      t.previous_placement.reset();
      t.previous_tag = 0;
      break;
    }
    case CatalogRecord::Kind::kCommitBatch:
    case CatalogRecord::Kind::kCommitBatchKeepingPrevious: {
      const bool keep =
          record.kind == CatalogRecord::Kind::kCommitBatchKeepingPrevious;
      for (CatalogRecord::CommittedVersion& c : record.commits) {
        Tensor& t = tensors_[Key(record.job, c.name)];
        // Only a kept commit keeps the version it replaces; either drops
        // the one kept before.
        t.previous_version = keep ? t.committed_version : 0;
        t.previous_tag = keep ? t.committed_tag : 0;
        t.previous_placement.reset();
        if (keep) t.previous_placement = std::move(t.placement);
        t.committed_version = c.version;
        t.placement = std::move(c.placement);
        t.committed_tag = record.tag;
      }
      break;
    }
    case CatalogRecord::Kind::kPrevious: {
      Tensor& t = tensors_[Key(record.job, record.name)];
      t.previous_version = record.version;
      t.previous_placement = std::move(record.placement);
      t.previous_tag = record.tag;
      break;
    }
    case CatalogRecord::Kind::kReleasePrevious:
    case CatalogRecord::Kind::kRevertToPrevious: {
      const bool revert = record.kind == CatalogRecord::Kind::kRevertToPrevious;
      for (auto it = tensors_.lower_bound(Key(record.job, ""));
           it != tensors_.end() && it->first.first == record.job; ++it) {
        Tensor& t = it->second;
        if (!t.previous_placement.has_value()) continue;
        if (revert) {
          t.committed_version = t.previous_version;
          t.placement = std::move(t.previous_placement);
          t.committed_tag = t.previous_tag;
        }
        t.previous_version = 0;
        t.previous_placement.reset();
        t.previous_tag = 0;
      }
      break;
    }
    case CatalogRecord::Kind::kDelete:
      tensors_.erase(Key(record.job, record.name));
      break;
    case CatalogRecord::Kind::kSyncMark:
      break;
    case CatalogRecord::Kind::kStoreInfo:
      break;  // refused by Check
  }
  return absl::OkStatus();
}

void CatalogState::DropVersion(const Key& key, bool previous) {
  auto it = tensors_.find(key);
  if (it == tensors_.end()) return;
  Tensor& t = it->second;
  if (!previous) {
    t.committed_version = 0;
    t.placement.reset();
    t.committed_tag = 0;
  }
  t.previous_version = 0;
  t.previous_placement.reset();
  t.previous_tag = 0;
}

std::vector<std::string> CatalogState::Snapshot(
    const CatalogRecord& store_info) const {
  std::vector<std::string> records = {std::string()};  // store_info, below
  for (const auto& [key, tensor] : tensors_) {
    CatalogRecord create;
    create.kind = CatalogRecord::Kind::kCreate;
    create.job = key.first;
    create.name = key.second;
    create.bytes = tensor.bytes;
    records.push_back(create.Encode());
    if (tensor.placement.has_value()) {
      records.push_back(VersionRecord(CatalogRecord::Kind::kCommit, key,
                                      tensor.committed_version,
                                      *tensor.placement, tensor.committed_tag));
    }
    if (tensor.previous_placement.has_value()) {
      records.push_back(VersionRecord(
          CatalogRecord::Kind::kPrevious, key, tensor.previous_version,
          *tensor.previous_placement, tensor.previous_tag));
    }
  }
  // A snapshot is synced before it is put in place: all of it is durable.
  CatalogRecord mark;
  mark.kind = CatalogRecord::Kind::kSyncMark;
  records.push_back(mark.Encode());
  // The first record says how much follows it, so a snapshot cut short is
  // never taken for a complete one.
  CatalogRecord info = store_info;
  info.has_snapshot_size = true;
  info.snapshot_records = records.size() - 1;
  info.snapshot_bytes = 0;
  for (size_t i = 1; i < records.size(); ++i) {
    info.snapshot_bytes += RecordLog::FramedBytes(records[i].size());
  }
  records[0] = info.Encode();
  return records;
}

}  // namespace lohan
