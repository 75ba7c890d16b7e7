// What staging a layer holds besides the staging buffer: a layer of one
// 32 MiB parameter is staged, whole and as rank 1 of 2's half, from each
// format (lohan's one-process file, its two ranks' shard files, a Hugging
// Face BF16 file), with this binary's operator new counting the largest
// allocation while StageLayer runs. A temporary of the parameter (or of a
// rank's part of it) would be 16 MiB or more; the reads go straight into
// the buffer, 16-bit dtypes through pieces of at most 1 MiB.
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpoint/checkpoint_reader.h"
#include "client/checkpoint/checkpoint_restore.h"
#include "client/checkpoint/checkpoint_save.h"
#include "gtest/gtest.h"

namespace {

std::atomic<bool> counting{false};
std::atomic<size_t> largest{0};

void* Allocate(size_t bytes) {
  if (counting.load(std::memory_order_relaxed)) {
    size_t seen = largest.load(std::memory_order_relaxed);
    while (bytes > seen && !largest.compare_exchange_weak(seen, bytes)) {
    }
  }
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) std::abort();
  return p;
}

}  // namespace

// Every plain allocation of this binary goes through Allocate.
void* operator new(size_t bytes) { return Allocate(bytes); }
void* operator new[](size_t bytes) { return Allocate(bytes); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace lohan::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kRows = 2048;
constexpr int64_t kCols = 4096;
constexpr uint64_t kElements = kRows * kCols;  // 32 MiB as fp32
// Beside the staging buffer: the 1 MiB piece a 16-bit read converts
// through, and small things (names, shapes, messages).
constexpr size_t kAllowedBytes = 2 << 20;

// Element i of the fp32 checkpoints: i, exact in fp32 below 2^24.
float Value(uint64_t i) { return static_cast<float>(i); }
// Element i of the BF16 one, as bits, and as fp32.
uint16_t Bf16(uint64_t i) { return static_cast<uint16_t>(0x3F80 + i % 127); }
float Bf16Value(uint64_t i) {
  const uint32_t bits = uint32_t{Bf16(i)} << 16;
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// One layer: parameter w [kRows, kCols].
v1::CheckpointContents OneParameter(uint32_t rank, uint32_t world) {
  v1::CheckpointContents contents;
  contents.set_job_name("memory");
  contents.add_parts("weights");
  contents.set_rank(rank);
  contents.set_world_size(world);
  v1::CheckpointLayer* layer = contents.add_layers();
  layer->set_elements(kElements);
  v1::CheckpointTensor* w = layer->add_tensors();
  w->set_name("w");
  w->add_shape(kRows);
  w->add_shape(kCols);
  return contents;
}

class StageLayerMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("lohan-stage-layer-memory-test-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // lohan's save of w by `world` ranks (each writing its shard).
  fs::path SaveLohan(uint32_t world) {
    const fs::path dir = root_ / absl::StrCat("lohan-", world);
    absl::StatusOr<std::unique_ptr<CheckpointSave>> first =
        CheckpointSave::Begin(dir.string());
    EXPECT_TRUE(first.ok()) << first.status();
    std::vector<std::unique_ptr<CheckpointSave>> ranks;
    ranks.push_back(*std::move(first));
    for (uint32_t r = 1; r < world; ++r) {
      ranks.push_back(CheckpointSave::Join(ranks[0]->staging().string(),
                                           ranks[0]->save_id()));
    }
    const uint64_t shard = kElements / world;
    std::vector<float> values(shard);
    std::vector<FileEntry> files;
    for (uint32_t rank = 0; rank < world; ++rank) {
      EXPECT_TRUE(ranks[rank]->Open(OneParameter(rank, world)).ok());
      for (uint64_t k = 0; k < shard; ++k) values[k] = Value(rank * shard + k);
      EXPECT_TRUE(ranks[rank]
                      ->writer()
                      ->Write(0, "weights", values.data(), shard)
                      .ok());
      absl::StatusOr<std::vector<FileEntry>> closed = ranks[rank]->CloseFiles();
      EXPECT_TRUE(closed.ok()) << closed.status();
      files.insert(files.end(), closed->begin(), closed->end());
    }
    EXPECT_TRUE(ranks[0]->Commit("{}", files).ok());
    return dir;
  }

  // A Hugging Face model.safetensors holding w as BF16.
  fs::path SaveHfBf16() {
    const fs::path dir = root_ / "hf";
    fs::create_directories(dir);
    const std::string header =
        absl::StrCat("{\"w\":{\"dtype\":\"BF16\",\"shape\":[", kRows, ",",
                     kCols, "],\"data_offsets\":[0,", 2 * kElements, "]}}");
    std::vector<uint16_t> data(kElements);
    for (uint64_t i = 0; i < kElements; ++i) data[i] = Bf16(i);
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    const uint64_t length = header.size();
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << header;
    out.write(reinterpret_cast<const char*>(data.data()), 2 * kElements);
    return dir;
  }

  // Stages w as `rank` of `world` from `dir`, checks every element against
  // `value`, and returns the largest allocation StageLayer made.
  size_t StageAndCheck(const fs::path& dir, uint32_t rank, uint32_t world,
                       float (*value)(uint64_t)) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::Open(dir.string(), /*verify=*/false);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return 0;
    const v1::CheckpointLayer layer = OneParameter(0, 1).layers(0);
    const uint64_t count = kElements / world;
    std::vector<float> out(count, -1.0f);
    largest = 0;
    counting = true;
    const absl::Status staged =
        StageLayer(**reader, layer, "weights", rank, world, out.data(), count);
    counting = false;
    EXPECT_TRUE(staged.ok()) << staged;
    for (uint64_t k = 0; k < count; ++k) {
      if (out[k] != value(rank * count + k)) {
        ADD_FAILURE() << dir << " element " << rank * count + k;
        break;
      }
    }
    return largest;
  }

  fs::path root_;
};

TEST_F(StageLayerMemoryTest, StagingReadsStraightIntoTheBufferFromEachFormat) {
  const fs::path one = SaveLohan(1);
  const fs::path shards = SaveLohan(2);
  const fs::path hf = SaveHfBf16();
  for (const fs::path& dir : {one, shards}) {
    EXPECT_LT(StageAndCheck(dir, 0, 1, Value), kAllowedBytes) << dir;
    EXPECT_LT(StageAndCheck(dir, 1, 2, Value), kAllowedBytes) << dir;
  }
  EXPECT_LT(StageAndCheck(hf, 0, 1, Bf16Value), kAllowedBytes);
  EXPECT_LT(StageAndCheck(hf, 1, 2, Bf16Value), kAllowedBytes);
}

}  // namespace
}  // namespace lohan::checkpoint
