// job_space.h against the pipeline itself: what KeptTensorSpace,
// GradScratchFootprint and ChunkBufferFor compute from a layout alone is
// what a JobPipeline creates in a real store and allocates, resident and
// streamed, for uneven layers whose last chunks are short (and one smaller
// than a block).

#include "layout/job_space.h"

#include <memory>
#include <optional>
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

using testing_util::TempDir;

// What the store holds for `job`: the tensors whose names start with
// `prefix` (empty: all), their sizes and SSD space.
KeptSpace Held(const TensorStore& store, const std::string& job,
               const std::string& prefix) {
  KeptSpace held;
  for (const std::string& name : store.List(job)) {
    if (name.rfind(prefix, 0) != 0) continue;
    absl::StatusOr<TensorInfo> info = store.Stat(job, name);
    EXPECT_TRUE(info.ok()) << info.status();
    if (!info.ok()) continue;
    const uint64_t footprint = store.FootprintBytes(info->bytes);
    held.tensor_bytes += info->bytes;
    held.footprint += footprint;
    held.largest_footprint = std::max(held.largest_footprint, footprint);
  }
  return held;
}

struct Streaming {
  bool gradients;
  bool weight16;
};

class JobSpaceTest : public clip_test::UpdaterAndStoreTest<Streaming> {};

TEST_P(JobSpaceTest, WhatTheLayoutSaysIsWhatThePipelineTakes) {
  const Streaming streaming = GetParam();
  const ModelLayout layout = clip_test::Layout(DType::kBFloat16);
  const StateLayout state(layout);
  const uint64_t block = clip_test::SmallStore(dir_).block_size;
  PipelineOptions options;
  options.stream_gradients = streaming.gradients;
  options.stream_weight16 = streaming.weight16;
  auto pipeline =
      JobPipeline::Open(store_.get(), *updater_, "job", layout, options);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  JobPipeline& p = **pipeline;

  const KeptSpace kept = KeptTensorSpace(state, streaming.weight16, block);
  auto expect_kept = [&](const char* when) {
    const KeptSpace held = Held(*store_, "job", "");
    EXPECT_EQ(held.tensor_bytes, kept.tensor_bytes) << when;
    EXPECT_EQ(held.footprint, kept.footprint) << when;
    EXPECT_EQ(held.largest_footprint, kept.largest_footprint) << when;
  };
  expect_kept("after Open");
  // Block rounding counts: the 37-element layer's state is 444 bytes.
  EXPECT_GT(kept.footprint, kept.tensor_bytes);

  const ChunkBufferLayout buffer = ChunkBufferFor(
      state, layout.grad_dtype, streaming.gradients, streaming.weight16);
  EXPECT_EQ(p.chunk_buffer_bytes(), buffer.bytes);
  EXPECT_EQ(p.chunk_pool_bytes(), kDefaultChunkBuffers * buffer.bytes);
  EXPECT_EQ(buffer.bytes % kChunkBufferAlignment, 0u);

  std::vector<std::vector<float>> weights(layout.layer_elements.size());
  std::vector<std::vector<uint16_t>> out(layout.layer_elements.size());
  for (size_t l = 0; l < weights.size(); ++l) {
    weights[l].assign(layout.layer_elements[l], 0.5f);
    out[l].resize(layout.layer_elements[l]);
    ASSERT_TRUE(p.InitializeWeights(l, weights[l].data()).ok());
  }
  const clip_test::Gradients g =
      clip_test::MakeGradients(layout, 1, 1.0f, /*nan_layer=*/-1);
  ASSERT_TRUE(p.BeginIteration().ok());
  for (size_t j = 0; j < weights.size(); ++j) {
    const size_t l = weights.size() - 1 - j;
    ASSERT_TRUE(p.SubmitGradients(l, g.bytes[l].data(),
                                  streaming.weight16 ? nullptr : out[l].data())
                    .ok());
  }
  // Streamed gradients are in the store once SubmitGradients returns, until
  // the iteration ends.
  const KeptSpace scratch = Held(*store_, "job", StateLayout::kScratchPrefix);
  EXPECT_EQ(scratch.footprint,
            streaming.gradients
                ? GradScratchFootprint(state, layout.grad_dtype, block)
                : 0);
  absl::StatusOr<IterationReport> report = p.EndIteration();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(p.iteration(), 1u);
  expect_kept("after an iteration");
}

INSTANTIATE_TEST_SUITE_P(Layouts, JobSpaceTest,
                         ::testing::Values(Streaming{false, false},
                                           Streaming{true, true},
                                           Streaming{true, false}));

TEST(UpdateSpaceBytes, TwoVersionsOfEverythingAndAThirdPerBufferAndOneMore) {
  EXPECT_EQ(UpdateSpaceBytes(100, 10, 4), 2 * 100 + 5 * 10);
  EXPECT_EQ(UpdateSpaceBytes(4096, 4096, 0), 3 * 4096u);
}

}  // namespace
}  // namespace lohan
