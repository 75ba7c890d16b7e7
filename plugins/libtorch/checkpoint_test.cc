// The checkpoint format on its own: written, read back, and refused when
// torn, damaged, mixed or of another model.
#include "plugins/libtorch/checkpoint.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/libtorch/json_value.h"
#include "plugins/libtorch/safetensors.h"

namespace lohan::torch_plugin {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Two layers: {a [2, 3], b [3]} and {c [4]}; part p's value of element i
// of layer l is 100 * p + 10 * l + i.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("lohan-checkpoint-test-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    layers_ = {{{"a", "b"}, {{2, 3}, {3}}, {0, 6}}, {{"c"}, {{4}}, {0}}};
  }
  void TearDown() override { fs::remove_all(root_); }

  void Save(const std::string& directory, uint64_t iteration,
            bool moments = true) {
    const std::vector<std::string> parts =
        moments ? std::vector<std::string>{"weights", "exp_avg", "exp_avg_sq"}
                : std::vector<std::string>{"weights"};
    CheckpointMeta meta;
    meta.job_name = "test";
    meta.job_id = "id";
    meta.iteration = iteration;
    meta.lr = 1e-3;
    WriteCheckpoint(
        directory, layers_,
        [&](size_t layer, const std::string& part) {
          const float p = part == "weights" ? 0 : part == "exp_avg" ? 1 : 2;
          buffer_.assign(9, 0.0f);
          for (size_t i = 0; i < buffer_.size(); ++i) {
            buffer_[i] = 100 * p + 10 * layer + i + iteration;
          }
          return buffer_.data();
        },
        parts, meta);
  }

  static void Corrupt(const fs::path& file, uint64_t offset) {
    std::fstream data(file, std::ios::in | std::ios::out | std::ios::binary);
    data.seekg(static_cast<std::streamoff>(offset));
    char byte = 0;
    data.read(&byte, 1);
    byte ^= 0x01;
    data.seekp(static_cast<std::streamoff>(offset));
    data.write(&byte, 1);
  }

  fs::path root_;
  std::vector<CheckpointLayer> layers_;
  std::vector<float> buffer_;
};

TEST_F(CheckpointTest, RoundTripsTheValuesAndTheStep) {
  const std::string dir = (root_ / "ckpt").string();
  Save(dir, 3);
  const CheckpointReader reader(dir);
  EXPECT_EQ(reader.iteration(), 3u);
  EXPECT_EQ(reader.moments(),
            (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  std::vector<float> b(3);
  reader.Read("b", "exp_avg", {3}, b.data());
  EXPECT_EQ(b, (std::vector<float>{109, 110, 111}));
  std::vector<float> c(4);
  reader.Read("c", "weights", {4}, c.data());
  EXPECT_EQ(c, (std::vector<float>{13, 14, 15, 16}));

  const SafetensorsFile weights((root_ / "ckpt" / kWeightsFile).string());
  EXPECT_EQ(weights.metadata().at("format"), "pt");
  EXPECT_EQ(weights.metadata().at("lohan_iteration"), "3");
  std::ifstream meta(root_ / "ckpt" / kMetaFile);
  const std::string text((std::istreambuf_iterator<char>(meta)),
                         std::istreambuf_iterator<char>());
  const JsonValue json = JsonValue::Parse(text, "lohan.json");
  EXPECT_EQ(json.Find("layers")->items()[0].items()[1].text(), "b");
  EXPECT_EQ(json.Find("iteration")->AsUint64("iteration"), 3u);
}

TEST_F(CheckpointTest, ASaveReplacesTheWholeCheckpointAndKeepsOtherFiles) {
  const fs::path dir = root_ / "ckpt";
  Save(dir.string(), 1);
  std::ofstream(dir / "notes.txt") << "mine";
  Save(dir.string(), 2, /*moments=*/false);
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  EXPECT_FALSE(fs::exists(dir / kOptimizerFile));
  const CheckpointReader reader(dir.string());
  EXPECT_EQ(reader.iteration(), 2u);
  EXPECT_TRUE(reader.moments().empty());
  // Nothing is left beside it.
  int entries = 0;
  for (const auto& entry : fs::directory_iterator(root_)) {
    (void)entry;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(CheckpointTest, RefusesATornFile) {
  const fs::path dir = root_ / "ckpt";
  Save(dir.string(), 1);
  fs::resize_file(dir / kOptimizerFile,
                  fs::file_size(dir / kOptimizerFile) - 4);
  try {
    CheckpointReader reader(dir.string());
    FAIL() << "a torn checkpoint was read";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("is torn: optimizer.safetensors"));
  }
}

TEST_F(CheckpointTest, RefusesADamagedFile) {
  const fs::path dir = root_ / "ckpt";
  Save(dir.string(), 1);
  Corrupt(dir / kWeightsFile, fs::file_size(dir / kWeightsFile) - 2);
  try {
    CheckpointReader reader(dir.string());
    FAIL() << "a damaged checkpoint was read";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(),
                HasSubstr("model.safetensors is damaged (CRC-32"));
  }
}

TEST_F(CheckpointTest, RefusesFilesOfTwoSaves) {
  Save((root_ / "one").string(), 1);
  Save((root_ / "two").string(), 1);
  fs::copy_file(root_ / "two" / kOptimizerFile, root_ / "one" / kOptimizerFile,
                fs::copy_options::overwrite_existing);
  try {
    CheckpointReader reader((root_ / "one").string());
    FAIL() << "a mixed checkpoint was read";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("is mixed"));
  }
}

TEST_F(CheckpointTest, RefusesAMissingTensorOrAnotherShape) {
  const std::string dir = (root_ / "ckpt").string();
  Save(dir, 1);
  const CheckpointReader reader(dir);
  std::vector<float> out(6);
  try {
    reader.Read("d", "weights", {6}, out.data());
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("no weights for parameter d"));
  }
  try {
    reader.Read("a", "exp_avg_sq", {3, 2}, out.data());
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(
        error.what(),
        HasSubstr("a (exp_avg_sq) has shape (2, 3), the model's (3, 2)"));
  }
}

TEST_F(CheckpointTest, NamesWhatIsNotACheckpoint) {
  try {
    CheckpointReader reader((root_ / "nothing").string());
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("not a lohan checkpoint"));
  }
}

TEST(Crc32Test, IsZlibs) {
  EXPECT_EQ(Crc32(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(Crc32(Crc32(0, "1234", 4), "56789", 5), 0xCBF43926u);
}

}  // namespace
}  // namespace lohan::torch_plugin
