// Hugging Face checkpoints and the dtypes lohan reads: safetensors files
// written here byte by byte (8-byte length, JSON header, data), read back
// through CheckpointReader, StageLayer and SafetensorsFile.
#include "client/checkpoint/hf_checkpoint.h"

#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/checkpoint/checkpoint_reader.h"
#include "client/checkpoint/checkpoint_restore.h"
#include "client/checkpoint/checkpoint_test_util.h"
#include "client/checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

// One tensor to write: its dtype, shape and raw little-endian bytes.
struct Raw {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string Bytes16(const std::vector<uint16_t>& values) {
  std::string out(2 * values.size(), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string Bytes32(const std::vector<float>& values) {
  std::string out(4 * values.size(), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// The 8-byte header length, `header` and `data`: a safetensors file as far
// as its bytes are right.
void WriteRaw(const fs::path& path, const std::string& header,
              const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t length = header.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << header << data;
}

// A header entry for tensor `name` at data bytes [begin, end).
std::string EntryJson(const std::string& name, const std::string& dtype,
                      const std::vector<int64_t>& shape, uint64_t begin,
                      uint64_t end) {
  std::string dims;
  for (size_t d = 0; d < shape.size(); ++d) {
    absl::StrAppend(&dims, d > 0 ? "," : "", shape[d]);
  }
  return absl::StrCat("\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":[",
                      dims, "],\"data_offsets\":[", begin, ",", end, "]}");
}

// `tensors` one after another, as Hugging Face's writer lays them out.
void WriteTensors(const fs::path& path, const std::vector<Raw>& tensors) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  std::string data;
  for (const Raw& tensor : tensors) {
    absl::StrAppend(&header, ",",
                    EntryJson(tensor.name, tensor.dtype, tensor.shape,
                              data.size(), data.size() + tensor.bytes.size()));
    data += tensor.bytes;
  }
  WriteRaw(path, header + "}", data);
}

uint32_t BitsOf(float value) { return std::bit_cast<uint32_t>(value); }

class HfCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("lohan-hf-checkpoint-test-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // TwoLayers' a [2, 3] (BF16) and c [4] (F32) in one shard, b [3] (F16)
  // in the other, and the index naming them; a's element i is i + 1, b's
  // 7 + i, c's -i.
  fs::path ShardedDirectory() {
    const fs::path dir = root_ / "hf";
    fs::create_directories(dir);
    WriteTensors(dir / "model-00001-of-00002.safetensors",
                 {{"a",
                   "BF16",
                   {2, 3},
                   Bytes16({0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0})},
                  {"c", "F32", {4}, Bytes32({0, -1, -2, -3})}});
    WriteTensors(dir / "model-00002-of-00002.safetensors",
                 {{"b", "F16", {3}, Bytes16({0x4700, 0x4800, 0x4880})}});
    WriteIndex(dir, {{"a", "model-00001-of-00002.safetensors"},
                     {"b", "model-00002-of-00002.safetensors"},
                     {"c", "model-00001-of-00002.safetensors"}});
    return dir;
  }

  static void WriteIndex(
      const fs::path& dir,
      const std::vector<std::pair<std::string, std::string>>& map) {
    std::string json = "{\"metadata\": {\"total_size\": 44}, \"weight_map\": {";
    for (size_t i = 0; i < map.size(); ++i) {
      absl::StrAppend(&json, i > 0 ? ", " : "", "\"", map[i].first, "\": \"",
                      map[i].second, "\"");
    }
    std::ofstream(dir / kHfIndexFile) << json << "}}";
  }

  static absl::Status Refusal(const fs::path& path) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::Open(path.string(), /*verify=*/false);
    EXPECT_FALSE(reader.ok()) << path;
    return reader.ok() ? absl::OkStatus() : reader.status();
  }

  fs::path root_;
};

TEST_F(HfCheckpointTest, ReadsBf16AndF16ExactlyAsFp32) {
  const fs::path file = root_ / "model.safetensors";
  // fp16: the smallest and largest subnormals, a negative one, -0, +-inf,
  // a quiet and a signalling NaN (payload kept), 1, the largest finite.
  const std::vector<uint16_t> f16 = {0x0001, 0x03FF, 0x8001, 0x8000, 0x7C00,
                                     0xFC00, 0x7E00, 0x7C01, 0x3C00, 0x7BFF};
  const std::vector<uint32_t> f16_as_f32 = {
      0x33800000, 0x387FC000, 0xB3800000, 0x80000000, 0x7F800000,
      0xFF800000, 0x7FC00000, 0x7F802000, 0x3F800000, 0x477FE000};
  // bf16: 1, -3, a subnormal, -inf, a NaN, -0.
  const std::vector<uint16_t> bf16 = {0x3F80, 0xC040, 0x0001,
                                      0xFF80, 0x7FC1, 0x8000};
  WriteTensors(file, {{"half", "F16", {2, 5}, Bytes16(f16)},
                      {"brain", "BF16", {6}, Bytes16(bf16)},
                      {"full", "F32", {2}, Bytes32({0.5f, -2.25f})}});
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(file.string(), /*verify=*/false);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> out(10);
  ASSERT_TRUE((*reader)->ReadAs("half", "weights", {2, 5}, out.data()).ok());
  for (size_t i = 0; i < f16.size(); ++i) {
    EXPECT_EQ(BitsOf(out[i]), f16_as_f32[i]) << "fp16 " << f16[i];
  }
  ASSERT_TRUE((*reader)->Read("brain", "weights", out.data(), 6).ok());
  for (size_t i = 0; i < bf16.size(); ++i) {
    EXPECT_EQ(BitsOf(out[i]), uint32_t{bf16[i]} << 16) << "bf16 " << bf16[i];
  }
  ASSERT_TRUE((*reader)->Read("full", "weights", out.data(), 2).ok());
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], -2.25f);
  EXPECT_EQ((*reader)->Dtype("half", "weights"), "F16");
  EXPECT_EQ((*reader)->Dtype("brain", "weights"), "BF16");
  EXPECT_EQ((*reader)->Dtype("full", "weights"), "F32");
  EXPECT_EQ((*reader)->Dtype("full", "exp_avg"), "");
}

TEST_F(HfCheckpointTest, ReadsALargeTensorInPiecesFromAnyElement) {
  // 600k bf16 elements: 1.2 MB, more than one 1 MiB piece.
  constexpr uint64_t kCount = 600000;
  std::vector<uint16_t> values(kCount);
  for (uint64_t i = 0; i < kCount; ++i) values[i] = 0x3F80 + (i % 4093);
  const fs::path file = root_ / "big.safetensors";
  WriteTensors(file, {{"w", "BF16", {3, 200000}, Bytes16(values)}});
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> opened =
      SafetensorsFile::Open(file.string());
  ASSERT_TRUE(opened.ok()) << opened.status();
  const SafetensorsFile::Entry* entry = (*opened)->Find("w");
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->dtype, "BF16");
  std::vector<float> out(kCount - 7);
  ASSERT_TRUE((*opened)->ReadRange(*entry, 7, kCount - 7, out.data()).ok());
  for (uint64_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(BitsOf(out[i]), uint32_t{values[i + 7]} << 16) << i;
  }
  EXPECT_EQ((*opened)->ReadRange(*entry, 8, kCount - 7, out.data()).code(),
            absl::StatusCode::kOutOfRange);
}

TEST_F(HfCheckpointTest, ReadsAShardedDirectoryByNameAcrossShards) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(ShardedDirectory().string(), /*verify=*/true);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->iteration(), 0u);
  EXPECT_TRUE((*reader)->moments().empty());
  EXPECT_EQ((*reader)->meta_json(), "{}");
  EXPECT_EQ((*reader)->world_size(), 1u);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"a", {2, 3}}, {"b", {3}}, {"c", {4}}};
  EXPECT_EQ((*reader)->Parameters(), want);
  std::vector<float> a(6), b(3), c(4);
  ASSERT_TRUE((*reader)->ReadAs("a", "weights", {2, 3}, a.data()).ok());
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  ASSERT_TRUE((*reader)->ReadAs("b", "weights", {3}, b.data()).ok());
  EXPECT_EQ(b, (std::vector<float>{7, 8, 9}));
  ASSERT_TRUE((*reader)->Read("c", "weights", c.data(), 4).ok());
  EXPECT_EQ(c, (std::vector<float>{0, -1, -2, -3}));
  EXPECT_EQ((*reader)->Shape("a", "exp_avg"), nullptr);
  EXPECT_EQ((*reader)->Dtype("b", "weights"), "F16");
  EXPECT_EQ((*reader)->Read("d", "weights", c.data(), 4).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(HfCheckpointTest, ASingleModelFileDirectoryIsACheckpoint) {
  const fs::path dir = root_ / "single";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << "{}";
  WriteTensors(dir / "model.safetensors",
               {{"w", "BF16", {2}, Bytes16({0x3F80, 0xBF80})}});
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir.string(), /*verify=*/false);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> w(2);
  ASSERT_TRUE((*reader)->Read("w", "weights", w.data(), 2).ok());
  EXPECT_EQ(w, (std::vector<float>{1, -1}));
  EXPECT_EQ((*reader)->meta_json(), "{}");
}

TEST_F(HfCheckpointTest, StagesALayerWhoseParametersLieInTwoShards) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(ShardedDirectory().string(), /*verify=*/false);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const v1::CheckpointLayer layer = TwoLayers({"weights"}, 0).layers(0);
  std::vector<float> whole(9, -1.0f);
  ASSERT_TRUE(
      StageLayer(**reader, layer, "weights", 0, 1, whole.data(), 9).ok());
  EXPECT_EQ(whole, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // Rank 1 of 2: elements 5..9, padding; a (BF16) straddles the ranks'
  // boundary: rank 0 reads its first 5 elements, rank 1 its last, and b
  // (F16, in the other file).
  std::vector<float> shard(5, -1.0f);
  ASSERT_TRUE(
      StageLayer(**reader, layer, "weights", 1, 2, shard.data(), 5).ok());
  EXPECT_EQ(shard, (std::vector<float>{6, 7, 8, 9, 0}));
  ASSERT_TRUE(
      StageLayer(**reader, layer, "weights", 0, 2, shard.data(), 5).ok());
  EXPECT_EQ(shard, (std::vector<float>{1, 2, 3, 4, 5}));
  // Three ranks: a's 0..3 and 3..6, then b.
  std::vector<float> third(3, -1.0f);
  for (uint32_t rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(
        StageLayer(**reader, layer, "weights", rank, 3, third.data(), 3).ok());
    EXPECT_EQ(third, (std::vector<float>{3.0f * rank + 1, 3.0f * rank + 2,
                                         3.0f * rank + 3}))
        << rank;
  }
  EXPECT_EQ(
      StageLayer(**reader, layer, "exp_avg", 0, 1, whole.data(), 9).code(),
      absl::StatusCode::kNotFound);
}

TEST_F(HfCheckpointTest, RefusesAnIndexNamingAMissingFileOrTensor) {
  const fs::path dir = ShardedDirectory();
  WriteIndex(dir, {{"a", "model-00001-of-00002.safetensors"},
                   {"b", "model-00003-of-00002.safetensors"}});
  absl::Status refused = Refusal(dir);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr(kHfIndexFile),
                    HasSubstr("model-00003-of-00002.safetensors, which is "
                              "missing")));
  WriteIndex(dir, {{"a", "model-00001-of-00002.safetensors"},
                   {"b", "model-00001-of-00002.safetensors"}});
  refused = Refusal(dir);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr(kHfIndexFile),
                    HasSubstr("puts tensor b in "
                              "model-00001-of-00002.safetensors, which lacks "
                              "it")));
  for (const char* outside : {"../model-00001-of-00002.safetensors",
                              "sub/model-00001-of-00002.safetensors", ".."}) {
    WriteIndex(dir, {{"a", outside}});
    refused = Refusal(dir);
    EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << outside;
    EXPECT_THAT(refused.message(), HasSubstr("outside its directory"));
  }
  std::ofstream(dir / kHfIndexFile) << "{\"weight_map\": ";
  refused = Refusal(dir);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr(kHfIndexFile), HasSubstr("is damaged")));
}

TEST_F(HfCheckpointTest, RefusesAShardCutShort) {
  const fs::path dir = ShardedDirectory();
  const fs::path shard = dir / "model-00002-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 1);
  const absl::Status refused = Refusal(dir);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr(shard.string() + " is cut short"),
                    HasSubstr("tensor b")));
}

TEST_F(HfCheckpointTest, RefusesADamagedHeader) {
  const fs::path file = root_ / "model.safetensors";
  const std::string data = Bytes32({1, 2});
  const std::string entry = EntryJson("w", "F32", {2}, 0, 8);
  // A length past the file's end, no JSON, JSON that is no object.
  std::ofstream(file, std::ios::binary)
      << "\xff\xff\xff\xff\xff\xff\xff\x0f" << data;
  const std::vector<std::pair<std::string, absl::Status>> refusals = {
      {"bad header length", Refusal(file)},
      {"the header", (WriteRaw(file, "{" + entry, data), Refusal(file))},
      {"the header is no object",
       (WriteRaw(file, "[{" + entry + "}]", data), Refusal(file))},
  };
  for (const auto& [why, refused] : refusals) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << why;
    EXPECT_THAT(refused.message(),
                AllOf(HasSubstr(file.string() + " is not a safetensors file"),
                      HasSubstr(why)));
  }
}

TEST_F(HfCheckpointTest, RefusesDataOffsetsNotOfTheShapeAndDtype) {
  const fs::path file = root_ / "model.safetensors";
  // 4 bf16 elements take 8 bytes, the header says 16 (as if F32).
  WriteRaw(file, "{" + EntryJson("w", "BF16", {4}, 0, 16) + "}",
           Bytes32({1, 2, 3, 4}));
  const absl::Status refused = Refusal(file);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr(file.string() + ": tensor w"),
                    HasSubstr("not of its shape (4,) and dtype BF16")));
}

TEST_F(HfCheckpointTest, OpensOtherDtypesAndRefusesToReadThem) {
  const fs::path file = root_ / "model.safetensors";
  WriteTensors(file, {{"w", "F16", {1}, Bytes16({0x3C00})},
                      {"position_ids", "I64", {2}, std::string(16, '\0')}});
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(file.string(), /*verify=*/false);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->Dtype("position_ids", "weights"), "I64");
  std::vector<float> out(2);
  ASSERT_TRUE((*reader)->Read("w", "weights", out.data(), 1).ok());
  EXPECT_EQ(out[0], 1.0f);
  const absl::Status refused =
      (*reader)->Read("position_ids", "weights", out.data(), 2);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      refused.message(),
      AllOf(HasSubstr(file.string()), HasSubstr("tensor position_ids is I64")));
}

TEST_F(HfCheckpointTest, ADirectoryWithoutWeightsIsNoCheckpoint) {
  const fs::path dir = root_ / "config-only";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << "{}";
  const absl::Status refused = Refusal(dir);
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr("not a lohan checkpoint"),
                    HasSubstr("Hugging Face checkpoint directory"),
                    HasSubstr("model.safetensors.index.json")));
}

}  // namespace
}  // namespace lohan::checkpoint
