// A sharded checkpoint: three data-parallel ranks each write their shard
// file of one save (rank 0 began it, the others joined), rank 0 commits,
// and CheckpointReader assembles each parameter from the shards it spans,
// padding ignored; a plan that does not hold together is refused.
// tests/python/test_data_parallel.py checks the same files against the
// safetensors package's own reader.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "client/checkpoint/checkpoint_reader.h"
#include "client/checkpoint/checkpoint_restore.h"
#include "client/checkpoint/checkpoint_save.h"
#include "client/checkpoint/checkpoint_test_util.h"
#include "client/checkpoint/json_value.h"
#include "client/checkpoint/manifest.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr uint32_t kWorld = 3;
// Layer 0: a [2, 3] then b [3] (9 elements, shards of 3); layer 1: c [4]
// (shards of 2, the last one padding). Element i of layer l, part p, is
// 100 * p + 10 * l + i.
constexpr uint64_t kNumel[] = {9, 4};
constexpr uint64_t kShard[] = {3, 2};

float Value(int part, uint32_t layer, uint64_t i) {
  return static_cast<float>(100 * part + 10 * layer + i);
}

v1::CheckpointContents Contents(uint32_t rank) {
  v1::CheckpointContents contents = TwoLayers({"weights", "exp_avg"}, 7);
  contents.set_rank(rank);
  contents.set_world_size(kWorld);
  return contents;
}

class ShardedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("lohan-sharded-checkpoint-test-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    dir_ = root_ / "ckpt";
  }
  void TearDown() override { fs::remove_all(root_); }

  // Every rank's shard file, then rank 0's commit.
  void Save() {
    absl::StatusOr<std::unique_ptr<CheckpointSave>> first =
        CheckpointSave::Begin(dir_.string());
    ASSERT_TRUE(first.ok()) << first.status();
    std::vector<std::unique_ptr<CheckpointSave>> ranks;
    ranks.push_back(*std::move(first));
    for (uint32_t r = 1; r < kWorld; ++r) {
      ranks.push_back(CheckpointSave::Join(ranks[0]->staging().string(),
                                           ranks[0]->save_id()));
    }
    std::vector<FileEntry> files;
    for (uint32_t rank = 0; rank < kWorld; ++rank) {
      const v1::CheckpointContents contents = Contents(rank);
      ASSERT_TRUE(ranks[rank]->Open(contents).ok());
      for (uint32_t l = 0; l < 2; ++l) {
        for (int p = 0; p < 2; ++p) {
          std::vector<float> shard(kShard[l], 0.0f);  // padding: zeros
          for (uint64_t k = 0; k < kShard[l]; ++k) {
            const uint64_t i = rank * kShard[l] + k;
            if (i < kNumel[l]) shard[k] = Value(p, l, i);
          }
          ASSERT_TRUE(
              ranks[rank]
                  ->writer()
                  ->Write(l, contents.parts(p), shard.data(), shard.size())
                  .ok());
        }
      }
      absl::StatusOr<std::vector<FileEntry>> closed = ranks[rank]->CloseFiles();
      ASSERT_TRUE(closed.ok());
      files.insert(files.end(), closed->begin(), closed->end());
    }
    ASSERT_TRUE(ranks[0]->Commit("{\"dtype\": \"fp32\"}", files).ok());
  }

  // lohan.json with `edit` applied to its text.
  void EditMeta(const std::string& from, const std::string& to) {
    std::string text = *ReadText(dir_ / kMetaFile);
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(dir_ / kMetaFile, std::ios::trunc) << text;
  }

  std::string Refusal() {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::Open(dir_.string(), /*verify=*/true);
    EXPECT_FALSE(reader.ok());
    return reader.ok() ? "" : std::string(reader.status().message());
  }

  fs::path root_;
  fs::path dir_;
};

TEST_F(ShardedCheckpointTest, AssemblesEachParameterFromTheShardsItSpans) {
  Save();
  EXPECT_EQ(fs::file_size(dir_ / ShardFileName(2, kWorld)),
            fs::file_size(dir_ / ShardFileName(0, kWorld)));
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir_.string(), /*verify=*/true);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->world_size(), 3u);
  EXPECT_EQ((*reader)->iteration(), 7u);
  EXPECT_EQ((*reader)->moments(), std::vector<std::string>{"exp_avg"});
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"a", {2, 3}}, {"b", {3}}, {"c", {4}}};
  EXPECT_EQ((*reader)->Parameters(), want);
  const std::vector<std::string> parts = {"weights", "exp_avg"};
  for (int p = 0; p < 2; ++p) {
    std::vector<float> a(6), b(3), c(4);
    ASSERT_TRUE((*reader)->ReadAs("a", parts[p], {2, 3}, a.data()).ok());
    ASSERT_TRUE((*reader)->ReadAs("b", parts[p], {3}, b.data()).ok());
    ASSERT_TRUE((*reader)->ReadAs("c", parts[p], {4}, c.data()).ok());
    for (uint64_t i = 0; i < 6; ++i) EXPECT_EQ(a[i], Value(p, 0, i)) << i;
    for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(b[i], Value(p, 0, 6 + i)) << i;
    for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(c[i], Value(p, 1, i)) << i;
  }
  std::vector<float> out(4);
  EXPECT_THAT((*reader)->ReadAs("c", "exp_avg_sq", {4}, out.data()).message(),
              HasSubstr("no exp_avg_sq for parameter c"));
  EXPECT_THAT((*reader)->ReadAs("c", "weights", {2, 2}, out.data()).message(),
              HasSubstr("has shape (4,), the model's (2, 2)"));
  absl::StatusOr<JsonValue> meta = ReadMeta(dir_);
  ASSERT_TRUE(meta.ok());
  // The job, step and layers are the contents' (rank 0's: whole layers).
  for (const char* key : {"job_name", "iteration", "layers", "dtype"}) {
    ASSERT_NE(meta->Find(key), nullptr) << key;
  }
  EXPECT_EQ(meta->Find("job_name")->text(), "test");
  EXPECT_EQ(meta->Find("iteration")->text(), "7");
  EXPECT_EQ(meta->Find("layers")->items().size(), 2u);
  EXPECT_EQ(meta->Find("dtype")->text(), "fp32");
  EXPECT_EQ(meta->Find("files")->members().size(), kWorld);
}

TEST_F(ShardedCheckpointTest, ReadsARangeFromTheShardsItSpans) {
  Save();
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir_.string(), /*verify=*/false);
  ASSERT_TRUE(reader.ok()) << reader.status();
  // a's elements 2..5: the end of rank 0's shard file, the start of rank 1's.
  std::vector<float> out(3, -1.0f);
  ASSERT_TRUE(
      (*reader)->ReadRangeAs("a", "exp_avg", {2, 3}, 2, 3, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{102, 103, 104}));
  // b's last element, in rank 2's file.
  ASSERT_TRUE(
      (*reader)->ReadRangeAs("b", "weights", {3}, 2, 1, out.data()).ok());
  EXPECT_EQ(out[0], Value(0, 0, 8));
  const absl::Status past =
      (*reader)->ReadRangeAs("b", "weights", {3}, 2, 2, out.data());
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(past.message(), HasSubstr("elements 2 + 2 of b (weights)"));
  EXPECT_THAT(
      (*reader)->ReadRangeAs("b", "weights", {4}, 0, 1, out.data()).message(),
      HasSubstr("b (weights) has shape (3,), the model's (4,)"));
}

// Restored by another number of ranks than saved it: 2 and 4 ranks each
// stage their shard of layer 0 (a [2, 3] at 0, b [3] at 6) from the 3
// shard files; a straddles the two ranks' boundary (at 5) and the files'
// (at 3), b the files' (at 6).
TEST_F(ShardedCheckpointTest, StagesARanksShardFromAnyNumberOfShardFiles) {
  Save();
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir_.string(), /*verify=*/false);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const v1::CheckpointLayer layer = Contents(0).layers(0);
  const std::vector<std::vector<float>> two = {{100, 101, 102, 103, 104},
                                               {105, 106, 107, 108, 0}};
  for (uint32_t rank = 0; rank < 2; ++rank) {
    std::vector<float> shard(5, -1.0f);
    ASSERT_TRUE(
        StageLayer(**reader, layer, "exp_avg", rank, 2, shard.data(), 5).ok());
    EXPECT_EQ(shard, two[rank]) << rank;
  }
  const std::vector<std::vector<float>> four = {
      {0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {0, 0, 0}};
  for (uint32_t rank = 0; rank < 4; ++rank) {
    std::vector<float> shard(3, -1.0f);
    ASSERT_TRUE(
        StageLayer(**reader, layer, "weights", rank, 4, shard.data(), 3).ok());
    EXPECT_EQ(shard, four[rank]) << rank;
  }
}

TEST_F(ShardedCheckpointTest, RefusesAPlanTheShardsDoNotHold) {
  Save();
  EditMeta("\"shard\": 2", "\"shard\": 1");
  EXPECT_THAT(Refusal(), HasSubstr("3 shards of 1 elements cannot hold 4"));
  Save();
  EditMeta("\"files\": {", "\"files\": {\"x\": {\"bytes\": 0, \"crc32\": 0},");
  EXPECT_THAT(Refusal(), HasSubstr("is incomplete: lohan.json lists x"));
  Save();
  const std::string last = ShardFileName(2, kWorld);
  fs::copy_file(dir_ / last, dir_ / "extra.safetensors");
  EditMeta("\"" + last + "\": {", "\"extra.safetensors\": {");
  EXPECT_THAT(Refusal(), HasSubstr(last + " is not in its manifest"));
  Save();
  {
    std::fstream file(dir_ / ShardFileName(1, kWorld),
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-3, std::ios::end);
    file.put('\x7f');
  }
  EXPECT_THAT(Refusal(), HasSubstr(ShardFileName(1, kWorld) + " is damaged"));
}

}  // namespace
}  // namespace lohan::checkpoint
