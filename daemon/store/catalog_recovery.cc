#include "daemon/store/catalog_recovery.h"

#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/store/catalog_state.h"
#include "wire/errno_status.h"

namespace lohan {
namespace {

// A record written only after a sync returned: bytes before it were
// durable. (A commit record proves nothing by itself: it is synced after
// it is written, with the unsynced records before it, and a crash before
// that sync may keep its page and lose theirs.)
bool IsSyncMark(absl::string_view payload) {
  absl::StatusOr<CatalogRecord> record = CatalogRecord::Decode(payload);
  return record.ok() && record->kind == CatalogRecord::Kind::kSyncMark;
}

// Why the bytes after the intact prefix cannot be a torn append; empty
// when they can (or there are none).
std::string Damage(const RecordLog::Scan& scan) {
  if (scan.exists && scan.file_bytes == 0) {
    return "at offset 0: the file is empty (a catalog always starts with "
           "its store record)";
  }
  if (!scan.prefix.torn_tail) return "";
  const std::string what =
      absl::StrCat("at offset ", scan.prefix.valid_bytes, ": ", scan.bad);
  if (scan.prefix.records.empty()) {
    return absl::StrCat(what,
                        ", in the first record (the store record, synced "
                        "before the file is put in place, is never torn)");
  }
  if (scan.bad_is_whole) {
    return absl::StrCat(what,
                        ", a whole record that was changed, not an "
                        "interrupted append");
  }
  for (const RecordLog::Scan::Found& found : scan.after) {
    if (IsSyncMark(found.payload)) {
      return absl::StrCat(what, ", followed by an intact sync mark at ",
                          "offset ", found.offset,
                          " (so these bytes had been synced)");
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<CatalogRead> ReadCatalog(const std::string& path) {
  absl::StatusOr<RecordLog::Scan> scan = RecordLog::ScanFile(path);
  if (!scan.ok()) return scan.status();
  if (std::string damage = Damage(*scan); !damage.empty()) {
    return absl::DataLossError(absl::StrCat(
        "the catalog ", path, " is damaged ", damage, "; ", scan->after.size(),
        " intact records follow (", scan->file_bytes,
        " bytes in all). Nothing was changed. Keep a copy of the file; "
        "`lohand --salvage` (same configuration) rebuilds the catalog "
        "from what is intact and reports what it leaves out"));
  }
  CatalogRead read;
  read.contents = std::move(scan->prefix);
  if (read.contents.torn_tail) {
    read.torn =
        absl::StrCat("ignored ", scan->file_bytes - read.contents.valid_bytes,
                     " bytes at offset ", read.contents.valid_bytes, " of ",
                     path, " (", scan->bad, "; ", scan->after.size(),
                     " intact records after it, none written after a sync): an "
                     "interrupted, unsynced append");
  }
  return read;
}

absl::StatusOr<std::string> SalvageCatalog(const std::string& path,
                                           const CatalogRecord& store_info) {
  absl::StatusOr<RecordLog::Scan> scan = RecordLog::ScanFile(path);
  if (!scan.ok()) return scan.status();
  if (!scan->exists) {
    return absl::NotFoundError(absl::StrCat("no catalog at ", path));
  }
  const std::string damage = Damage(*scan);
  if (damage.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the catalog ", path,
        " is not damaged (at most a torn tail, which lohand ignores at "
        "start): nothing to salvage"));
  }
  std::vector<std::string> report;
  report.push_back(absl::StrCat("damage ", damage));
  CatalogRecord info = store_info;
  const std::vector<std::string>& prefix = scan->prefix.records;
  size_t first = 0;
  if (!prefix.empty()) {
    absl::StatusOr<CatalogRecord> record = CatalogRecord::Decode(prefix[0]);
    if (record.ok() && record->kind == CatalogRecord::Kind::kStoreInfo) {
      info = *std::move(record);
      first = 1;
    }
  }
  if (first == 0) {
    report.push_back(
        "the store record was lost: rebuilt from the configuration "
        "(ssd_paths, stripe_unit, block_size)");
  }
  CatalogState state;
  size_t applied = 0;
  auto apply = [&](absl::string_view payload, const std::string& where) {
    absl::StatusOr<CatalogRecord> record = CatalogRecord::Decode(payload);
    absl::Status s = record.status();
    if (s.ok() && record->kind == CatalogRecord::Kind::kStoreInfo) {
      s = absl::DataLossError("a second store record");
    }
    if (s.ok()) s = state.Apply(*std::move(record));
    if (!s.ok()) {
      report.push_back(absl::StrCat("left out ", where, ": ", s.message()));
      return;
    }
    ++applied;
  };
  for (size_t i = first; i < prefix.size(); ++i) {
    apply(prefix[i], absl::StrCat("record ", i));
  }
  uint64_t next = scan->prefix.valid_bytes;  // First byte not accounted for.
  for (const RecordLog::Scan::Found& found : scan->after) {
    if (found.offset > next) {
      report.push_back(absl::StrCat("dropped bytes ", next, " to ",
                                    found.offset, " (not intact)"));
    }
    apply(found.payload, absl::StrCat("the record at offset ", found.offset));
    next = found.offset + 8 + found.payload.size();
  }
  if (next < scan->file_bytes) {
    report.push_back(absl::StrCat("dropped bytes ", next, " to ",
                                  scan->file_bytes, " (not intact)"));
  }

  const std::string damaged = absl::StrCat(
      path, ".damaged-", static_cast<long long>(std::time(nullptr)));
  if (::link(path.c_str(), damaged.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("keeping ", path, " as ", damaged,
                                             " (nothing changed)"));
  }
  absl::StatusOr<std::unique_ptr<RecordLog>> rewritten =
      RecordLog::Rewrite(path, state.Snapshot(info));
  if (!rewritten.ok()) return rewritten.status();

  std::map<std::string, std::pair<size_t, size_t>> jobs;  // tensors, committed
  for (const auto& [key, tensor] : state.tensors()) {
    auto& [tensors, committed] = jobs[key.first];
    ++tensors;
    if (tensor.committed_version != 0) ++committed;
  }
  std::vector<std::string> per_job;
  for (const auto& [job, counts] : jobs) {
    per_job.push_back(absl::StrCat(job, " ", counts.first, " (", counts.second,
                                   " committed)"));
  }
  report.push_back(
      absl::StrCat("kept ", applied, " records: ", state.tensors().size(),
                   " tensors of ", jobs.size(), " jobs",
                   per_job.empty() ? "" : ": ", absl::StrJoin(per_job, ", ")));
  report.push_back(absl::StrCat("the damaged catalog is kept as ", damaged,
                                "; the rebuilt one is in place"));
  return absl::StrJoin(report, "\n");
}

}  // namespace lohan
