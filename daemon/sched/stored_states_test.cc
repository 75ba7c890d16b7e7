// JobPipeline::Open judges whether a job's stored states belong together
// before it resumes on them: each way a store can lose records, made
// directly with the store's calls, is refused with DATA_LOSS naming the
// job and what is wrong, and changes nothing; what a crash or a checkpoint
// restore legitimately leaves opens.

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
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using clip_test::Layout;
using clip_test::MakeGradients;
using testing::HasSubstr;

class StoredStatesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto updater = AdamUpdater::Create(nullptr, std::nullopt);
    ASSERT_TRUE(updater.ok()) << updater.status();
    updater_.emplace(*updater);
    auto store = TensorStore::Open(clip_test::SmallStore(dir_));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    layout_ = Layout(DType::kBFloat16);
  }

  absl::StatusOr<std::unique_ptr<JobPipeline>> Open(
      bool streamed = false, bool expect_states = false,
      uint64_t initial_iteration = 0) {
    PipelineOptions options;
    options.buffers = 3;
    options.stream_weight16 = streamed;
    options.expect_stored_states = expect_states;
    options.initial_iteration = initial_iteration;
    return JobPipeline::Open(store_.get(), *updater_, "job", layout_, options);
  }

  // A new job, every layer initialized (but `skip_layer`), then trained
  // for `iterations`.
  void Train(int iterations, bool streamed = false, int skip_layer = -1,
             uint64_t initial_iteration = 0) {
    auto pipeline = Open(streamed, false, initial_iteration);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.0f, 0.5f);
    std::vector<std::vector<uint16_t>> copies(layout_.layer_elements.size());
    for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
      copies[l].resize(layout_.layer_elements[l]);
      if (static_cast<int>(l) == skip_layer) continue;
      std::vector<float> weights(layout_.layer_elements[l]);
      for (float& x : weights) x = dist(rng);
      ASSERT_TRUE((*pipeline)->InitializeWeights(l, weights.data()).ok());
    }
    for (int i = 0; i < iterations; ++i) {
      const auto grads = MakeGradients(layout_, 7 + i, 1.0f, -1);
      ASSERT_TRUE((*pipeline)->BeginIteration().ok());
      for (size_t l = layout_.layer_elements.size(); l-- > 0;) {
        ASSERT_TRUE((*pipeline)
                        ->SubmitGradients(l, grads.bytes[l].data(),
                                          streamed ? nullptr : copies[l].data())
                        .ok());
      }
      ASSERT_TRUE((*pipeline)->EndIteration().ok());
    }
  }

  // Writes `name` again with its committed bytes and commits it with
  // `tag`, as a record of another step would have left it.
  void Recommit(const std::string& name, uint64_t tag) {
    auto info = store_->Stat("job", name);
    ASSERT_TRUE(info.ok()) << info.status();
    std::vector<uint8_t> bytes(info->bytes);
    ASSERT_TRUE(store_->Read("job", name, absl::MakeSpan(bytes)).ok());
    ASSERT_TRUE(store_->Write("job", name, bytes).ok());
    ASSERT_TRUE(store_->Commit("job", name, tag).ok());
  }

  // Open is refused with DATA_LOSS naming the job and `what`, and the
  // store's tensors are as they were.
  void ExpectRefused(const std::string& what, bool expect_states = false) {
    std::vector<std::pair<std::string, TensorInfo>> before;
    for (const std::string& name : store_->List("job")) {
      before.emplace_back(name, *store_->Stat("job", name));
    }
    auto pipeline = Open(false, expect_states);
    ASSERT_FALSE(pipeline.ok());
    EXPECT_EQ(pipeline.status().code(), absl::StatusCode::kDataLoss)
        << pipeline.status();
    EXPECT_THAT(std::string(pipeline.status().message()),
                HasSubstr("job 'job'"));
    EXPECT_THAT(std::string(pipeline.status().message()), HasSubstr(what));
    EXPECT_THAT(std::string(pipeline.status().message()),
                HasSubstr("Restore the job from a checkpoint"));
    std::vector<std::pair<std::string, TensorInfo>> after;
    for (const std::string& name : store_->List("job")) {
      after.emplace_back(name, *store_->Stat("job", name));
    }
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_EQ(after[i].first, before[i].first);
      EXPECT_EQ(after[i].second.committed_version,
                before[i].second.committed_version)
          << after[i].first;
    }
  }

  testing_util::TempDir dir_;
  std::optional<AdamUpdater> updater_;
  std::unique_ptr<TensorStore> store_;
  ModelLayout layout_;
};

TEST_F(StoredStatesTest, ATrainedJobResumesAtItsStep) {
  Train(3);
  auto pipeline = Open(false, /*expect_states=*/true);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  EXPECT_EQ((*pipeline)->iteration(), 3u);
  // Every tensor it keeps carries the step it belongs to.
  for (const std::string& name : store_->List("job")) {
    EXPECT_EQ(store_->Stat("job", name)->committed_tag, 4u) << name;
  }
}

TEST_F(StoredStatesTest, StatesWithoutTheirMetaAreRefusedNotANewJob) {
  Train(2);
  ASSERT_TRUE(store_->Delete("job", "meta").ok());
  ExpectRefused("hold committed optimizer states, but the job's meta");
  // A meta created but never committed (its commit record lost) too.
  ASSERT_TRUE(store_->Create("job", "meta", 64).ok());
  ExpectRefused("the job's meta, the step they belong to, is missing");
}

TEST_F(StoredStatesTest, AChunkOfAnotherStepIsRefused) {
  Train(3);
  Recommit("layer.000002.chunk.000000", /*tag of iteration*/ 2 + 1);
  ExpectRefused(
      "layer 2 chunk 0 holds the states of iteration 2, but the job's meta "
      "says iteration 3");
}

TEST_F(StoredStatesTest, AMetaCommittedAsAnotherStepIsRefused) {
  Train(2);
  Recommit("meta", 5 + 1);
  ExpectRefused("its meta reads iteration 2 but was committed as iteration 5");
}

TEST_F(StoredStatesTest, ALayerWithoutStatesInATrainedJobIsRefused) {
  Train(2);
  // The layer's states gone (their records lost), the tensors still named.
  for (const std::string& name : store_->List("job")) {
    if (name.rfind("layer.000001.", 0) != 0) continue;
    const uint64_t bytes = store_->Stat("job", name)->bytes;
    ASSERT_TRUE(store_->Delete("job", name).ok());
    ASSERT_TRUE(store_->Create("job", name, bytes).ok());
  }
  ExpectRefused(
      "layer 1 has no committed states, but the job has trained from "
      "iteration 0 to 2");
}

TEST_F(StoredStatesTest, AJobTheCallerKnowsHadStatesIsRefusedWithoutAny) {
  Train(1);
  ASSERT_TRUE(store_->DeleteJob("job").ok());
  ExpectRefused("the store holds none of its states", /*expect_states=*/true);
  // Without that knowledge it is a new job.
  auto pipeline = Open();
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  EXPECT_EQ((*pipeline)->iteration(), 0u);
}

// What a crash leaves (a layer not yet initialized at the first
// iteration, also of a checkpoint restored into a new job at step 7), and
// stored states written before tags or first iterations were recorded,
// open as before.
TEST_F(StoredStatesTest, WhatACrashOrARestoreLeavesOpens) {
  Train(0, false, /*skip_layer=*/2, /*initial_iteration=*/7);
  auto pipeline = Open(false, /*expect_states=*/true);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  EXPECT_EQ((*pipeline)->iteration(), 7u);
  EXPECT_FALSE((*pipeline)->layer_initialized(2));
  EXPECT_TRUE((*pipeline)->layer_initialized(1));
  pipeline->reset();
  // Untagged versions (a store written before tags) are not judged.
  for (const std::string& name : store_->List("job")) {
    if (store_->Stat("job", name)->committed_version == 0) continue;
    Recommit(name, 0);
  }
  EXPECT_TRUE(Open().ok());
}

// A streamed job's 16-bit copies are derived from the masters: one of
// another step is rebuilt, never refused.
TEST_F(StoredStatesTest, AStreamedCopyOfAnotherStepIsRebuilt) {
  Train(2, /*streamed=*/true);
  const std::string copy = "weight16.layer.000000.chunk.000001";
  std::vector<uint8_t> current(store_->Stat("job", copy)->bytes);
  ASSERT_TRUE(store_->Read("job", copy, absl::MakeSpan(current)).ok());
  std::vector<uint8_t> stale(current.size(), 0x5a);
  ASSERT_TRUE(store_->Write("job", copy, stale).ok());
  ASSERT_TRUE(store_->Commit("job", copy, /*tag of iteration 1*/ 2).ok());
  auto pipeline = Open(/*streamed=*/true);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  std::vector<uint8_t> rebuilt(current.size());
  ASSERT_TRUE(store_->Read("job", copy, absl::MakeSpan(rebuilt)).ok());
  EXPECT_EQ(rebuilt, current);
  EXPECT_EQ(store_->Stat("job", copy)->committed_tag, 3u);
}

}  // namespace
}  // namespace lohan
