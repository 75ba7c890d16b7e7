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

}  // namespace
}  // namespace lohan
