// A sharded checkpoint (the Python plugin's save with data-parallel
// ranks, written here as sharded_checkpoint.py lays it out) read through
// CheckpointReader: each parameter assembled from the shards it spans,
// padding ignored, and a plan that does not hold together refused.
// tests/python/test_data_parallel.py checks the same reader against the
// Python writer's own files.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/libtorch/checkpoint.h"
#include "plugins/libtorch/safetensors.h"

namespace lohan::torch_plugin {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int kWorld = 3;
// Layer 0: a [2, 3] then b [3] (9 elements, shards of 3); layer 1: c [4]
// (shards of 2, the last one padding). Element i of layer l, part p, is
// 100 * p + 10 * l + i.
constexpr uint64_t kNumel[] = {9, 4};
constexpr uint64_t kShard[] = {3, 2};
const std::vector<std::string> kParts = {"weights", "exp_avg"};

float Value(size_t part, size_t layer, uint64_t i) {
  return static_cast<float>(100 * part + 10 * layer + i);
}

class ShardedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lohan-sharded-checkpoint-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string ShardFile(int rank) {
    return "shard-0000" + std::to_string(rank) + "-of-0000" +
           std::to_string(kWorld) + ".safetensors";
  }

  // Writes the shard files and lohan.json; `shard_of_layer1` overrides the
  // shard size lohan.json gives layer 1, `listed` how many shard files its
  // manifest lists.
  void Write(uint64_t shard_of_layer1 = kShard[1], int listed = kWorld) {
    std::string files;
    for (int rank = 0; rank < kWorld; ++rank) {
      std::vector<TensorDecl> declared;
      for (size_t l = 0; l < 2; ++l) {
        for (const std::string& part : kParts) {
          declared.push_back({"layer." + std::to_string(l) + "/" + part,
                              {static_cast<int64_t>(kShard[l])}});
        }
      }
      SafetensorsWriter writer((dir_ / ShardFile(rank)).string(), declared,
                               {{"lohan_save_id", "s1"}});
      for (size_t l = 0; l < 2; ++l) {
        for (size_t p = 0; p < kParts.size(); ++p) {
          std::vector<float> shard(kShard[l], 0.0f);  // padding: zeros
          for (uint64_t k = 0; k < kShard[l]; ++k) {
            const uint64_t i = rank * kShard[l] + k;
            if (i < kNumel[l]) shard[k] = Value(p, l, i);
          }
          writer.Write(declared[2 * l + p].name, shard.data(),
                       static_cast<int64_t>(shard.size()));
        }
      }
      const FileDigest digest = writer.Close();
      if (rank < listed) {
        files += std::string(files.empty() ? "" : ",") + "\"" +
                 ShardFile(rank) +
                 "\": {\"bytes\": " + std::to_string(digest.bytes) +
                 ", \"crc32\": " + std::to_string(digest.crc32) + "}";
      }
    }
    std::ofstream(dir_ / "lohan.json")
        << "{\"job_name\": \"dp\", \"iteration\": 7, \"optimizer_state\": "
           "[\"exp_avg\"], \"save_id\": \"s1\", \"files\": {"
        << files << "}, \"sharding\": {\"world_size\": " << kWorld
        << ", \"files\": [\"" << ShardFile(0) << "\", \"" << ShardFile(1)
        << "\", \"" << ShardFile(2)
        << "\"], \"layers\": [{\"numel\": 9, \"shard\": 3, \"names\": "
           "[\"a\", \"b\"], \"shapes\": [[2, 3], [3]], \"offsets\": [0, 6]}, "
           "{\"numel\": 4, \"shard\": "
        << shard_of_layer1
        << ", \"names\": [\"c\"], \"shapes\": [[4]], \"offsets\": [0]}]}}";
  }

  fs::path dir_;
};

TEST_F(ShardedCheckpointTest, AssemblesEachParameterFromTheShardsItSpans) {
  Write();
  const CheckpointReader reader(dir_.string());
  EXPECT_EQ(reader.world_size(), 3u);
  EXPECT_EQ(reader.iteration(), 7u);
  EXPECT_EQ(reader.moments(), std::vector<std::string>{"exp_avg"});
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"a", {2, 3}}, {"b", {3}}, {"c", {4}}};
  EXPECT_EQ(reader.Parameters(), want);
  for (size_t p = 0; p < kParts.size(); ++p) {
    std::vector<float> a(6), b(3), c(4);
    reader.Read("a", kParts[p], {2, 3}, a.data());  // shards 0 and 1
    reader.Read("b", kParts[p], {3}, b.data());     // shard 2
    reader.Read("c", kParts[p], {4}, c.data());     // shards 0, 1
    for (uint64_t i = 0; i < 6; ++i) EXPECT_EQ(a[i], Value(p, 0, i)) << i;
    for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(b[i], Value(p, 0, 6 + i)) << i;
    for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(c[i], Value(p, 1, i)) << i;
  }
  std::vector<float> out(4);
  try {
    reader.Read("c", "exp_avg_sq", {4}, out.data());
    FAIL() << "a part it does not hold";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("no exp_avg_sq for parameter c"));
  }
  try {
    reader.Read("c", "weights", {2, 2}, out.data());
    FAIL() << "another shape";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("has shape (4,), the model's (2, 2)"));
  }
}

TEST_F(ShardedCheckpointTest, RefusesAPlanTheShardsDoNotHold) {
  Write(/*shard_of_layer1=*/1);  // 3 shards of 1 cannot hold 4 elements
  try {
    CheckpointReader reader(dir_.string());
    FAIL() << "opened";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(),
                HasSubstr("3 shards of 1 elements cannot hold 4"));
  }
  Write(/*shard_of_layer1=*/kShard[1], /*listed=*/2);
  try {
    CheckpointReader reader(dir_.string());
    FAIL() << "opened";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr(ShardFile(2) + " is not in its "
                                                       "manifest"));
  }
  // A shard file replaced by another save's: the manifest's CRC says so.
  Write();
  {
    std::fstream file(dir_ / ShardFile(1),
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-3, std::ios::end);
    file.put('\x7f');
  }
  try {
    CheckpointReader reader(dir_.string());
    FAIL() << "opened";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr(ShardFile(1) + " is damaged"));
  }
}

}  // namespace
}  // namespace lohan::torch_plugin
