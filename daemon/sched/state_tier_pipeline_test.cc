// A job whose states the tier holds (all, part, or a part that changes as
// another job arrives and leaves) against one without a tier: the same
// gradients give the same bits every iteration (fp32 weights, moments and
// 16-bit copies), while the tier's chunks are read from memory, not from
// the store. clip_schedule_test runs the tier through every clip path.

#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "daemon/optim/half.h"
#include "daemon/sched/clip_test_util.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/sched/memory_shares.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using clip_test::Gradients;
using clip_test::kChunks;
using clip_test::MakeGradients;

constexpr size_t kLayers = 4;

// read_bytes of /proc/self/io: bytes this process read from storage (the
// store's files are O_DIRECT: no page cache hides a read).
uint64_t ProcessReadBytes() {
  std::ifstream io("/proc/self/io");
  std::string name;
  uint64_t value = 0;
  while (io >> name >> value) {
    if (name == "read_bytes:") return value;
  }
  ADD_FAILURE() << "no read_bytes in /proc/self/io";
  return 0;
}
// Every chunk's state (fp32 weights and moments, 12 bytes an element).
constexpr uint64_t kAllStates = (2500 + 1000 + 37 + 4097) * 12;

struct Job {
  std::unique_ptr<JobPipeline> pipeline;
  std::vector<std::vector<uint16_t>> out;  // the client's 16-bit weights
};

class StateTierPipelineTest : public clip_test::UpdaterAndStoreTest<int> {
 protected:
  Job OpenJob(const std::string& name, MemoryShares* shares,
              const std::string& group) {
    PipelineOptions options;
    options.buffers = 3;
    options.state_tier.shares = shares;
    options.fair_group = group;
    auto p = JobPipeline::Open(store_.get(), *updater_, name, layout_, options);
    EXPECT_TRUE(p.ok()) << p.status();
    Job job{*std::move(p), {}};
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 0.5f);
    for (size_t l = 0; l < kLayers; ++l) {
      std::vector<float> w(layout_.layer_elements[l]);
      for (float& x : w) x = dist(rng);
      EXPECT_TRUE(job.pipeline->InitializeWeights(l, w.data()).ok());
      job.out.emplace_back(w.size());
      for (size_t i = 0; i < w.size(); ++i) job.out[l][i] = FloatToBf16(w[i]);
    }
    return job;
  }

  IterationReport Step(Job& job, uint32_t seed, const ClipOptions& clip) {
    const Gradients g = MakeGradients(layout_, seed, 1.0f, -1);
    JobPipeline& p = *job.pipeline;
    EXPECT_TRUE(p.BeginIteration(1.0f, std::nullopt, clip).ok());
    for (size_t j = 0; j < kLayers; ++j) {
      const size_t l = kLayers - 1 - j;
      EXPECT_TRUE(
          p.SubmitGradients(l, g.bytes[l].data(), job.out[l].data()).ok());
    }
    absl::StatusOr<IterationReport> report = p.EndIteration();
    EXPECT_TRUE(report.ok()) << report.status();
    return report.ok() ? *report : IterationReport{};
  }

  // `job` holds what `reference` holds, bit for bit.
  void ExpectSame(Job& job, Job& reference) {
    for (size_t l = 0; l < kLayers; ++l) {
      const size_t n = layout_.layer_elements[l];
      for (StatePart part : {StatePart::kExpAvg, StatePart::kExpAvgSq}) {
        std::vector<float> a(n), b(n);
        ASSERT_TRUE(job.pipeline->ReadState(l, part, a.data()).ok());
        ASSERT_TRUE(reference.pipeline->ReadState(l, part, b.data()).ok());
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), 4 * n)) << "layer " << l;
      }
      std::vector<float> a(n), b(n);
      ASSERT_TRUE(job.pipeline->ReadWeights(l, a.data()).ok());
      ASSERT_TRUE(reference.pipeline->ReadWeights(l, b.data()).ok());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), 4 * n)) << "layer " << l;
      EXPECT_EQ(job.out[l], reference.out[l]) << "16-bit copy of layer " << l;
    }
  }

  ModelLayout layout_ = clip_test::Layout(DType::kBFloat16);
};

TEST_F(StateTierPipelineTest, ATierThatHoldsEveryStateReadsNoneFromTheStore) {
  MemoryShares shares(kAllStates);
  Job tiered = OpenJob("tiered", &shares, "");
  Job plain = OpenJob("plain", nullptr, "");
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    // Unclipped (eager updates), then clipped (deferred ones and a redo).
    const ClipOptions clip{.max_grad_norm = seed % 2 == 1 ? 1e9 : 0.5};
    const IterationReport a = Step(tiered, seed, clip);
    const IterationReport b = Step(plain, seed, clip);
    ExpectSame(tiered, plain);
    EXPECT_EQ(a.clipped, b.clipped);
    EXPECT_EQ(a.busy.bytes_read + a.busy.bytes_from_tier, b.busy.bytes_read);
    EXPECT_EQ(a.busy.bytes_written, b.busy.bytes_written);  // write-through
    if (seed > 1) {
      EXPECT_EQ(a.busy.bytes_read, 0u) << "iteration " << seed;
    }
  }
  EXPECT_EQ(tiered.pipeline->tier_stats().committed_bytes, kAllStates);
  EXPECT_EQ(shares.Held("tiered"), kAllStates);
  // Reading the weights and moments back (a checkpoint) needs no SSD read
  // either: what reached storage, as the kernel counts this process's I/O.
  const uint64_t before = ProcessReadBytes();
  ExpectSame(tiered, tiered);
  EXPECT_EQ(ProcessReadBytes(), before);
  ExpectSame(plain, plain);
  EXPECT_GT(ProcessReadBytes(), before);
}

TEST_F(StateTierPipelineTest, ARestoredMomentIsReadFromTheStoreAgain) {
  MemoryShares shares(kAllStates);
  Job tiered = OpenJob("tiered", &shares, "");
  Job plain = OpenJob("plain", nullptr, "");
  Step(tiered, 1, {});
  Step(plain, 1, {});
  // A moment replaced between iterations (a checkpoint's): the tier's copy
  // of that layer is stale and must not be used.
  const std::vector<float> moment(layout_.layer_elements[0], 0.25f);
  ASSERT_TRUE(
      tiered.pipeline->InitState(0, StatePart::kExpAvg, moment.data()).ok());
  ASSERT_TRUE(
      plain.pipeline->InitState(0, StatePart::kExpAvg, moment.data()).ok());
  const IterationReport a = Step(tiered, 2, {});
  Step(plain, 2, {});
  ExpectSame(tiered, plain);
  // Layer 0's three chunks came from the store.
  EXPECT_EQ(a.busy.bytes_read, 2500u * 12);
}

TEST_F(StateTierPipelineTest, StatesMoveBetweenTiersAsAnotherJobComesAndGoes) {
  MemoryShares shares(kAllStates);
  Job tiered = OpenJob("tiered", &shares, "alice");
  Job plain = OpenJob("plain", nullptr, "");
  uint32_t seed = 1;
  auto both = [&] {
    const IterationReport a = Step(tiered, seed, {});
    const IterationReport b = Step(plain, seed, {});
    ++seed;
    ExpectSame(tiered, plain);
    EXPECT_EQ(a.busy.bytes_read + a.busy.bytes_from_tier, b.busy.bytes_read);
    return a;
  };
  both();
  both();
  EXPECT_EQ(tiered.pipeline->tier_stats().placed_chunks, kChunks);
  {
    // Another user's job arrives: at the first job's next iteration its
    // share is half, and the states beyond it go back to the SSDs.
    Job other = OpenJob("other", &shares, "bob");
    both();
    const StateTier::Stats half = tiered.pipeline->tier_stats();
    EXPECT_LT(half.placed_chunks, kChunks);
    EXPECT_LE(half.bytes_held, kAllStates / 2);
    const IterationReport spilled = both();
    EXPECT_GT(spilled.busy.bytes_read, 0u);
    EXPECT_GT(spilled.busy.bytes_from_tier, 0u);
    // The newcomer gets the other half.
    Step(other, 1, {});
    Step(other, 2, {});
    EXPECT_GT(other.pipeline->tier_stats().committed_bytes, 0u);
    EXPECT_LE(shares.Held("other"), kAllStates / 2);
  }
  // It left: the first job takes every chunk again within two iterations.
  both();
  const IterationReport whole = both();
  EXPECT_EQ(tiered.pipeline->tier_stats().placed_chunks, kChunks);
  EXPECT_EQ(whole.busy.bytes_read, 0u);
}

}  // namespace
}  // namespace lohan
