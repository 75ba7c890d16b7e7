// PipelineOptions::hand_off_weights: a fetch of the new weights once the
// norm is known reads them from memory, bit for bit what the store holds;
// a fetch before it still reads the committed ones; the handoff's memory
// bounds what it keeps (the chunks fetched first); and no kept copy
// outlives its version (a rollback, the next iteration).

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
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

// What the client fetches: the fp32 masters (an fp32 model's streamed
// weights) or the streamed 16-bit copy.
enum class Fetched { kMasters, kCopy16 };

class WeightHandoffPipelineTest
    : public clip_test::UpdaterAndStoreTest<Fetched> {
 protected:
  bool copy16() const { return GetParam() == Fetched::kCopy16; }

  // Streamed gradients and weights, 3 chunk buffers: a handoff of 6
  // chunks. `job` without the handoff is the reference.
  std::unique_ptr<JobPipeline> Open(const std::string& job, bool hand_off,
                                    bool settle) {
    PipelineOptions options;
    options.buffers = 3;
    options.settle_in_background = settle;
    options.stream_gradients = true;
    options.stream_weight16 = copy16();
    options.hand_off_weights = hand_off;
    auto p = JobPipeline::Open(store_.get(), *updater_, job, layout_, options);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
      std::vector<float> w(layout_.layer_elements[l], 0.25f + 0.01f * l);
      EXPECT_TRUE((*p)->InitializeWeights(l, w.data()).ok());
    }
    return *std::move(p);
  }

  // Hands over every layer, last first; the streamed gradient is stored
  // before SubmitGradients returns.
  void Backward(JobPipeline& p, const Gradients& g, const ClipOptions& clip) {
    ASSERT_TRUE(p.BeginIteration(1.0f, std::nullopt, clip).ok());
    for (size_t j = 0; j < g.bytes.size(); ++j) {
      const size_t l = g.bytes.size() - 1 - j;
      ASSERT_TRUE(p.SubmitGradients(l, g.bytes[l].data(), nullptr).ok());
    }
  }

  // Until every chunk of `layer` has a new (pending) version in the store:
  // its update written.
  void AwaitWritten(const JobPipeline& p, const std::string& job,
                    size_t layer) {
    const StateLayout& state = p.state_layout();
    for (size_t c = 0; c < state.num_chunks(layer); ++c) {
      const std::string name = StateLayout::ChunkName(layer, c);
      for (int i = 0; i < 3000; ++i) {
        absl::StatusOr<TensorInfo> info = store_->Stat(job, name);
        ASSERT_TRUE(info.ok()) << info.status();
        if (info->pending_version != 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ASSERT_NE(store_->Stat(job, name)->pending_version, 0u) << name;
    }
  }

  // Layer `l`'s weights as the client fetches them, and how many of their
  // bytes came from memory.
  std::vector<uint8_t> Fetch(JobPipeline& p, size_t l, uint64_t* from_memory) {
    const size_t n = layout_.layer_elements[l];
    std::vector<uint8_t> out(n * (copy16() ? 2 : 4));
    const absl::Status s =
        copy16() ? p.ReadWeight16(l, out.data(), from_memory)
                 : p.ReadWeights(l, reinterpret_cast<float*>(out.data()),
                                 from_memory);
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  void ExpectSameFetches(JobPipeline& ref, JobPipeline& job) {
    for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
      uint64_t ignored = 0;
      EXPECT_EQ(Fetch(ref, l, &ignored), Fetch(job, l, &ignored))
          << "layer " << l;
    }
  }

  // The bytes a fetch of flat chunk `flat` takes.
  uint64_t ChunkFetchBytes(const JobPipeline& p, size_t flat) const {
    const StateLayout& state = p.state_layout();
    for (size_t l = 0; l < state.num_layers(); ++l) {
      if (flat < state.num_chunks(l)) {
        return state.chunk_count(l, flat) * (copy16() ? 2 : 4);
      }
      flat -= state.num_chunks(l);
    }
    ADD_FAILURE() << "no such chunk";
    return 0;
  }

  // Layers {2500, 1000, 37, 4097}: chunks 3 + 1 + 1 + 5.
  const ModelLayout layout_ = Layout(DType::kBFloat16);
};

TEST_P(WeightHandoffPipelineTest, AFetchAfterTheUpdateReadsItFromMemory) {
  auto ref = Open("ref", /*hand_off=*/false, /*settle=*/false);
  auto job = Open("job", /*hand_off=*/true, /*settle=*/true);
  ASSERT_TRUE(ref && job);
  // Clipped from the first chunk: every update runs after the norm, in
  // forward order, while the caller goes on.
  const ClipOptions clip{.max_grad_norm = 1e-3};
  const Gradients g = MakeGradients(layout_, 31, 1.0f, -1);
  Backward(*ref, g, clip);
  ASSERT_TRUE(ref->EndIteration().ok());
  Backward(*job, g, clip);
  absl::StatusOr<IterationReport> r = job->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->deferred_chunks, clip_test::kChunks);
  ASSERT_TRUE(job->AwaitCommitted().ok());
  // Six slots (twice the 3 chunk buffers), taken by the first six chunks
  // written; the rest come from the store.
  EXPECT_EQ(job->handoff_bytes(), 6 * 4096u);  // one chunk, page-aligned
  EXPECT_EQ(job->chunks_handed_off(), 6u);
  const std::vector<uint64_t> want_from_memory = {
      ChunkFetchBytes(*job, 0) + ChunkFetchBytes(*job, 1) +
          ChunkFetchBytes(*job, 2),
      ChunkFetchBytes(*job, 3), ChunkFetchBytes(*job, 4),
      ChunkFetchBytes(*job, 5)};
  for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
    uint64_t from_memory = 0, from_ref = 0;
    const std::vector<uint8_t> handed = Fetch(*job, l, &from_memory);
    EXPECT_EQ(handed, Fetch(*ref, l, &from_ref)) << "layer " << l;
    EXPECT_EQ(from_memory, want_from_memory[l]) << "layer " << l;
    EXPECT_EQ(from_ref, 0u);
    // Taken once: the next fetch reads the store, the same bytes.
    EXPECT_EQ(Fetch(*job, l, &from_memory), handed) << "layer " << l;
    EXPECT_EQ(from_memory, 0u);
  }
  EXPECT_EQ(job->chunks_handed_off(), 0u);
}

TEST_P(WeightHandoffPipelineTest, AFetchBeforeTheNormReadsTheCommittedOnes) {
  auto ref = Open("ref", /*hand_off=*/false, /*settle=*/false);
  auto job = Open("job", /*hand_off=*/true, /*settle=*/true);
  ASSERT_TRUE(ref && job);
  std::vector<std::vector<uint8_t>> before;
  for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
    uint64_t ignored = 0;
    before.push_back(Fetch(*job, l, &ignored));
  }
  // No clipping: every chunk updates in backward, and the six fetched
  // first (layers 0 to 2 and layer 3's first chunk) are kept.
  const Gradients g = MakeGradients(layout_, 33, 1.0f, -1);
  for (JobPipeline* p : {ref.get(), job.get()}) {
    Backward(*p, g, {.max_grad_norm = 0.0});
  }
  for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
    AwaitWritten(*job, "job", l);
    if (HasFatalFailure()) return;
  }
  // The pipeline finishes a chunk once written and kept.
  ASSERT_EQ(job->chunks_handed_off(), 6u);
  // Before EndIteration a fetch reads the committed weights.
  for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
    uint64_t from_memory = 0;
    EXPECT_EQ(Fetch(*job, l, &from_memory), before[l]) << "layer " << l;
    EXPECT_EQ(from_memory, 0u);
  }
  for (JobPipeline* p : {ref.get(), job.get()}) {
    absl::StatusOr<IterationReport> r = p->EndIteration();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->deferred_chunks, 0u);
    ASSERT_TRUE(p->AwaitCommitted().ok());
  }
  // After it, the kept ones.
  uint64_t from_memory = 0;
  for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
    uint64_t from_layer = 0, ignored = 0;
    EXPECT_EQ(Fetch(*job, l, &from_layer), Fetch(*ref, l, &ignored))
        << "layer " << l;
    from_memory += from_layer;
  }
  uint64_t want = 0;
  for (size_t flat = 0; flat < 6; ++flat) want += ChunkFetchBytes(*job, flat);
  EXPECT_EQ(from_memory, want);
}

TEST_P(WeightHandoffPipelineTest, KeptWeightsEndWithTheirIteration) {
  auto job = Open("job", /*hand_off=*/true, /*settle=*/true);
  ASSERT_TRUE(job);
  const Gradients g = MakeGradients(layout_, 32, 1.0f, -1);
  Backward(*job, g, {.max_grad_norm = 1e-3});
  ASSERT_TRUE(job->EndIteration().ok());
  ASSERT_TRUE(job->AwaitCommitted().ok());
  ASSERT_EQ(job->chunks_handed_off(), 6u);
  // Never fetched: the next iteration frees their slots.
  ASSERT_TRUE(job->BeginIteration(1.0f, std::nullopt, {}).ok());
  EXPECT_EQ(job->chunks_handed_off(), 0u);
  ASSERT_TRUE(job->AbortIteration().ok());
}

TEST_P(WeightHandoffPipelineTest, ARolledBackUpdateIsNotFetched) {
  auto job = Open("job", /*hand_off=*/true, /*settle=*/false);
  ASSERT_TRUE(job);
  std::vector<std::vector<uint8_t>> before;
  for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
    uint64_t ignored = 0;
    before.push_back(Fetch(*job, l, &ignored));
  }
  // A NaN in layer 0, handed over last: layers 3, 2 and 1 update eagerly
  // (written and kept before layer 0 arrives), then the skip rolls them
  // back.
  const Gradients g = MakeGradients(layout_, 34, 1.0f, /*nan_layer=*/0);
  ASSERT_TRUE(
      job->BeginIteration(1.0f, std::nullopt,
                          {.max_grad_norm = 0.0, .skip_nonfinite = true})
          .ok());
  for (size_t l : {3, 2, 1}) {
    ASSERT_TRUE(job->SubmitGradients(l, g.bytes[l].data(), nullptr).ok());
  }
  for (size_t l : {3, 2, 1}) {
    AwaitWritten(*job, "job", l);
    if (HasFatalFailure()) return;
  }
  // Flat chunks 3 to 9 written; of them only 3 to 5 kept: in backward
  // chunks 0 to 2 are still to come, and the six slots keep chunks 0 to 5.
  ASSERT_EQ(job->chunks_handed_off(), 3u);
  ASSERT_TRUE(job->SubmitGradients(0, g.bytes[0].data(), nullptr).ok());
  absl::StatusOr<IterationReport> r = job->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->skipped);
  ASSERT_GT(r->eager_chunks, r->dropped_chunks);
  EXPECT_EQ(job->chunks_handed_off(), 0u);
  for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
    uint64_t from_memory = 0;
    EXPECT_EQ(Fetch(*job, l, &from_memory), before[l]) << "layer " << l;
    EXPECT_EQ(from_memory, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Fetches, WeightHandoffPipelineTest,
                         ::testing::Values(Fetched::kMasters, Fetched::kCopy16),
                         [](const auto& info) {
                           return info.param == Fetched::kMasters
                                      ? std::string("Masters")
                                      : std::string("Copy16");
                         });

}  // namespace
}  // namespace lohan
