#ifndef LOHAN_DAEMON_STORE_COMMIT_TEST_FIXTURE_H_
#define LOHAN_DAEMON_STORE_COMMIT_TEST_FIXTURE_H_

// What the tests of TensorStore's kinds of commit (kept, volatile) share: a
// small store in a fresh directory and one job "j" of three tensors of
// uneven sizes (two chunks and a meta), each step's data a known pattern.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace testing_util {

class CommitTest : public ::testing::Test {
 public:
  static constexpr uint64_t kStripe = 64 << 10;

  static const std::vector<std::string>& Names() {
    static const auto* names =
        new std::vector<std::string>{"chunk0", "chunk1", "meta"};
    return *names;
  }

 protected:
  CommitTest() {
    options_.ssd_paths = {dir_.Subdir("ssd0"), dir_.Subdir("ssd1")};
    options_.state_dir = dir_.path() + "/state";
    options_.stripe_unit = kStripe;
    options_.queue_depth = 8;
    options_.device_capacity_bytes = 16 << 20;
  }

  static uint64_t SizeOf(size_t i) { return 3 * kStripe + 1000 * i + 7; }
  static uint64_t Padded(uint64_t bytes) {
    return (bytes + 4095) / 4096 * 4096;
  }

  std::unique_ptr<TensorStore> Open() {
    auto store = TensorStore::Open(options_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  static void Create(TensorStore& store) {
    for (size_t i = 0; i < Names().size(); ++i) {
      ASSERT_TRUE(store.Create("j", Names()[i], SizeOf(i)).ok());
    }
  }
  // Every tensor of job "j" written with the data of `step`.
  static void WriteStep(TensorStore& store, uint64_t step) {
    for (size_t i = 0; i < Names().size(); ++i) {
      ASSERT_TRUE(
          store.Write("j", Names()[i], Pattern(100 * step + i, SizeOf(i)))
              .ok());
    }
  }
  // Every tensor of job "j" reads the data of `step`.
  static void ExpectStep(TensorStore& store, uint64_t step) {
    for (size_t i = 0; i < Names().size(); ++i) {
      std::vector<uint8_t> back(SizeOf(i));
      auto read = store.Read("j", Names()[i], absl::MakeSpan(back));
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_EQ(back, Pattern(100 * step + i, SizeOf(i)))
          << Names()[i] << " is not at step " << step;
    }
  }
  static uint64_t Used(const TensorStore& store) {
    uint64_t used = 0;
    for (const auto& device : store.Stats().devices) used += device.used_bytes;
    return used;
  }
  // The SSD space of `versions` versions of every tensor.
  static uint64_t Versions(uint64_t versions) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < Names().size(); ++i) bytes += Padded(SizeOf(i));
    return versions * bytes;
  }

  TempDir dir_;
  StoreOptions options_;
};

}  // namespace testing_util
}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_COMMIT_TEST_FIXTURE_H_
