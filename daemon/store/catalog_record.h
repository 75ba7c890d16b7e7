#ifndef LOHAN_DAEMON_STORE_CATALOG_RECORD_H_
#define LOHAN_DAEMON_STORE_CATALOG_RECORD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/store/ssd_array.h"

namespace lohan {

// The records of the store's catalog (payloads of RecordLog records), in a
// small hand-rolled little-endian encoding: a kind byte, then fields.
// Replaying them in order rebuilds the set of tensors, their committed
// versions and the previous versions kept (see TensorStore's kept
// commits); uncommitted versions are never recorded.
struct CatalogRecord {
  enum class Kind : uint8_t {
    kStoreInfo = 1,  // First record: the array the catalog describes.
    kCreate = 2,     // A tensor exists (job, name, bytes), no version yet.
    kCommit = 3,     // (job, name) now reads `version` at `placement`.
    kDelete = 4,     // (job, name) is gone.
    // Several tensors of `job` now read the versions in `commits`, all or
    // none: one record, so a torn append drops the whole batch.
    kCommitBatch = 5,
    // No change: appended after a sync returned (and ending every
    // snapshot), so bytes before an intact one were durable. What tells
    // damage from a torn tail (catalog_recovery.h).
    kSyncMark = 6,
    // As kCommitBatch, and each tensor's committed version until now stays
    // as its previous one (one it had before is dropped).
    kCommitBatchKeepingPrevious = 7,
    // Every tensor of `job` drops its previous version.
    kReleasePrevious = 8,
    // Every tensor of `job` that has a previous version reads it again;
    // the committed one is dropped.
    kRevertToPrevious = 9,
    // (job, name) keeps `version` at `placement` as its previous version:
    // how a snapshot says what kCommitBatchKeepingPrevious left.
    kPrevious = 10,
  };
  Kind kind = Kind::kCreate;

  // kStoreInfo.
  uint32_t format_version = 1;
  uint64_t stripe_unit = 0;
  uint32_t block_size = 0;
  std::vector<std::string> device_paths;
  // The store's identity (store_identity.h), also kept beside each SSD's
  // data file; empty in catalogs written before stores had one.
  std::string store_id;
  // The snapshot this record begins (every catalog file starts with one):
  // how many records follow it in the snapshot and their framed bytes,
  // its closing sync mark included. A file whose intact records end before
  // them was cut or damaged inside a synced snapshot, never torn by a
  // crash (catalog_recovery.h). Absent (has_snapshot_size false) in
  // catalogs written before snapshots said their size.
  bool has_snapshot_size = false;
  uint64_t snapshot_records = 0;
  uint64_t snapshot_bytes = 0;

  // One tensor's new committed version inside a kCommitBatch record.
  struct CommittedVersion {
    std::string name;
    uint64_t version = 0;
    Placement placement;  // placement.bytes == the tensor's size.
    bool operator==(const CommittedVersion&) const = default;
  };

  // kCreate, kCommit, kDelete, kPrevious; kCommitBatch*, kReleasePrevious
  // and kRevertToPrevious (job only).
  std::string job;
  std::string name;
  uint64_t bytes = 0;    // kCreate.
  uint64_t version = 0;  // kCommit, kPrevious.
  // kCommit, kPrevious (placement.bytes == the tensor's size).
  Placement placement;
  std::vector<CommittedVersion> commits;  // kCommitBatch*, at least one.
  // kCommit, kCommitBatch*, kPrevious: the committer's label of the
  // version(s), opaque to the store (a job pipeline's iteration), so that a
  // reader can tell whether tensors committed apart belong together. 0: no
  // label (also what records written before labels decode to).
  uint64_t tag = 0;

  std::string Encode() const;
  // DATA_LOSS if `payload` is not a well-formed record.
  static absl::StatusOr<CatalogRecord> Decode(absl::string_view payload);
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_CATALOG_RECORD_H_
