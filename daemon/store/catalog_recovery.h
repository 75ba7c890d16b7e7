#ifndef LOHAN_DAEMON_STORE_CATALOG_RECOVERY_H_
#define LOHAN_DAEMON_STORE_CATALOG_RECOVERY_H_

// Reading the store's catalog after a crash, or after damage. A crash can
// only tear what was appended since the last sync: never the catalog's
// first record (a snapshot is synced before the file is put in place), and
// nothing before a sync mark (CatalogRecord::kSyncMark: written after each
// sync returned, and at the end of each snapshot). So the bytes after the
// intact prefix are a torn tail only if no intact sync mark follows them
// (and they are not a whole record with a changed length); anything else
// is damage, refused with the file, the offset and what was found, and
// nothing is changed. Every acknowledged commit is followed by a mark (but
// the last, if the crash took its mark too), so damage to one is never
// read as a torn tail. SalvageCatalog is the operator's way out.

#include <string>

#include "absl/status/statusor.h"
#include "daemon/store/catalog_record.h"
#include "daemon/store/record_log.h"

namespace lohan {

struct CatalogRead {
  RecordLog::Contents contents;
  // A torn tail that was ignored, described for the log; empty if none.
  std::string torn;
};

// The catalog at `path` (a missing file: no records). DATA_LOSS when it is
// damaged, saying where, what, what follows, and that `lohand --salvage`
// recovers what can be proven intact.
absl::StatusOr<CatalogRead> ReadCatalog(const std::string& path);

// Rebuilds the catalog at `path` from every record that is intact and
// applies in order: the intact prefix, then the intact records found after
// damage (each one that does not apply is left out), with `store_info`
// standing in for a damaged first record. The damaged file is kept as
// `<path>.damaged-<unix seconds>`; the new catalog is written whole and
// synced before it replaces it. Returns the report: the byte ranges
// dropped, the records left out and why, the tensors kept. A catalog that
// is not damaged is left alone (FAILED_PRECONDITION).
absl::StatusOr<std::string> SalvageCatalog(const std::string& path,
                                           const CatalogRecord& store_info);

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_CATALOG_RECOVERY_H_
