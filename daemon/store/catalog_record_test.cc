#include "daemon/store/catalog_record.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

using Kind = CatalogRecord::Kind;

TEST(CatalogRecordTest, RoundTripsEveryKind) {
  CatalogRecord info;
  info.kind = Kind::kStoreInfo;
  info.stripe_unit = 1 << 20;
  info.block_size = 4096;
  info.device_paths = {"/a", "/b"};
  CatalogRecord commit;
  commit.kind = Kind::kCommit;
  commit.job = "job";
  commit.name = "layer.0.weight";
  commit.version = 7;
  commit.placement.bytes = 5000;
  commit.placement.first_device = 1;
  commit.placement.region_offset = {0, 8192};
  commit.placement.region_length = {4096, 4096};
  commit.placement.chunk_crc = {0xdeadbeef, 0x12345678};
  CatalogRecord create;
  create.kind = Kind::kCreate;
  create.job = "j";
  create.name = "n";
  create.bytes = 123;
  CatalogRecord del;
  del.kind = Kind::kDelete;
  del.job = "j";
  del.name = "n";

  auto i = CatalogRecord::Decode(info.Encode());
  ASSERT_TRUE(i.ok()) << i.status();
  EXPECT_EQ(i->device_paths, info.device_paths);
  EXPECT_EQ(i->stripe_unit, info.stripe_unit);
  EXPECT_EQ(i->block_size, info.block_size);
  auto c = CatalogRecord::Decode(commit.Encode());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kind, Kind::kCommit);
  EXPECT_EQ(c->job, "job");
  EXPECT_EQ(c->name, "layer.0.weight");
  EXPECT_EQ(c->version, 7u);
  EXPECT_EQ(c->placement, commit.placement);
  auto cr = CatalogRecord::Decode(create.Encode());
  ASSERT_TRUE(cr.ok());
  EXPECT_EQ(cr->bytes, 123u);
  auto d = CatalogRecord::Decode(del.Encode());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->kind, Kind::kDelete);
  EXPECT_EQ(d->name, "n");
}

TEST(CatalogRecordTest, RejectsTruncatedAndUnknown) {
  CatalogRecord commit;
  commit.kind = Kind::kCommit;
  commit.job = "job";
  commit.name = "t";
  commit.placement.bytes = 1;
  commit.placement.region_offset = {0};
  commit.placement.region_length = {4096};
  commit.placement.chunk_crc = {1};
  const std::string enc = commit.Encode();
  for (size_t n = 0; n < enc.size(); ++n) {
    EXPECT_EQ(CatalogRecord::Decode(enc.substr(0, n)).status().code(),
              absl::StatusCode::kDataLoss)
        << n;
  }
  EXPECT_FALSE(CatalogRecord::Decode(enc + "x").ok());
  EXPECT_FALSE(CatalogRecord::Decode(std::string(1, '\x7f')).ok());
}

TEST(CatalogRecordTest, CommitBatchRoundTripsAndRejectsEveryTruncation) {
  CatalogRecord batch;
  batch.kind = Kind::kCommitBatch;
  batch.job = "job";
  for (int i = 0; i < 3; ++i) {
    CatalogRecord::CommittedVersion c;
    c.name = "t" + std::to_string(i);
    c.version = 10 + i;
    c.placement.bytes = 4096 * (i + 1);
    c.placement.first_device = i;
    c.placement.region_offset = {0, 8192, 16384};
    c.placement.region_length = {4096, 0, 4096};
    c.placement.chunk_crc = std::vector<uint32_t>(i + 1, 0xabc0 + i);
    batch.commits.push_back(c);
  }
  const std::string enc = batch.Encode();
  auto back = CatalogRecord::Decode(enc);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, Kind::kCommitBatch);
  EXPECT_EQ(back->job, "job");
  EXPECT_EQ(back->commits, batch.commits);
  for (size_t n = 0; n < enc.size(); ++n) {
    EXPECT_EQ(CatalogRecord::Decode(enc.substr(0, n)).status().code(),
              absl::StatusCode::kDataLoss)
        << n;
  }
  EXPECT_FALSE(CatalogRecord::Decode(enc + "x").ok());
  CatalogRecord empty;
  empty.kind = Kind::kCommitBatch;
  empty.job = "job";
  EXPECT_FALSE(CatalogRecord::Decode(empty.Encode()).ok());
}

TEST(CatalogRecordTest, PlacementsInSeveralRunsRoundTripInBatches) {
  Placement split;
  split.bytes = 5 * 65536 + 100;
  split.first_device = 0;
  split.region_offset = {0, 65536};
  split.region_length = {65536, 65536};
  split.more_runs = {
      {0, 4 * 65536, 65536}, {1, 9 * 65536, 65536}, {0, 7 * 65536, 4096}};
  split.chunk_crc = {1, 2, 3, 4, 5, 6};
  Placement whole;
  whole.bytes = 4096;
  whole.first_device = 1;
  whole.region_offset = {0, 3 * 65536};
  whole.region_length = {0, 4096};
  whole.chunk_crc = {9};
  CatalogRecord batch;
  batch.kind = Kind::kCommitBatch;
  batch.job = "j";
  batch.commits = {{"a", 3, split}, {"b", 4, whole}, {"c", 5, split}};
  auto decoded = CatalogRecord::Decode(batch.Encode());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->commits.size(), 3u);
  EXPECT_EQ(decoded->commits, batch.commits);

  // A placement in one run per device encodes as before the runs existed.
  CatalogRecord plain;
  plain.kind = Kind::kCommit;
  plain.job = "j";
  plain.name = "b";
  plain.version = 4;
  plain.placement = whole;
  CatalogRecord with_runs = plain;
  with_runs.placement = split;
  // kind 1, job 4+1, name 4+1, version 8, bytes 8, first device 4,
  // device count 4, 2 x (offset, length) 32, CRC count 4, 1 CRC 4.
  EXPECT_EQ(plain.Encode().size(), 75u);
  EXPECT_GT(with_runs.Encode().size(), 75u);
  const std::string bytes = with_runs.Encode();
  // Truncated inside the runs: malformed, not misread.
  for (size_t cut : {size_t{1}, size_t{4}, size_t{21}}) {
    EXPECT_EQ(CatalogRecord::Decode(bytes.substr(0, bytes.size() - cut))
                  .status()
                  .code(),
              absl::StatusCode::kDataLoss)
        << cut;
  }
}

TEST(CatalogRecordTest, KeptCommitRecordsRoundTrip) {
  CatalogRecord previous;
  previous.kind = Kind::kPrevious;
  previous.job = "job";
  previous.name = "t";
  previous.version = 41;
  previous.placement.bytes = 4096;
  previous.placement.region_offset = {8192};
  previous.placement.region_length = {4096};
  previous.placement.chunk_crc = {7};
  auto back = CatalogRecord::Decode(previous.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, Kind::kPrevious);
  EXPECT_EQ(back->version, 41u);
  EXPECT_EQ(back->placement, previous.placement);
  for (Kind kind : {Kind::kReleasePrevious, Kind::kRevertToPrevious}) {
    CatalogRecord of_job;
    of_job.kind = kind;
    of_job.job = "job";
    const std::string enc = of_job.Encode();
    auto decoded = CatalogRecord::Decode(enc);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->kind, kind);
    EXPECT_EQ(decoded->job, "job");
    EXPECT_FALSE(CatalogRecord::Decode(enc.substr(0, enc.size() - 1)).ok());
  }
  CatalogRecord batch;
  batch.kind = Kind::kCommitBatchKeepingPrevious;
  batch.job = "job";
  batch.commits.push_back({"t", 42, previous.placement});
  auto kept = CatalogRecord::Decode(batch.Encode());
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->kind, Kind::kCommitBatchKeepingPrevious);
  EXPECT_EQ(kept->commits, batch.commits);
}

// Tags and snapshot sizes are trailing fields: records written before them
// decode as untagged (0) and without a size; written, they come back.
TEST(CatalogRecordTest, TagsAndSnapshotSizesRoundTripAndOlderRecordsDecode) {
  CatalogRecord info;
  info.kind = Kind::kStoreInfo;
  info.device_paths = {"/a"};
  info.store_id = "id";
  auto old_info = CatalogRecord::Decode(info.Encode());
  ASSERT_TRUE(old_info.ok());
  EXPECT_FALSE(old_info->has_snapshot_size);
  info.has_snapshot_size = true;
  info.snapshot_records = 12;
  info.snapshot_bytes = 3456;
  auto sized = CatalogRecord::Decode(info.Encode());
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_TRUE(sized->has_snapshot_size);
  EXPECT_EQ(sized->snapshot_records, 12u);
  EXPECT_EQ(sized->snapshot_bytes, 3456u);
  EXPECT_EQ(sized->store_id, "id");
  info.store_id.clear();  // a store without an id still says its size
  sized = CatalogRecord::Decode(info.Encode());
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_EQ(sized->snapshot_bytes, 3456u);

  for (Kind kind : {Kind::kCommit, Kind::kPrevious, Kind::kCommitBatch,
                    Kind::kCommitBatchKeepingPrevious}) {
    CatalogRecord commit;
    commit.kind = kind;
    commit.job = "job";
    commit.name = "t";
    commit.placement.bytes = 1;
    commit.placement.region_offset = {0};
    commit.placement.region_length = {4096};
    commit.placement.chunk_crc = {1};
    commit.commits = {{"t", 3, commit.placement}};
    auto untagged = CatalogRecord::Decode(commit.Encode());
    ASSERT_TRUE(untagged.ok()) << untagged.status();
    EXPECT_EQ(untagged->tag, 0u);
    commit.tag = 42;
    const std::string tagged = commit.Encode();
    auto decoded = CatalogRecord::Decode(tagged);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->tag, 42u) << static_cast<int>(kind);
    // A tag field that says 0 is written by no one: malformed.
    std::string zero = tagged;
    zero.replace(zero.size() - 8, 8, std::string(8, '\0'));
    EXPECT_EQ(CatalogRecord::Decode(zero).status().code(),
              absl::StatusCode::kDataLoss);
    EXPECT_FALSE(CatalogRecord::Decode(tagged + "x").ok());
  }
}

}  // namespace
}  // namespace lohan
