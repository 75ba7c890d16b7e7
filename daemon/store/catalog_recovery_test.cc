// The catalog corruption sweep: a real store's catalog (creates, commits,
// a batch commit, deletes), then every damage the sweep can make to it: a
// flipped byte in the length, checksum and payload of the first, second,
// middle and last record; truncation at every record boundary and inside
// every record; zero blocks and garbage after the end. Each opens as the
// daemon would: it must replay exactly what the file holds (a clean or
// torn tail) or refuse naming the offset; a store that opens with other
// committed data than it had is a silent loss, and there must be none.
// Salvage then rebuilds what is intact.

#include "daemon/store/catalog_recovery.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/store/catalog_record.h"
#include "daemon/store/record_log.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing::HasSubstr;
using testing_util::Pattern;
using testing_util::ReadWholeFile;
using testing_util::TempDir;
using testing_util::WriteWholeFile;

// Each tensor's committed version and data ("" when the read fails).
using Committed = std::map<std::string, std::pair<uint64_t, std::string>>;

class CatalogSweepTest : public ::testing::Test {
 protected:
  StoreOptions Options(const std::string& state_dir) {
    StoreOptions o;
    o.ssd_paths = {dir_.Subdir("ssd0"), dir_.Subdir("ssd1")};
    o.state_dir = state_dir;
    o.stripe_unit = 64 << 10;
    o.queue_depth = 8;
    o.device_capacity_bytes = 8 << 20;
    return o;
  }

  // A store's life: tensors created, written and committed over a few
  // iterations, one batch commit, kept commits (a data-parallel rank's:
  // released, reverted, one left kept), a tensor deleted.
  void SetUp() override {
    const StoreOptions o = Options(dir_.path() + "/state");
    auto store = TensorStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status();
    TensorStore& s = **store;
    const std::vector<std::string> names = {"a", "b", "c", "gone"};
    for (const std::string& name : names) {
      ASSERT_TRUE(s.Create("job", name, 70000).ok());
    }
    for (int iteration = 1; iteration <= 6; ++iteration) {
      for (const std::string& name : names) {
        const std::vector<uint8_t> data =
            Pattern(iteration * 10 + name[0], 70000);
        ASSERT_TRUE(s.Write("job", name, data).ok());
      }
      if (iteration == 2) {
        ASSERT_TRUE(s.CommitBatch("job", names).ok());
      } else if (iteration >= 4) {
        ASSERT_TRUE(s.CommitBatchKeepingPrevious("job", names).ok());
        if (iteration == 4) {
          ASSERT_TRUE(s.ReleasePrevious("job").ok());
        }
        if (iteration == 5) {
          ASSERT_TRUE(s.RevertToPrevious("job").ok());
        }
      } else {
        for (const std::string& name : names) {
          ASSERT_TRUE(s.Commit("job", name).ok());
        }
      }
    }
    ASSERT_TRUE(s.Delete("job", "gone").ok());
    ASSERT_TRUE(s.Create("job", "scratch", 4096).ok());  // unsynced
    want_ = CommittedOf(s);
    store->reset();
    clean_ = ReadWholeFile(o.state_dir + "/catalog.log");
    // Record boundaries of the clean log.
    absl::StatusOr<RecordLog::Scan> scan =
        RecordLog::ScanFile(o.state_dir + "/catalog.log");
    ASSERT_TRUE(scan.ok());
    ASSERT_FALSE(scan->prefix.torn_tail);
    uint64_t at = 0;
    for (const std::string& record : scan->prefix.records) {
      starts_.push_back(at);
      at += 8 + record.size();
      absl::StatusOr<CatalogRecord> decoded = CatalogRecord::Decode(record);
      ASSERT_TRUE(decoded.ok());
      kinds_.push_back(decoded->kind);
    }
    starts_.push_back(at);
    ASSERT_GE(starts_.size(), 10u);
  }

  Committed CommittedOf(TensorStore& s) {
    Committed out;
    for (const std::string& name : s.List("job")) {
      absl::StatusOr<TensorInfo> info = s.Stat("job", name);
      if (!info.ok() || info->committed_version == 0) continue;
      std::string data(info->bytes, '\0');
      absl::StatusOr<uint64_t> read = s.Read(
          "job", name,
          absl::MakeSpan(reinterpret_cast<uint8_t*>(data.data()), data.size()));
      if (!read.ok()) {
        // Only ever a checksum mismatch: data never read back wrong.
        EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
        data.clear();
        ++read_refusals_;
      }
      out[name] = {info->committed_version, data};
    }
    return out;
  }

  enum class Outcome { kExact, kShorter, kRefused, kSilentLoss };

  // Opens a store over `catalog` in a fresh state directory. kExact: it
  // holds every committed tensor as before; kShorter: it holds what the
  // records left in the file say (a cut file cannot say more), each intact;
  // kRefused: DATA_LOSS naming an offset; kSilentLoss: anything else.
  Outcome Open(const std::string& catalog, const std::string& label, bool cut) {
    const std::string state = dir_.Subdir("case" + std::to_string(cases_++));
    WriteWholeFile(state + "/catalog.log", catalog);
    auto store = TensorStore::Open(Options(state));
    if (!store.ok()) {
      EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss)
          << label << ": " << store.status();
      EXPECT_THAT(std::string(store.status().message()), HasSubstr("offset"))
          << label;
      EXPECT_THAT(std::string(store.status().message()), HasSubstr("--salvage"))
          << label;
      // Nothing was changed.
      EXPECT_EQ(ReadWholeFile(state + "/catalog.log"), catalog) << label;
      return Outcome::kRefused;
    }
    const Committed found = CommittedOf(**store);
    if (found == want_) return Outcome::kExact;
    if (!cut) return Outcome::kSilentLoss;
    // A cut file says an older state: older versions, whose space later
    // versions may have reused. Their data then fails its checksum on
    // read (DATA_LOSS, counted), never reads back wrong.
    for (const auto& [name, version] : found) {
      if (!want_.contains(name) && name != "gone") return Outcome::kSilentLoss;
    }
    return Outcome::kShorter;
  }

  TempDir dir_;
  Committed want_;
  std::string clean_;
  std::vector<uint64_t> starts_;  // Record offsets, then the file's end.
  std::vector<CatalogRecord::Kind> kinds_;  // Each record's.
  int cases_ = 0;
  int read_refusals_ = 0;  // Reads refused with DATA_LOSS (checksums).
};

TEST_F(CatalogSweepTest, EveryDamageIsReplayedExactlyOrRefused) {
  std::map<Outcome, int> counts;
  const size_t records = starts_.size() - 1;
  // Flipped bytes in every record: length, checksum, first and last
  // payload byte.
  for (size_t r = 0; r < records; ++r) {
    const uint64_t begin = starts_[r], end = starts_[r + 1];
    for (uint64_t at : {begin, begin + 4, begin + 8, end - 1}) {
      for (uint8_t mask : {uint8_t{0x01}}) {
        std::string damaged = clean_;
        damaged[at] = static_cast<char>(damaged[at] ^ mask);
        const Outcome o =
            Open(damaged, absl::StrCat("record ", r, " byte ", at, " ^", mask),
                 false);
        EXPECT_NE(o, Outcome::kSilentLoss) << "record " << r << " byte " << at;
        // Damage to a record that changed anything durable (all but sync
        // marks and the unsynced create at the end) is never a torn tail.
        if (kinds_[r] != CatalogRecord::Kind::kSyncMark && r + 1 < records) {
          EXPECT_EQ(o, Outcome::kRefused) << "record " << r << " byte " << at;
        }
        ++counts[o];
      }
    }
  }
  const int flips = counts[Outcome::kExact] + counts[Outcome::kRefused] +
                    counts[Outcome::kSilentLoss];
  // Cuts: at every record boundary and inside every record (header and
  // payload).
  std::map<Outcome, int> cut_counts;
  for (size_t r = 0; r < records; ++r) {
    for (uint64_t at :
         {starts_[r], starts_[r] + 3, (starts_[r] + starts_[r + 1]) / 2}) {
      const Outcome o =
          Open(clean_.substr(0, at), absl::StrCat("cut at ", at), true);
      EXPECT_NE(o, Outcome::kSilentLoss) << "cut at " << at;
      // The first record cut: refused; elsewhere what is left replays.
      if (r == 0) {
        EXPECT_EQ(o, Outcome::kRefused) << at;
      }
      ++cut_counts[o];
    }
  }
  // After the end: zero blocks (a crash after the size grew), and garbage.
  std::string zeros = clean_ + std::string(4096, '\0');
  EXPECT_EQ(Open(zeros, "zeros after the end", false), Outcome::kExact);
  std::string garbage = clean_ + "\x13\x00\x00\x00garbage-garbage-garbage";
  EXPECT_EQ(Open(garbage, "garbage after the end", false), Outcome::kExact);
  EXPECT_EQ(Open(clean_, "clean", false), Outcome::kExact);
  std::printf(
      "catalog sweep (%zu records): %d flipped bytes: %d refused naming the "
      "offset, %d replayed exactly, %d silently lost; %d cuts: %d refused, "
      "%d replayed exactly, %d replayed what the cut file holds (%d reads "
      "of versions whose space was reused since refused by their "
      "checksums), %d silently lost; zero blocks and garbage after the end "
      "replayed exactly\n",
      records, flips, counts[Outcome::kRefused], counts[Outcome::kExact],
      counts[Outcome::kSilentLoss],
      cut_counts[Outcome::kRefused] + cut_counts[Outcome::kExact] +
          cut_counts[Outcome::kShorter] + cut_counts[Outcome::kSilentLoss],
      cut_counts[Outcome::kRefused], cut_counts[Outcome::kExact],
      cut_counts[Outcome::kShorter], read_refusals_,
      cut_counts[Outcome::kSilentLoss]);
  EXPECT_EQ(counts[Outcome::kSilentLoss], 0);
  EXPECT_EQ(cut_counts[Outcome::kSilentLoss], 0);
}

// A catalog that begins with a snapshot of many tensors (the store
// reopened, which compacts), then one more commit appended. A snapshot is
// synced whole before it is put in place, so no crash leaves it short: a
// cut at any record boundary or inside any record of it, or a zeroed block
// in it, is damage, refused naming the catalog; only cuts after it open.
TEST_F(CatalogSweepTest, ACutInsideASnapshotIsRefusedNeverTakenForATornTail) {
  const StoreOptions o = Options(dir_.Subdir("snapshot"));
  WriteWholeFile(o.state_dir + "/catalog.log", clean_);
  {
    auto store = TensorStore::Open(o);  // compacts into a snapshot
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Write("job", "a", Pattern(99, 70000)).ok());
    ASSERT_TRUE((*store)->Commit("job", "a", /*tag=*/7).ok());
  }
  const std::string log = ReadWholeFile(o.state_dir + "/catalog.log");
  absl::StatusOr<RecordLog::Scan> scan =
      RecordLog::ScanFile(o.state_dir + "/catalog.log");
  ASSERT_TRUE(scan.ok());
  absl::StatusOr<CatalogRecord> info =
      CatalogRecord::Decode(scan->prefix.records[0]);
  ASSERT_TRUE(info.ok());
  ASSERT_TRUE(info->has_snapshot_size);
  std::vector<uint64_t> starts;
  uint64_t at = 0;
  for (const std::string& record : scan->prefix.records) {
    starts.push_back(at);
    at += RecordLog::FramedBytes(record.size());
  }
  const uint64_t snapshot_end =
      starts[0] + RecordLog::FramedBytes(scan->prefix.records[0].size()) +
      info->snapshot_bytes;
  ASSERT_EQ(starts[info->snapshot_records + 1], snapshot_end);
  ASSERT_GE(info->snapshot_records, 8u);  // creates, commits, previous
  int refused = 0, opened = 0;
  auto open = [&](const std::string& catalog, const std::string& label) {
    const std::string state = dir_.Subdir("s" + std::to_string(cases_++));
    WriteWholeFile(state + "/catalog.log", catalog);
    auto store = TensorStore::Open(Options(state));
    if (store.ok()) {
      ++opened;
      return true;
    }
    EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << label;
    EXPECT_THAT(std::string(store.status().message()),
                HasSubstr(state + "/catalog.log"))
        << label;
    ++refused;
    return false;
  };
  for (size_t r = 1; r <= info->snapshot_records; ++r) {
    for (uint64_t cut : {starts[r], starts[r] + 5,
                         (starts[r] + starts[r + 1]) / 2, starts[r + 1] - 1}) {
      EXPECT_FALSE(open(log.substr(0, cut), absl::StrCat("cut at ", cut)))
          << "a snapshot cut at " << cut << " (record " << r << ") opened";
    }
  }
  // A block of the snapshot zeroed, as a lost page leaves it.
  for (uint64_t block = 0; block < snapshot_end; block += 512) {
    std::string zeroed = log;
    for (uint64_t i = block; i < std::min<uint64_t>(block + 512, zeroed.size());
         ++i) {
      zeroed[i] = '\0';
    }
    EXPECT_FALSE(open(zeroed, absl::StrCat("zeroed block at ", block)))
        << "a snapshot with the block at " << block << " zeroed opened";
  }
  // Cut after the snapshot: what the records there say (here the commit
  // appended, or not), never refused.
  for (uint64_t cut = snapshot_end; cut <= log.size(); ++cut) {
    EXPECT_TRUE(open(log.substr(0, cut), absl::StrCat("cut at ", cut)))
        << "cut after the snapshot at " << cut;
  }
  std::printf(
      "snapshot of %llu records: %d cuts and zeroed blocks inside it "
      "refused, %d cuts after it opened\n",
      static_cast<unsigned long long>(info->snapshot_records), refused, opened);
}

TEST_F(CatalogSweepTest, SalvageKeepsWhatIsIntactAndSaysWhatItDrops) {
  // A flipped byte in the payload of the batch commit (iteration 2):
  // refused; salvage keeps everything else.
  size_t r = 0;
  while (kinds_[r] != CatalogRecord::Kind::kCommitBatch) ++r;
  std::string damaged = clean_;
  damaged[starts_[r] + 9] = static_cast<char>(damaged[starts_[r] + 9] ^ 0x40);
  const StoreOptions o = Options(dir_.Subdir("salvage"));
  WriteWholeFile(o.state_dir + "/catalog.log", damaged);
  WriteWholeFile(o.state_dir + "/LOCK", "");
  auto refused = TensorStore::Open(o);
  ASSERT_FALSE(refused.ok());
  absl::StatusOr<std::string> report = TensorStore::Salvage(o);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(*report, HasSubstr(absl::StrCat("dropped bytes ", starts_[r])));
  EXPECT_THAT(*report, HasSubstr("kept "));
  EXPECT_THAT(*report, HasSubstr(".damaged-"));
  // The damaged file is kept as it was.
  bool kept = false;
  for (const auto& entry : std::filesystem::directory_iterator(o.state_dir)) {
    const std::string name = entry.path().filename();
    if (name.rfind("catalog.log.damaged-", 0) == 0) {
      EXPECT_EQ(ReadWholeFile(entry.path()), damaged);
      kept = true;
    }
  }
  EXPECT_TRUE(kept);
  // The rebuilt catalog opens; the last iteration's commits came after the
  // damage and are all there.
  auto store = TensorStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(CommittedOf(**store), want_);
  // A catalog that is not damaged is left alone.
  store->reset();
  absl::StatusOr<std::string> again = TensorStore::Salvage(o);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CatalogSweepTest, ADamagedFirstRecordIsSalvagedFromTheConfiguration) {
  std::string damaged = clean_;
  damaged[10] = static_cast<char>(damaged[10] ^ 0x01);
  const StoreOptions o = Options(dir_.Subdir("first"));
  WriteWholeFile(o.state_dir + "/catalog.log", damaged);
  WriteWholeFile(o.state_dir + "/LOCK", "");
  auto refused = TensorStore::Open(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("first record"));
  absl::StatusOr<std::string> report = TensorStore::Salvage(o);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(*report, HasSubstr("rebuilt from the configuration"));
  auto store = TensorStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(CommittedOf(**store), want_);
}

// A power cut while the next iteration commits, at every step: the
// catalog then holds the synced prefix (everything up to the last
// acknowledged commit) and any part of what was appended after it (the
// scratch create, not synced, then the commit record, appended and not yet
// synced), cut anywhere, with the rest of its last block zero or missing.
// Every such catalog must open (a crash is not damage) with the last
// acknowledged iteration, or the new one when its commit record is whole.
TEST_F(CatalogSweepTest, APowerCutAtEveryStepOfACommitOpensAtACommittedState) {
  const StoreOptions o = Options(dir_.path() + "/state");
  const std::string acked = clean_;  // Ends with the unsynced create.
  // The next iteration, committed whole, to learn its records' bytes.
  Committed next;
  {
    auto store = TensorStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status();
    const std::vector<std::string> names = {"a", "b", "c"};
    for (const std::string& name : names) {
      ASSERT_TRUE(
          (*store)->Write("job", name, Pattern(40 + name[0], 70000)).ok());
    }
    ASSERT_TRUE((*store)->CommitBatch("job", names).ok());
    next = CommittedOf(**store);
  }
  // The reopen compacted the log: rebuild the tail as the crash would have
  // seen it, the clean log's bytes then the batch record (the last record
  // of the new file).
  const std::string compacted = ReadWholeFile(o.state_dir + "/catalog.log");
  absl::StatusOr<RecordLog::Scan> scan =
      RecordLog::ScanFile(o.state_dir + "/catalog.log");
  ASSERT_TRUE(scan.ok());
  // The compacted log ends [... batch commit][sync mark]: the batch record
  // is the one before the last.
  const std::vector<std::string>& records = scan->prefix.records;
  ASSERT_GE(records.size(), 2u);
  const size_t commit_bytes = 8 + records[records.size() - 2].size();
  const size_t mark_bytes = 8 + records.back().size();
  const std::string framed =
      compacted.substr(compacted.size() - commit_bytes - mark_bytes);
  const std::string full = acked + framed;
  int cuts = 0, old_state = 0, new_state = 0, refused = 0;
  for (size_t keep = 0; keep <= framed.size();
       keep += keep < 16 || keep + 3 >= commit_bytes ? 1 : 5) {
    for (bool zero_rest : {false, true}) {
      if (zero_rest && keep == framed.size()) continue;
      std::string crashed = full.substr(0, acked.size() + keep);
      if (zero_rest) {
        // The record's block was allocated, its bytes never written.
        crashed.resize(
            std::max<size_t>(crashed.size(),
                             (acked.size() + keep + 511) / 512 * 512),
            '\0');
      }
      const std::string state = dir_.Subdir("cut" + std::to_string(cuts++));
      WriteWholeFile(state + "/catalog.log", crashed);
      auto store = TensorStore::Open(Options(state));
      if (!store.ok()) {
        ADD_FAILURE() << "keep " << keep << " zero " << zero_rest << ": "
                      << store.status();
        ++refused;
        continue;
      }
      const Committed found = CommittedOf(**store);
      if (keep >= commit_bytes) {
        EXPECT_EQ(found, next) << "keep " << keep;
        ++new_state;
      } else {
        EXPECT_EQ(found, want_) << "keep " << keep;
        ++old_state;
      }
    }
  }
  std::printf(
      "power cut while committing (%d catalogs: the commit record and its "
      "sync mark cut at every byte of the header and the last bytes, every "
      "5th between, with and without the rest of the block zero-filled): %d "
      "opened at the acknowledged iteration, %d at the new one (its record "
      "whole), %d refused\n",
      cuts, old_state, new_state, refused);
  EXPECT_EQ(refused, 0);
  EXPECT_GT(new_state, 0);
}

}  // namespace
}  // namespace lohan
