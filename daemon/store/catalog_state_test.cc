#include "daemon/store/catalog_state.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

CatalogRecord Create(const std::string& name, uint64_t bytes) {
  CatalogRecord r;
  r.kind = CatalogRecord::Kind::kCreate;
  r.job = "j";
  r.name = name;
  r.bytes = bytes;
  return r;
}

Placement PlacementOf(uint64_t bytes, uint64_t offset) {
  Placement p;
  p.bytes = bytes;
  p.region_offset = {offset};
  p.region_length = {4096};
  p.chunk_crc = {static_cast<uint32_t>(offset * 7 + 1)};
  return p;
}

CatalogRecord Commit(const std::string& name, uint64_t version,
                     Placement placement) {
  CatalogRecord r;
  r.kind = CatalogRecord::Kind::kCommit;
  r.job = "j";
  r.name = name;
  r.version = version;
  r.placement = std::move(placement);
  return r;
}

CatalogRecord Delete(const std::string& name) {
  CatalogRecord r;
  r.kind = CatalogRecord::Kind::kDelete;
  r.job = "j";
  r.name = name;
  return r;
}

CatalogRecord StoreInfo() {
  CatalogRecord r;
  r.kind = CatalogRecord::Kind::kStoreInfo;
  r.stripe_unit = 65536;
  r.block_size = 4096;
  r.device_paths = {"/a", "/b"};
  return r;
}

TEST(CatalogStateTest, AppliesRecordsInOrder) {
  CatalogState state;
  ASSERT_TRUE(state.Apply(Create("a", 10)).ok());
  ASSERT_TRUE(state.Apply(Create("b", 20)).ok());
  ASSERT_TRUE(state.Apply(Create("gone", 30)).ok());
  ASSERT_TRUE(state.Apply(Commit("a", 1, PlacementOf(10, 0))).ok());
  ASSERT_TRUE(state.Apply(Commit("a", 4, PlacementOf(10, 8192))).ok());
  CatalogRecord batch;
  batch.kind = CatalogRecord::Kind::kCommitBatch;
  batch.job = "j";
  batch.commits = {{"b", 2, PlacementOf(20, 4096)},
                   {"gone", 3, PlacementOf(30, 12288)}};
  ASSERT_TRUE(state.Apply(batch).ok());
  ASSERT_TRUE(state.Apply(Delete("gone")).ok());

  const auto& tensors = state.tensors();
  ASSERT_EQ(tensors.size(), 2u);
  const CatalogState::Tensor& a = tensors.at({"j", "a"});
  EXPECT_EQ(a.bytes, 10u);
  EXPECT_EQ(a.committed_version, 4u);
  EXPECT_EQ(*a.placement, PlacementOf(10, 8192));
  EXPECT_EQ(tensors.at({"j", "b"}).committed_version, 2u);
}

TEST(CatalogStateTest, RefusesCommitsOfUnknownOrWrongSizedTensorsWhole) {
  CatalogState state;
  ASSERT_TRUE(state.Apply(Create("a", 10)).ok());
  EXPECT_EQ(state.Apply(Commit("missing", 1, PlacementOf(10, 0))).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(state.Apply(Commit("a", 1, PlacementOf(11, 0))).code(),
            absl::StatusCode::kDataLoss);
  CatalogRecord batch;
  batch.kind = CatalogRecord::Kind::kCommitBatch;
  batch.job = "j";
  batch.commits = {{"a", 2, PlacementOf(10, 0)},
                   {"missing", 3, PlacementOf(30, 4096)}};
  absl::Status s = state.Apply(batch);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s;
  // Nothing of the refused batch applied.
  EXPECT_FALSE(state.tensors().at({"j", "a"}).placement.has_value());
  EXPECT_EQ(state.Apply(StoreInfo()).code(), absl::StatusCode::kDataLoss);
}

TEST(CatalogStateTest, SnapshotReplaysToTheSameState) {
  CatalogState state;
  ASSERT_TRUE(state.Apply(Create("a", 10)).ok());
  ASSERT_TRUE(state.Apply(Create("uncommitted", 5)).ok());
  ASSERT_TRUE(state.Apply(Commit("a", 7, PlacementOf(10, 4096))).ok());
  const std::vector<std::string> snapshot = state.Snapshot(StoreInfo());
  // Store info, 2 creates, 1 commit, the sync mark.
  ASSERT_EQ(snapshot.size(), 5u);
  EXPECT_EQ(CatalogRecord::Decode(snapshot.back())->kind,
            CatalogRecord::Kind::kSyncMark);
  auto first = CatalogRecord::Decode(snapshot[0]);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->device_paths, StoreInfo().device_paths);

  CatalogState replayed;
  for (size_t i = 1; i < snapshot.size(); ++i) {
    auto record = CatalogRecord::Decode(snapshot[i]);
    ASSERT_TRUE(record.ok()) << record.status();
    ASSERT_TRUE(replayed.Apply(*std::move(record)).ok());
  }
  ASSERT_EQ(replayed.tensors().size(), state.tensors().size());
  for (const auto& [key, tensor] : state.tensors()) {
    const CatalogState::Tensor& other = replayed.tensors().at(key);
    EXPECT_EQ(other.bytes, tensor.bytes);
    EXPECT_EQ(other.committed_version, tensor.committed_version);
    EXPECT_EQ(other.placement, tensor.placement);
  }
}

}  // namespace
}  // namespace lohan
