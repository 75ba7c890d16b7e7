#include "daemon/store/catalog_state.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

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

}  // namespace

absl::Status CatalogState::Check(const CatalogRecord& record) const {
  switch (record.kind) {
    case CatalogRecord::Kind::kCreate:
    case CatalogRecord::Kind::kDelete:
    case CatalogRecord::Kind::kSyncMark:
      return absl::OkStatus();
    case CatalogRecord::Kind::kCommit:
      return CheckCommitted(tensors_, record.job, record.name, record.version,
                            record.placement.bytes, "");
    case CatalogRecord::Kind::kCommitBatch:
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
      break;
    }
    case CatalogRecord::Kind::kCommitBatch:
      for (CatalogRecord::CommittedVersion& c : record.commits) {
        Tensor& t = tensors_[Key(record.job, c.name)];
        t.committed_version = c.version;
        t.placement = std::move(c.placement);
      }
      break;
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

std::vector<std::string> CatalogState::Snapshot(
    const CatalogRecord& store_info) const {
  std::vector<std::string> records = {store_info.Encode()};
  for (const auto& [key, tensor] : tensors_) {
    CatalogRecord create;
    create.kind = CatalogRecord::Kind::kCreate;
    create.job = key.first;
    create.name = key.second;
    create.bytes = tensor.bytes;
    records.push_back(create.Encode());
    if (tensor.placement.has_value()) {
      CatalogRecord commit;
      commit.kind = CatalogRecord::Kind::kCommit;
      commit.job = key.first;
      commit.name = key.second;
      commit.version = tensor.committed_version;
      commit.placement = *tensor.placement;
      records.push_back(commit.Encode());
    }
  }
  // A snapshot is synced before it is put in place: all of it is durable.
  CatalogRecord mark;
  mark.kind = CatalogRecord::Kind::kSyncMark;
  records.push_back(mark.Encode());
  return records;
}

}  // namespace lohan
