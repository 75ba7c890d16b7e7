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

}  // namespace
}  // namespace lohan
