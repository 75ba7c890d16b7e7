#include "daemon/store/catalog_recovery.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <map>
#include <set>
#include <tuple>
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

// Why the intact prefix does not hold the whole snapshot that begins the
// file, as its first record declares it; empty when it does (or the
// record, older, does not say).
std::string SnapshotCut(const RecordLog::Contents& prefix) {
  if (prefix.records.empty()) return "";
  absl::StatusOr<CatalogRecord> info = CatalogRecord::Decode(prefix.records[0]);
  if (!info.ok() || info->kind != CatalogRecord::Kind::kStoreInfo ||
      !info->has_snapshot_size) {
    return "";
  }
  const uint64_t end =
      RecordLog::FramedBytes(prefix.records[0].size()) + info->snapshot_bytes;
  uint64_t offset = 0;
  size_t records = 0;
  while (records < prefix.records.size() && offset < end) {
    offset += RecordLog::FramedBytes(prefix.records[records].size());
    ++records;
  }
  const std::string declared = absl::StrCat(
      "the snapshot that begins the file declares ", info->snapshot_records,
      " records after its first, ending at offset ", end);
  if (offset < end) {
    return absl::StrCat("at offset ", prefix.valid_bytes, ": ", declared,
                        ", but its intact records end at offset ", offset,
                        " after ", records > 0 ? records - 1 : 0,
                        " of them (the file was cut or damaged inside a "
                        "snapshot, which is synced whole before it is put "
                        "in place, so no crash leaves it short)");
  }
  if (offset != end || records - 1 != info->snapshot_records ||
      !IsSyncMark(prefix.records[records - 1])) {
    return absl::StrCat("at offset 0: ", declared,
                        ", which its records do not match (", records - 1,
                        " records end at offset ", offset, ")");
  }
  return "";
}

// Why the bytes after the intact prefix cannot be a torn append; empty
// when they can (or there are none).
std::string Damage(const RecordLog::Scan& scan) {
  if (scan.exists && scan.file_bytes == 0) {
    return "at offset 0: the file is empty (a catalog always starts with "
           "its store record)";
  }
  if (std::string cut = SnapshotCut(scan.prefix); !cut.empty()) return cut;
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

namespace {

// When each live version was recorded: the index of the applied record
// that named it (a commit, a batch, a snapshot's previous version).
using VersionKey = std::tuple<std::string, std::string, uint64_t>;
using Births = std::map<VersionKey, size_t>;

void NoteBirths(const CatalogRecord& record, size_t index, Births& born) {
  switch (record.kind) {
    case CatalogRecord::Kind::kCommit:
    case CatalogRecord::Kind::kPrevious:
      born[{record.job, record.name, record.version}] = index;
      break;
    case CatalogRecord::Kind::kCommitBatch:
    case CatalogRecord::Kind::kCommitBatchKeepingPrevious:
      for (const CatalogRecord::CommittedVersion& c : record.commits) {
        born[{record.job, c.name, c.version}] = index;
      }
      break;
    default:
      break;
  }
}

// One run of a live version's placement.
struct LiveRun {
  Placement::Run run;
  CatalogState::Key key;
  uint64_t version = 0;
  bool previous = false;
  size_t born = 0;
};

std::vector<LiveRun> LiveRuns(const CatalogState& state, const Births& born) {
  std::vector<LiveRun> runs;
  for (const auto& [key, t] : state.tensors()) {
    auto add = [&](const std::optional<Placement>& placement, uint64_t version,
                   bool previous) {
      if (!placement.has_value()) return;
      auto it = born.find({key.first, key.second, version});
      const size_t when = it == born.end() ? 0 : it->second;
      for (const Placement::Run& run : RunsOf(*placement)) {
        runs.push_back(LiveRun{run, key, version, previous, when});
      }
    };
    add(t.placement, t.committed_version, false);
    add(t.previous_placement, t.previous_version, true);
  }
  std::sort(runs.begin(), runs.end(), [](const LiveRun& a, const LiveRun& b) {
    return std::tie(a.run.device, a.run.offset) <
           std::tie(b.run.device, b.run.offset);
  });
  return runs;
}

std::string Name(const LiveRun& r) {
  return absl::StrCat("'", r.key.first, "/", r.key.second, "' ",
                      r.previous ? "previous " : "", "version ", r.version);
}

// Versions whose space a version recorded later also names: the record
// that freed them was lost, and their bytes have been written over since.
// Each is dropped from `state` (the later one stays); returns what was
// dropped, by job.
std::map<std::string, std::vector<std::string>> DropOverlaps(
    CatalogState& state, const Births& born) {
  std::map<std::string, std::vector<std::string>> dropped;
  while (true) {
    const std::vector<LiveRun> runs = LiveRuns(state, born);
    std::set<std::pair<CatalogState::Key, bool>> drop;
    const LiveRun* reach = nullptr;  // The run reaching furthest so far.
    for (const LiveRun& r : runs) {
      if (reach != nullptr && reach->run.device == r.run.device &&
          r.run.offset < reach->run.offset + reach->run.length) {
        const LiveRun& older = reach->born <= r.born ? *reach : r;
        const LiveRun& newer = reach->born <= r.born ? r : *reach;
        if (drop.insert({older.key, older.previous}).second) {
          dropped[older.key.first].push_back(absl::StrCat(
              Name(older), " (its space on device ", r.run.device,
              " is also named by ", Name(newer),
              ", recorded later: a record that freed it was lost)"));
        }
      }
      if (reach == nullptr || reach->run.device != r.run.device ||
          r.run.offset + r.run.length > reach->run.offset + reach->run.length) {
        reach = &r;
      }
    }
    if (drop.empty()) return dropped;
    for (const auto& [key, previous] : drop) state.DropVersion(key, previous);
  }
}

// Per job: its tensors, how many have a committed version, and the tags
// they were committed with (tensors of one job committed with different
// tags do not belong together: lohand refuses to resume such a job).
std::vector<std::string> PerJob(
    const CatalogState& state,
    const std::map<std::string, std::vector<std::string>>& dropped) {
  struct Counts {
    size_t tensors = 0;
    size_t committed = 0;
    std::map<uint64_t, size_t> tags;
  };
  std::map<std::string, Counts> jobs;
  for (const auto& [key, tensor] : state.tensors()) {
    Counts& c = jobs[key.first];
    ++c.tensors;
    if (tensor.committed_version == 0) continue;
    ++c.committed;
    if (tensor.committed_tag != 0) ++c.tags[tensor.committed_tag];
  }
  for (const auto& [job, what] : dropped) jobs[job];  // dropped whole
  std::vector<std::string> lines;
  for (const auto& [job, c] : jobs) {
    std::string line = absl::StrCat("job ", job, ": ", c.tensors, " tensors (",
                                    c.committed, " committed)");
    if (c.tags.size() > 1) {
      std::vector<std::string> tags;
      for (const auto& [tag, n] : c.tags) {
        tags.push_back(absl::StrCat(n, " with tag ", tag));
      }
      absl::StrAppend(&line, "; committed apart (", absl::StrJoin(tags, ", "),
                      "): lohand refuses to resume it");
    }
    auto it = dropped.find(job);
    if (it != dropped.end()) {
      absl::StrAppend(&line, "; dropped ", absl::StrJoin(it->second, "; "));
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

}  // namespace

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
  Births born;
  size_t applied = 0;
  auto apply = [&](absl::string_view payload, const std::string& where) {
    absl::StatusOr<CatalogRecord> record = CatalogRecord::Decode(payload);
    absl::Status s = record.status();
    if (s.ok() && record->kind == CatalogRecord::Kind::kStoreInfo) {
      s = absl::DataLossError("a second store record");
    }
    if (s.ok()) {
      NoteBirths(*record, applied + 1, born);
      s = state.Apply(*std::move(record));
    }
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
    next = found.offset + RecordLog::FramedBytes(found.payload.size());
  }
  if (next < scan->file_bytes) {
    report.push_back(absl::StrCat("dropped bytes ", next, " to ",
                                  scan->file_bytes, " (not intact)"));
  }
  const std::map<std::string, std::vector<std::string>> dropped =
      DropOverlaps(state, born);

  const std::string damaged = absl::StrCat(
      path, ".damaged-", static_cast<long long>(std::time(nullptr)));
  if (::link(path.c_str(), damaged.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("keeping ", path, " as ", damaged,
                                             " (nothing changed)"));
  }
  absl::StatusOr<std::unique_ptr<RecordLog>> rewritten =
      RecordLog::Rewrite(path, state.Snapshot(info));
  if (!rewritten.ok()) return rewritten.status();

  const std::vector<std::string> per_job = PerJob(state, dropped);
  report.push_back(absl::StrCat("kept ", applied,
                                " records: ", state.tensors().size(),
                                " tensors of ", per_job.size(), " jobs"));
  for (const std::string& line : per_job) report.push_back(line);
  report.push_back(
      "the damaged bytes may have held records of any job: each job is "
      "checked again as it resumes, and one whose states no longer belong "
      "together is refused (DATA_LOSS) until it is restored from a "
      "checkpoint or deleted");
  report.push_back(absl::StrCat("the damaged catalog is kept as ", damaged,
                                "; the rebuilt one is in place"));
  return absl::StrJoin(report, "\n");
}

}  // namespace lohan
