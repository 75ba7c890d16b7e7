#ifndef LOHAN_DAEMON_SCHED_CLIP_TEST_UTIL_H_
#define LOHAN_DAEMON_SCHED_CLIP_TEST_UTIL_H_

// What the clip-schedule, settle and other pipeline tests share: one small
// layout of uneven layers and chunks, reproducible gradients with the
// exact sums of squares that place a clip limit at a chosen decision, and
// the updater-and-store fixture.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "daemon/optim/adam.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"
#include "layout/model_layout.h"

namespace lohan {
namespace clip_test {

// Layers {2500, 1000, 37, 4097} in chunks of 1000: 3 + 1 + 1 + 5 chunks.
// Backward hands them over last layer first, so decisions run over layer
// 3's five chunks, then 2, 1, and layer 0's three.
constexpr size_t kChunks = 10;

// The layout with gradients of `grad_dtype`, 16-bit copies in bf16.
ModelLayout Layout(DType grad_dtype);

// The store these tests open: two SSD directories in `dir`, 64 KiB
// stripes, 16 MiB each.
StoreOptions SmallStore(testing_util::TempDir& dir);

// One iteration's gradients: bytes in the layout's dtype, with the exact
// sums of squares (double) of each layer and of each chunk, in backward
// order, to place the clip limit.
struct Gradients {
  std::vector<std::vector<uint8_t>> bytes;
  // Cumulative sum of squares after each chunk, in decision order.
  std::vector<double> cumulative;
};

// `seed`'s gradients for `layout`, each value x stored as x (the sums are
// of x * grad_scale); `nan_layer` >= 0 puts a NaN into that layer.
Gradients MakeGradients(const ModelLayout& layout, uint32_t seed,
                        float grad_scale, int nan_layer);

// A limit whose square lies halfway between the cumulative sums before and
// after decision `chunk` (0-based): clipping becomes certain exactly there.
double LimitCrossingAt(const ModelLayout& layout, uint32_t seed, size_t chunk,
                       float grad_scale = 1.0f);

// The fixture the pipeline tests start from: this CPU's Adam updater and
// SmallStore in a fresh directory. A subclass that sets up more calls
// UpdaterAndStoreTest::SetUp() first and returns on a fatal failure.
template <class Param>
class UpdaterAndStoreTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    auto updater = AdamUpdater::Create(nullptr, std::nullopt);
    ASSERT_TRUE(updater.ok()) << updater.status();
    updater_.emplace(*updater);
    auto store = TensorStore::Open(SmallStore(dir_));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  testing_util::TempDir dir_;
  std::optional<AdamUpdater> updater_;
  std::unique_ptr<TensorStore> store_;
};

}  // namespace clip_test
}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_CLIP_TEST_UTIL_H_
