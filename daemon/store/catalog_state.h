#ifndef LOHAN_DAEMON_STORE_CATALOG_STATE_H_
#define LOHAN_DAEMON_STORE_CATALOG_STATE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "daemon/store/catalog_record.h"
#include "daemon/store/ssd_array.h"

namespace lohan {

// What a catalog says once its records are applied in order: every tensor,
// its size, its committed version with the placement of that version, and
// the previous version a kept commit left (TensorStore's kept commits).
// The store replays the log into one at open and keeps one in step with
// every record it appends, so the log can be rewritten as a snapshot at any
// moment without waiting for mutations in progress (they have either
// appended their record or not).
//
// Not thread-safe: the owner serializes calls.
class CatalogState {
 public:
  struct Tensor {
    uint64_t bytes = 0;
    uint64_t committed_version = 0;  // 0: none.
    std::optional<Placement> placement;
    uint64_t previous_version = 0;  // 0: none kept.
    std::optional<Placement> previous_placement;
    // The committer's labels of the two versions (CatalogRecord::tag).
    uint64_t committed_tag = 0;
    uint64_t previous_tag = 0;
  };
  using Key = std::pair<std::string, std::string>;  // (job, name)

  // Whether Apply would take `record`: DATA_LOSS if it commits (or keeps
  // a previous version of) a tensor that does not exist or with the wrong
  // size, keeps a previous version of one with no committed version, or
  // repeats the store record.
  absl::Status Check(const CatalogRecord& record) const;
  // Applies one record other than the store record; Check's errors, with
  // nothing applied.
  absl::Status Apply(CatalogRecord record);

  // The records of a log holding exactly this state: `store_info` (with
  // the snapshot's size: the records after it and their framed bytes),
  // then a create (and a commit where there is a committed version, then a
  // kPrevious where one is kept) per tensor, then a sync mark (see
  // CatalogRecord::kSyncMark).
  std::vector<std::string> Snapshot(const CatalogRecord& store_info) const;

  // Drops `key`'s previous version, or (`previous` false) its committed
  // one with the previous one too (a previous version needs a committed
  // one): how a salvage leaves out a version it cannot keep. Nothing if
  // there is none.
  void DropVersion(const Key& key, bool previous);

  const std::map<Key, Tensor>& tensors() const { return tensors_; }

 private:
  std::map<Key, Tensor> tensors_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_CATALOG_STATE_H_
