// A one-process checkpoint: written, read back, and refused when torn,
// damaged, mixed, missing or of another model.
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
#include "client/checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// TwoLayers; element i of layer l, part p is 100 * p + 10 * l + i +
// iteration.
v1::CheckpointContents Contents(uint64_t iteration, bool moments) {
  return TwoLayers(
      moments ? std::vector<std::string>{"weights", "exp_avg", "exp_avg_sq"}
              : std::vector<std::string>{"weights"},
      iteration);
}

float Value(int part, uint32_t layer, uint64_t i, uint64_t iteration) {
  return static_cast<float>(100 * part + 10 * layer + i + iteration);
}

// The plugin's own fields; a stale "layers" and "iteration" of its own are
// replaced by what the contents say.
constexpr char kPluginMeta[] =
    "{\"adam\": {\"lr\": 0.001}, \"layers\": [[\"stale\"]], "
    "\"iteration\": 999}";

absl::Status Save(const fs::path& directory, uint64_t iteration,
                  bool moments = true, const std::string& meta = kPluginMeta) {
  absl::StatusOr<std::unique_ptr<CheckpointSave>> save =
      CheckpointSave::Begin(directory.string());
  if (!save.ok()) return save.status();
  const v1::CheckpointContents contents = Contents(iteration, moments);
  if (absl::Status opened = (*save)->Open(contents); !opened.ok()) {
    return opened;
  }
  for (uint32_t l = 0; l < 2; ++l) {
    for (int p = 0; p < contents.parts_size(); ++p) {
      std::vector<float> flat(contents.layers(l).elements());
      for (uint64_t i = 0; i < flat.size(); ++i) {
        flat[i] = Value(p, l, i, iteration);
      }
      if (absl::Status written = (*save)->writer()->Write(
              l, contents.parts(p), flat.data(), flat.size());
          !written.ok()) {
        return written;
      }
    }
  }
  if (absl::StatusOr<std::vector<FileEntry>> closed = (*save)->CloseFiles();
      !closed.ok()) {
    return closed.status();
  }
  return (*save)->Commit(meta, {});
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("lohan-checkpoint-test-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  static void Corrupt(const fs::path& file, uint64_t offset) {
    std::fstream data(file, std::ios::in | std::ios::out | std::ios::binary);
    data.seekg(static_cast<std::streamoff>(offset));
    char byte = 0;
    data.read(&byte, 1);
    byte ^= 0x01;
    data.seekp(static_cast<std::streamoff>(offset));
    data.write(&byte, 1);
  }

  static std::string Refusal(const fs::path& dir, bool verify = false) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::Open(dir.string(), verify);
    EXPECT_FALSE(reader.ok()) << dir;
    return reader.ok() ? "" : std::string(reader.status().message());
  }

  fs::path root_;
};

TEST_F(CheckpointTest, RoundTripsTheValuesTheStepAndThePluginsMeta) {
  const fs::path dir = root_ / "ckpt";
  ASSERT_TRUE(Save(dir, 3).ok());
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir.string(), /*verify=*/true);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->iteration(), 3u);
  EXPECT_EQ((*reader)->moments(),
            (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  std::vector<float> b(3), c(4);
  ASSERT_TRUE((*reader)->ReadAs("b", "exp_avg", {3}, b.data()).ok());
  EXPECT_EQ(b, (std::vector<float>{109, 110, 111}));
  ASSERT_TRUE((*reader)->Read("c", "weights", c.data(), 4).ok());
  EXPECT_EQ(c, (std::vector<float>{13, 14, 15, 16}));
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"a", {2, 3}}, {"b", {3}}, {"c", {4}}};
  EXPECT_EQ((*reader)->Parameters(), want);

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> weights =
      SafetensorsFile::Open((dir / kWeightsFile).string());
  ASSERT_TRUE(weights.ok());
  EXPECT_EQ((*weights)->metadata().at("format"), "pt");
  EXPECT_EQ((*weights)->metadata().at("lohan_iteration"), "3");
  absl::StatusOr<JsonValue> meta = ReadMeta(dir);
  ASSERT_TRUE(meta.ok());
  // The contents' job, step and layers first, then the plugin's fields.
  ASSERT_GE(meta->members().size(), 4u);
  ASSERT_EQ(meta->members()[0].first, "job_name");
  EXPECT_EQ(meta->Find("job_name")->text(), "test");
  ASSERT_EQ(meta->members()[1].first, "iteration");
  EXPECT_EQ(meta->Find("iteration")->text(), "3");
  ASSERT_EQ(meta->members()[2].first, "layers");
  ASSERT_EQ(meta->Find("layers")->items().size(), 2u);
  ASSERT_EQ(meta->Find("layers")->items()[0].items().size(), 2u);
  EXPECT_EQ(meta->Find("layers")->items()[0].items()[1].text(), "b");
  EXPECT_EQ(meta->Find("layers")->items()[1].items()[0].text(), "c");
  EXPECT_EQ(meta->members()[3].first, "adam");
  EXPECT_EQ(meta->Find("adam")->Find("lr")->text(), "0.001");
  EXPECT_EQ(meta->Find("save_id")->text(),
            (*weights)->metadata().at(kSaveIdKey));
  EXPECT_EQ(meta->Find("files")->members().size(), 2u);
  EXPECT_EQ((*reader)->meta_json(), *ReadText(dir / kMetaFile));
}

TEST_F(CheckpointTest, ASaveReplacesTheWholeCheckpointAndKeepsTheUsersFiles) {
  const fs::path dir = root_ / "ckpt";
  ASSERT_TRUE(Save(dir, 1).ok());
  std::ofstream(dir / "notes.txt") << "mine";
  std::ofstream(dir / ShardFileName(0, 2)) << "a sharded save's file";
  ASSERT_TRUE(Save(dir, 2, /*moments=*/false).ok());
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  EXPECT_FALSE(fs::exists(dir / kOptimizerFile));
  EXPECT_FALSE(fs::exists(dir / ShardFileName(0, 2)));
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir.string(), false);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->iteration(), 2u);
  EXPECT_TRUE((*reader)->moments().empty());
  EXPECT_EQ((*reader)->Shape("a", "exp_avg"), nullptr);
  int entries = 0;  // nothing is left beside it
  for (const auto& entry : fs::directory_iterator(root_)) {
    (void)entry;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(CheckpointTest, ASaveOntoAFileIsRefusedAndTheFileKept) {
  const fs::path file = root_ / "weights.bin";
  std::ofstream(file) << "not a directory";
  const absl::Status saved = Save(file, 1);
  EXPECT_EQ(saved.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(saved.message(), HasSubstr("is a file"));
  EXPECT_EQ(*ReadText(file), "not a directory");
}

TEST_F(CheckpointTest, RefusesTornMixedMissingAndDamagedFiles) {
  ASSERT_TRUE(Save(root_ / "one", 1).ok());
  ASSERT_TRUE(Save(root_ / "two", 1).ok());
  fs::copy(root_ / "one", root_ / "torn");
  fs::resize_file(root_ / "torn" / kOptimizerFile,
                  fs::file_size(root_ / "torn" / kOptimizerFile) - 4);
  EXPECT_THAT(Refusal(root_ / "torn"), HasSubstr("is torn: optimizer"));
  fs::copy(root_ / "one", root_ / "mixed");
  fs::copy_file(root_ / "two" / kOptimizerFile,
                root_ / "mixed" / kOptimizerFile,
                fs::copy_options::overwrite_existing);
  EXPECT_THAT(Refusal(root_ / "mixed"),
              HasSubstr("is mixed: optimizer.safetensors comes from save"));
  fs::copy(root_ / "one", root_ / "missing");
  fs::remove(root_ / "missing" / kOptimizerFile);
  EXPECT_THAT(Refusal(root_ / "missing"),
              HasSubstr("is incomplete: lohan.json lists optimizer"));
  fs::copy(root_ / "one", root_ / "damaged");
  Corrupt(root_ / "damaged" / kWeightsFile,
          fs::file_size(root_ / "damaged" / kWeightsFile) - 2);
  // Sizes and save ids agree: only the CRC-32 sees it.
  EXPECT_TRUE(CheckpointReader::Open((root_ / "damaged").string(), false).ok());
  EXPECT_THAT(Refusal(root_ / "damaged", /*verify=*/true),
              HasSubstr("model.safetensors is damaged (CRC-32"));
  EXPECT_THAT(VerifyCheckpoint((root_ / "damaged").string()).message(),
              HasSubstr("is damaged"));
  EXPECT_TRUE(VerifyCheckpoint((root_ / "one").string()).ok());
}

TEST_F(CheckpointTest, RefusesAMissingTensorOrAnotherShape) {
  ASSERT_TRUE(Save(root_ / "ckpt", 1).ok());
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open((root_ / "ckpt").string(), false);
  ASSERT_TRUE(reader.ok());
  std::vector<float> out(6);
  absl::Status read = (*reader)->ReadAs("d", "weights", {6}, out.data());
  EXPECT_EQ(read.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.message(), HasSubstr("no weights for parameter d"));
  read = (*reader)->ReadAs("a", "exp_avg_sq", {3, 2}, out.data());
  EXPECT_THAT(read.message(),
              HasSubstr("a (exp_avg_sq) has shape (2, 3), the model's (3, 2)"));
  EXPECT_EQ((*reader)->Read("a", "weights", out.data(), 5).code(),
            absl::StatusCode::kInvalidArgument);
  // A range has the same refusals, and none past the parameter's end.
  read = (*reader)->ReadRangeAs("d", "weights", {6}, 0, 1, out.data());
  EXPECT_EQ(read.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.message(), HasSubstr("d (the checkpoint is of another"));
  read = (*reader)->ReadRangeAs("a", "weights", {6}, 0, 1, out.data());
  EXPECT_EQ(read.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.message(), HasSubstr("has shape (2, 3), the model's (6,)"));
  EXPECT_EQ(
      (*reader)->ReadRangeAs("a", "weights", {2, 3}, 4, 3, out.data()).code(),
      absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(
      (*reader)->ReadRangeAs("a", "exp_avg", {2, 3}, 4, 2, out.data()).ok());
  EXPECT_EQ(out[0], Value(1, 0, 4, 1));
  EXPECT_EQ(out[1], Value(1, 0, 5, 1));
}

TEST_F(CheckpointTest, NamesWhatIsNotACheckpoint) {
  const absl::Status missing =
      CheckpointReader::Open((root_ / "nothing").string(), false).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("not a lohan checkpoint"));
  std::ofstream(root_ / "junk.safetensors") << "junk";
  EXPECT_THAT(Refusal(root_ / "junk.safetensors"),
              HasSubstr("is not a safetensors file"));
}

TEST_F(CheckpointTest, ReadsABareWeightsFile) {
  ASSERT_TRUE(Save(root_ / "ckpt", 4).ok());
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open((root_ / "ckpt" / kWeightsFile).string(), false);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->meta_json(), "{}");
  std::vector<float> b(3);
  ASSERT_TRUE((*reader)->Read("b", "weights", b.data(), 3).ok());
  EXPECT_EQ(b, (std::vector<float>{10, 11, 12}));
}

TEST_F(CheckpointTest, LayersWrittenOutOfOrderOrShortAreRefused) {
  absl::StatusOr<std::unique_ptr<CheckpointSave>> save =
      CheckpointSave::Begin((root_ / "ckpt").string());
  ASSERT_TRUE(save.ok());
  ASSERT_TRUE((*save)->Open(Contents(1, true)).ok());
  std::vector<float> flat(9);
  EXPECT_THAT((*save)->writer()->Write(0, "exp_avg", flat.data(), 9).message(),
              HasSubstr("expects layer 0 (weights)"));
  EXPECT_THAT((*save)->writer()->Write(0, "weights", flat.data(), 8).message(),
              HasSubstr("given 8 elements, the save takes 9"));
  ASSERT_TRUE((*save)->writer()->Write(0, "weights", flat.data(), 9).ok());
  EXPECT_THAT((*save)->CloseFiles().status().message(),
              HasSubstr("closed after 0 of 2 layers"));
  const fs::path staging = (*save)->staging();
  EXPECT_TRUE(fs::exists(staging));
  save->reset();  // abandoned: its staging directory goes, nothing else
  EXPECT_FALSE(fs::exists(staging));
  EXPECT_FALSE(fs::exists(root_ / "ckpt"));
}

TEST_F(CheckpointTest, ContentsThatCannotBeWrittenAreRefused) {
  v1::CheckpointContents contents = Contents(1, true);
  contents.set_parts(0, "exp_avg");
  absl::StatusOr<std::unique_ptr<CheckpointSave>> save =
      CheckpointSave::Begin((root_ / "ckpt").string());
  ASSERT_TRUE(save.ok());
  EXPECT_THAT((*save)->Open(contents).message(),
              HasSubstr("must start with \"weights\""));
  contents = Contents(1, true);
  contents.add_parts("momentum");
  EXPECT_THAT((*save)->Open(contents).message(),
              HasSubstr("unknown part \"momentum\""));
  contents = Contents(1, true);
  contents.mutable_layers(1)->set_elements(3);
  EXPECT_THAT((*save)->Open(contents).message(),
              HasSubstr("c lies past layer 1's 3 elements"));
  contents = Contents(1, true);
  contents.set_world_size(2);
  contents.set_rank(2);
  EXPECT_THAT((*save)->Open(contents).message(),
              HasSubstr("rank 2 of world size 2"));
}

TEST_F(CheckpointTest, AMetaThatIsNoJsonObjectIsRefusedAndTheLastSaveKept) {
  const fs::path dir = root_ / "ckpt";
  ASSERT_TRUE(Save(dir, 1).ok());
  EXPECT_THAT(Save(dir, 2, true, "[1, 2]").message(),
              HasSubstr("the save's meta must be a JSON object"));
  EXPECT_THAT(Save(dir, 2, true, "{\"adam\": ").message(),
              HasSubstr("the save's meta"));
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir.string(), /*verify=*/true);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->iteration(), 1u);
  // The refused saves left no staging directory behind.
  EXPECT_EQ(
      std::distance(fs::directory_iterator(root_), fs::directory_iterator()),
      1);
}

TEST_F(CheckpointTest, StagesALayerOrARanksShardOfItByNameOrAlias) {
  ASSERT_TRUE(Save(root_ / "ckpt", 0).ok());
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open((root_ / "ckpt").string(), false);
  ASSERT_TRUE(reader.ok());
  v1::CheckpointLayer layer = TwoLayers({"weights"}, 0).layers(0);
  std::vector<float> whole(9, -1.0f);
  ASSERT_TRUE(
      StageLayer(**reader, layer, "exp_avg", 0, 1, whole.data(), 9).ok());
  for (uint64_t i = 0; i < 9; ++i) EXPECT_EQ(whole[i], Value(1, 0, i, 0)) << i;
  // Rank 1 of 2: elements 5..9 of 9 (shards of 5), then a zero of padding;
  // a's elements come from the checkpoint's "a" under the alias. a [0, 6)
  // straddles the ranks' boundary: rank 0 reads its first 5, rank 1 its
  // last.
  layer.mutable_tensors(0)->set_name("renamed");
  layer.mutable_tensors(0)->add_aliases("a");
  std::vector<float> shard(5, -1.0f);
  ASSERT_TRUE(
      StageLayer(**reader, layer, "weights", 1, 2, shard.data(), 5).ok());
  EXPECT_EQ(shard, (std::vector<float>{5, 6, 7, 8, 0}));
  ASSERT_TRUE(
      StageLayer(**reader, layer, "exp_avg_sq", 0, 2, shard.data(), 5).ok());
  EXPECT_EQ(shard, (std::vector<float>{200, 201, 202, 203, 204}));
  EXPECT_THAT(
      StageLayer(**reader, layer, "weights", 1, 2, shard.data(), 4).message(),
      HasSubstr("takes 5 elements here, 4 given"));
  layer.mutable_tensors(1)->set_name("missing");
  const absl::Status missing =
      StageLayer(**reader, layer, "weights", 0, 1, whole.data(), 9);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(),
              HasSubstr("no weights for parameter missing (the checkpoint is "
                        "of another model?)"));
}

TEST(JsonValueTest, ParsesWhatItDumpsAndRefusesBrokenText) {
  const std::string text =
      "{\n \"a\": [\n  1,\n  2.5e-3\n ],\n \"b\": {\n  \"c\": \"x\\\"y\"\n },"
      "\n \"d\": [],\n \"e\": true\n}";
  absl::StatusOr<JsonValue> value = JsonValue::Parse(text, "t");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(value->Dump(), text);
  for (const char* broken :
       {"{", "[1,]", "{\"a\" 1}", "\"\\u12\"", "1 2", "{\"a\": tru}"}) {
    EXPECT_FALSE(JsonValue::Parse(broken, "t").ok()) << broken;
  }
  EXPECT_FALSE(JsonValue::Parse("-1", "t")->AsUint64("n").ok());
  // UTF-8 passes through; Python's \\u escapes decode to the same text.
  const std::string name = "caf\xc3\xa9.w\n";
  EXPECT_EQ(JsonQuoted(name), "\"caf\xc3\xa9.w\\n\"");
  EXPECT_EQ(JsonValue::Parse(JsonQuoted(name), "t")->text(), name);
  EXPECT_EQ(JsonValue::Parse("\"caf\\u00e9.w\\n\"", "t")->text(), name);
}

TEST(Crc32Test, IsZlibs) {
  EXPECT_EQ(Crc32(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(Crc32(Crc32(0, "1234", 4), "56789", 5), 0xCBF43926u);
}

}  // namespace
}  // namespace lohan::checkpoint
