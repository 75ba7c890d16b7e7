// PipelineOptions::fp32_weights_out: an fp32 job's weight buffers receive
// the updated fp32 masters themselves, so that its client needs no read of
// the states for its weights. After every kind of iteration (unclipped,
// clipped under each clip schedule, skipped, settling in the background)
// each buffer holds exactly what ReadWeights reads.

#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "daemon/optim/adam.h"
#include "daemon/sched/clip_test_util.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using clip_test::Gradients;
using clip_test::Layout;
using clip_test::LimitCrossingAt;
using clip_test::MakeGradients;
using testing_util::TempDir;

struct Variant {
  ClipSchedule clip_schedule;
  bool settle;
};

class WeightCopyTest : public clip_test::UpdaterAndStoreTest<Variant> {
 protected:
  void SetUp() override {
    UpdaterAndStoreTest::SetUp();
    if (HasFatalFailure()) return;
    PipelineOptions options;
    options.buffers = 3;
    options.fp32_weights_out = true;
    options.clip_schedule = GetParam().clip_schedule;
    options.settle_in_background = GetParam().settle;
    auto p =
        JobPipeline::Open(store_.get(), *updater_, "job", layout_, options);
    ASSERT_TRUE(p.ok()) << p.status();
    pipeline_ = *std::move(p);
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.0f, 0.5f);
    out_.resize(layout_.layer_elements.size());
    for (size_t l = 0; l < out_.size(); ++l) {
      out_[l].resize(layout_.layer_elements[l]);
      for (float& x : out_[l]) x = dist(rng);
      // A client's buffer starts with the weights it gave.
      ASSERT_TRUE(pipeline_->InitializeWeights(l, out_[l].data()).ok());
    }
  }

  IterationReport Run(uint32_t seed, const ClipOptions& clip,
                      int nan_layer = -1) {
    Gradients g = MakeGradients(layout_, seed, 1.0f, nan_layer);
    // Waits for the last iteration to settle: only then may its gradients
    // go.
    EXPECT_TRUE(pipeline_->BeginIteration(1.0f, std::nullopt, clip).ok());
    grads_ = std::move(g);
    for (size_t j = 0; j < out_.size(); ++j) {
      const size_t l = out_.size() - 1 - j;
      EXPECT_TRUE(
          pipeline_->SubmitGradients(l, grads_.bytes[l].data(), out_[l].data())
              .ok());
    }
    absl::StatusOr<IterationReport> report = pipeline_->EndIteration();
    EXPECT_TRUE(report.ok()) << report.status();
    return report.ok() ? *report : IterationReport{};
  }

  // Each buffer, once its layer is done, holds the masters bit for bit.
  void ExpectBuffersHoldTheMasters() {
    for (size_t l = 0; l < out_.size(); ++l) {
      ASSERT_TRUE(pipeline_->WaitLayer(l).ok());
      std::vector<float> masters(out_[l].size());
      ASSERT_TRUE(pipeline_->ReadWeights(l, masters.data()).ok());
      size_t nans = 0;
      for (float x : masters) nans += x != x;
      EXPECT_EQ(nans, 0u) << "layer " << l;
      EXPECT_EQ(std::memcmp(masters.data(), out_[l].data(), masters.size() * 4),
                0)
          << "layer " << l;
    }
  }

  const ModelLayout layout_ = Layout(DType::kFloat32);
  std::unique_ptr<JobPipeline> pipeline_;
  std::vector<std::vector<float>> out_;
  // The last iteration's: an update settling in the background reads them.
  Gradients grads_;
};

TEST_P(WeightCopyTest, BuffersHoldTheMastersAfterEveryKindOfIteration) {
  std::vector<float> before = out_[0];
  Run(1, ClipOptions{});
  ExpectBuffersHoldTheMasters();
  EXPECT_NE(out_[0], before);  // updated, not left as given
  // Clipping certain half-way through backward, then from the start.
  for (size_t crossing : {size_t{5}, size_t{0}}) {
    ClipOptions clip;
    clip.max_grad_norm = LimitCrossingAt(layout_, 2, crossing);
    EXPECT_TRUE(Run(2, clip).clipped);
    ExpectBuffersHoldTheMasters();
  }
  // Unclipped again (so the next iteration does not start deferred), then
  // a NaN in layer 0, handed over last: the updates before it are rolled
  // back and their buffers get the committed weights back.
  Run(4, ClipOptions{});
  ExpectBuffersHoldTheMasters();
  const std::vector<std::vector<float>> committed = out_;
  EXPECT_TRUE(Run(5, ClipOptions{}, 0).skipped);
  EXPECT_EQ(pipeline_->iteration(), 4u);
  ExpectBuffersHoldTheMasters();
  for (size_t l = 0; l < out_.size(); ++l) {
    EXPECT_EQ(
        std::memcmp(out_[l].data(), committed[l].data(), out_[l].size() * 4), 0)
        << "layer " << l;
  }
  Run(6, ClipOptions{});
  ExpectBuffersHoldTheMasters();
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, WeightCopyTest,
    ::testing::Values(Variant{ClipSchedule::kRedoAll, false},
                      Variant{ClipSchedule::kDeferWhenCertain, false},
                      Variant{ClipSchedule::kDeferWhenCertain, true}));

TEST(WeightCopyOptionTest, NeedsAnFp32LayoutWithResidentWeights) {
  TempDir dir;
  StoreOptions o;
  o.ssd_paths = {dir.Subdir("ssd0")};
  o.state_dir = dir.path() + "/state";
  o.device_capacity_bytes = 16 << 20;
  auto store = TensorStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status();
  auto updater = AdamUpdater::Create(nullptr, std::nullopt);
  ASSERT_TRUE(updater.ok());
  PipelineOptions options;
  options.fp32_weights_out = true;
  auto bf16 = JobPipeline::Open(store->get(), *updater, "a",
                                Layout(DType::kBFloat16), options);
  EXPECT_EQ(bf16.status().code(), absl::StatusCode::kInvalidArgument);
  options.stream_weight16 = true;
  auto streamed = JobPipeline::Open(store->get(), *updater, "b",
                                    Layout(DType::kFloat32), options);
  EXPECT_EQ(streamed.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lohan
