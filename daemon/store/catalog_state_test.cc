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

CatalogRecord OfJob(CatalogRecord::Kind kind) {
  CatalogRecord r;
  r.kind = kind;
  r.job = "j";
  return r;
}

CatalogRecord Batch(CatalogRecord::Kind kind,
                    std::vector<CatalogRecord::CommittedVersion> commits) {
  CatalogRecord r = OfJob(kind);
  r.commits = std::move(commits);
  return r;
}

TEST(CatalogStateTest, KeptCommitsReleaseAndRevertAndSurviveASnapshot) {
  using Kind = CatalogRecord::Kind;
  CatalogState state;
  ASSERT_TRUE(state.Apply(Create("a", 10)).ok());
  ASSERT_TRUE(state.Apply(Create("b", 10)).ok());
  ASSERT_TRUE(
      state
          .Apply(Batch(Kind::kCommitBatch, {{"a", 1, PlacementOf(10, 0)},
                                            {"b", 1, PlacementOf(10, 4096)}}))
          .ok());
  ASSERT_TRUE(state
                  .Apply(Batch(Kind::kCommitBatchKeepingPrevious,
                               {{"a", 2, PlacementOf(10, 8192)},
                                {"b", 2, PlacementOf(10, 12288)}}))
                  .ok());
  const CatalogState::Tensor& a = state.tensors().at({"j", "a"});
  EXPECT_EQ(a.committed_version, 2u);
  EXPECT_EQ(a.previous_version, 1u);
  EXPECT_EQ(a.previous_placement->region_offset[0], 0u);

  // A snapshot replayed says the same (the kPrevious records).
  CatalogState replayed;
  const std::vector<std::string> records = state.Snapshot(StoreInfo());
  for (size_t i = 1; i < records.size(); ++i) {
    auto rec = CatalogRecord::Decode(records[i]);
    ASSERT_TRUE(rec.ok()) << rec.status();
    ASSERT_TRUE(replayed.Apply(*std::move(rec)).ok()) << i;
  }
  EXPECT_EQ(replayed.tensors().at({"j", "b"}).previous_version, 1u);
  EXPECT_EQ(replayed.tensors().at({"j", "b"}).committed_version, 2u);

  CatalogState released = state;
  ASSERT_TRUE(released.Apply(OfJob(Kind::kReleasePrevious)).ok());
  EXPECT_EQ(released.tensors().at({"j", "a"}).previous_version, 0u);
  EXPECT_FALSE(released.tensors().at({"j", "a"}).previous_placement);
  EXPECT_EQ(released.tensors().at({"j", "a"}).committed_version, 2u);

  ASSERT_TRUE(state.Apply(OfJob(Kind::kRevertToPrevious)).ok());
  for (const char* name : {"a", "b"}) {
    const CatalogState::Tensor& t = state.tensors().at({"j", name});
    EXPECT_EQ(t.committed_version, 1u) << name;
    EXPECT_EQ(t.previous_version, 0u) << name;
    EXPECT_FALSE(t.previous_placement) << name;
  }
  EXPECT_EQ(state.tensors().at({"j", "b"}).placement->region_offset[0], 4096u);
  // A plain commit after a kept one drops the previous version, one
  // tensor's or a batch's.
  for (CatalogRecord plain :
       {Commit("a", 4, PlacementOf(10, 16384)),
        Batch(Kind::kCommitBatch, {{"a", 4, PlacementOf(10, 16384)}})}) {
    const uint64_t before = state.tensors().at({"j", "a"}).committed_version;
    ASSERT_TRUE(state
                    .Apply(Batch(Kind::kCommitBatchKeepingPrevious,
                                 {{"a", 3, PlacementOf(10, 8192)}}))
                    .ok());
    EXPECT_EQ(state.tensors().at({"j", "a"}).previous_version, before);
    ASSERT_TRUE(state.Apply(plain).ok());
    EXPECT_EQ(state.tensors().at({"j", "a"}).committed_version, 4u);
    EXPECT_EQ(state.tensors().at({"j", "a"}).previous_version, 0u);
    EXPECT_FALSE(state.tensors().at({"j", "a"}).previous_placement);
  }
}

TEST(CatalogStateTest, RefusesAPreviousVersionOfAnUncommittedTensor) {
  CatalogState state;
  ASSERT_TRUE(state.Apply(Create("a", 10)).ok());
  CatalogRecord previous = Commit("a", 1, PlacementOf(10, 0));
  previous.kind = CatalogRecord::Kind::kPrevious;
  EXPECT_EQ(state.Check(previous).code(), absl::StatusCode::kDataLoss);
  previous.name = "missing";
  EXPECT_EQ(state.Check(previous).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace lohan
