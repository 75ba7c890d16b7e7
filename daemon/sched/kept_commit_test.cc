// A data-parallel rank's pipeline (PipelineOptions::keep_previous_commit):
// each iteration's commit keeps the states it replaced until the next
// BeginIteration, and a reopen with revert_last_commit goes back to them
// (weights, moments, step, 16-bit copies), so that the same gradients
// then give the same bits as the first time.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "daemon/optim/adam.h"
#include "daemon/sched/clip_test_util.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/store/tensor_store.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using clip_test::Gradients;
using clip_test::Layout;
using clip_test::MakeGradients;

struct Variant {
  bool settle_in_background;
  bool stream_weight16;
};

// Every layer's fp32 weights, then its two moments, then (streamed) its
// stored 16-bit copy: what a revert must bring back.
using States = std::vector<std::vector<float>>;

class KeptCommitTest : public clip_test::UpdaterAndStoreTest<Variant> {
 protected:
  void SetUp() override {
    UpdaterAndStoreTest::SetUp();
    if (HasFatalFailure()) return;
    layout_ = Layout(DType::kBFloat16);
    ASSERT_TRUE(Open(/*revert=*/false).ok());
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 0.5f);
    weight16_.resize(layout_.layer_elements.size());
    for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
      std::vector<float> weights(layout_.layer_elements[l]);
      for (float& x : weights) x = dist(rng);
      weight16_[l].assign(weights.size() * 2, 0);
      ASSERT_TRUE(pipeline_->InitializeWeights(l, weights.data(), Out(l)).ok());
    }
  }

  absl::Status Open(bool revert, bool keep = true) {
    pipeline_.reset();
    PipelineOptions options;
    options.buffers = 3;
    options.settle_in_background = GetParam().settle_in_background;
    options.stream_weight16 = GetParam().stream_weight16;
    options.keep_previous_commit = keep;
    options.revert_last_commit = revert;
    auto pipeline =
        JobPipeline::Open(store_.get(), *updater_, "job", layout_, options);
    if (!pipeline.ok()) return pipeline.status();
    pipeline_ = *std::move(pipeline);
    return absl::OkStatus();
  }

  void* Out(size_t layer) {
    return GetParam().stream_weight16 ? nullptr : weight16_[layer].data();
  }

  // One iteration with `seed`'s gradients, committed.
  void Step(uint32_t seed) {
    // Read until the commit (the settle runs after EndIteration returns).
    grads_ = MakeGradients(layout_, seed, 1.0f, -1);
    ASSERT_TRUE(pipeline_->BeginIteration().ok());
    for (size_t l = layout_.layer_elements.size(); l-- > 0;) {
      ASSERT_TRUE(
          pipeline_->SubmitGradients(l, grads_.bytes[l].data(), Out(l)).ok());
    }
    auto report = pipeline_->EndIteration();
    ASSERT_TRUE(report.ok()) << report.status();
    ASSERT_FALSE(report->skipped);
    auto committed = pipeline_->AwaitCommitted();
    ASSERT_TRUE(committed.ok()) << committed.status();
    ASSERT_EQ(*committed, report->iteration);
  }

  States Read() const {
    States states;
    for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
      const size_t n = layout_.layer_elements[l];
      std::vector<float> weights(n), avg(n), avg_sq(n);
      EXPECT_TRUE(pipeline_->ReadWeights(l, weights.data()).ok());
      EXPECT_TRUE(pipeline_->ReadState(l, StatePart::kExpAvg, avg.data()).ok());
      EXPECT_TRUE(
          pipeline_->ReadState(l, StatePart::kExpAvgSq, avg_sq.data()).ok());
      states.push_back(std::move(weights));
      states.push_back(std::move(avg));
      states.push_back(std::move(avg_sq));
      if (GetParam().stream_weight16) {
        std::vector<float> copy(n / 2 + 1);  // n bf16 values, as bytes
        EXPECT_TRUE(pipeline_->ReadWeight16(l, copy.data()).ok());
        states.push_back(std::move(copy));
      }
    }
    return states;
  }

  // Tensors of the job that keep a previous version.
  size_t Kept() const {
    size_t kept = 0;
    for (const std::string& name : store_->List("job")) {
      kept += store_->Stat("job", name)->previous_version != 0 ? 1 : 0;
    }
    return kept;
  }

  ModelLayout layout_;
  Gradients grads_;
  std::unique_ptr<JobPipeline> pipeline_;
  std::vector<std::vector<uint8_t>> weight16_;
};

TEST_P(KeptCommitTest, RevertGoesBackOneIterationAndTheSameStepGivesTheSame) {
  Step(1);
  auto committed = pipeline_->AwaitCommitted();
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*committed, 1u);
  const States after_one = Read();
  Step(2);
  ASSERT_EQ(*pipeline_->AwaitCommitted(), 2u);
  const States after_two = Read();
  ASSERT_NE(after_one, after_two);
  EXPECT_TRUE(pipeline_->KeepsPreviousCommit());
  // Every tensor of the commit keeps its version of iteration 1.
  EXPECT_EQ(Kept(), store_->List("job").size());

  ASSERT_TRUE(Open(/*revert=*/true).ok());
  EXPECT_EQ(pipeline_->iteration(), 1u);
  EXPECT_FALSE(pipeline_->KeepsPreviousCommit());
  EXPECT_EQ(Kept(), 0u);
  EXPECT_EQ(Read(), after_one);
  // Only one step back.
  const absl::Status again = Open(/*revert=*/true);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_NE(again.message().find("keeps no commit before its last"),
            std::string::npos)
      << again;
  ASSERT_TRUE(Open(/*revert=*/false).ok());
  EXPECT_EQ(pipeline_->iteration(), 1u);

  // The redone step is the same bits: nothing of iteration 2 was left.
  Step(2);
  ASSERT_EQ(*pipeline_->AwaitCommitted(), 2u);
  EXPECT_EQ(Read(), after_two);
}

TEST_P(KeptCommitTest, BeginIterationFreesTheKeptStatesAndPlainJobsKeepNone) {
  Step(1);
  ASSERT_TRUE(pipeline_->AwaitCommitted().ok());
  ASSERT_GT(Kept(), 0u);
  const uint64_t bytes_kept = store_->BytesByJob()["job"];
  ASSERT_TRUE(pipeline_->BeginIteration().ok());
  EXPECT_EQ(Kept(), 0u);
  EXPECT_LT(store_->BytesByJob()["job"], bytes_kept);
  ASSERT_TRUE(pipeline_->AbortIteration().ok());
  EXPECT_FALSE(pipeline_->KeepsPreviousCommit());
  // Or at once, between iterations (a run closing).
  Step(2);
  ASSERT_TRUE(pipeline_->KeepsPreviousCommit());
  ASSERT_TRUE(pipeline_->BeginIteration().ok());
  EXPECT_EQ(pipeline_->ReleasePreviousCommit().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(pipeline_->AbortIteration().ok());
  Step(3);
  ASSERT_GT(Kept(), 0u);
  ASSERT_TRUE(pipeline_->ReleasePreviousCommit().ok());
  EXPECT_EQ(Kept(), 0u);
  EXPECT_EQ(pipeline_->iteration(), 3u);
  EXPECT_TRUE(pipeline_->ReleasePreviousCommit().ok()) << "nothing kept: OK";

  // A job that is no rank's keeps nothing.
  ASSERT_TRUE(Open(/*revert=*/false, /*keep=*/false).ok());
  Step(4);
  ASSERT_EQ(*pipeline_->AwaitCommitted(), 4u);
  EXPECT_EQ(Kept(), 0u);
  EXPECT_EQ(Open(/*revert=*/true, /*keep=*/false).code(),
            absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, KeptCommitTest,
    ::testing::Values(Variant{false, false}, Variant{true, false},
                      Variant{true, true}),
    [](const ::testing::TestParamInfo<Variant>& info) {
      return std::string(info.param.settle_in_background ? "Settling"
                                                         : "Waiting") +
             (info.param.stream_weight16 ? "Streamed16" : "Resident16");
    });

}  // namespace
}  // namespace lohan
