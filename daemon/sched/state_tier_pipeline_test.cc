// A job whose states the tier holds (all, part, or a part that changes as
// another job arrives and leaves) against one without a tier: the same
// gradients give the same bits every iteration (fp32 weights, moments and
// 16-bit copies), while the tier's chunks are read from memory, not from
// the store. clip_schedule_test runs the tier through every clip path.

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
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
              const std::string& group, uint32_t commit_interval = 1) {
    PipelineOptions options;
    options.buffers = 3;
    options.state_tier.shares = shares;
    options.fair_group = group;
    options.commit_interval = commit_interval;
    auto p = JobPipeline::Open(store_.get(), *updater_, name, layout_, options);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return Job{};
    Job job{*std::move(p), {}};
    // (A reopened job has its weights.)
    if (job.pipeline->layer_initialized(0)) {
      for (size_t l = 0; l < kLayers; ++l) {
        job.out.emplace_back(layout_.layer_elements[l]);
        EXPECT_TRUE(
            job.pipeline->ReadWeightCopy(l, job.out.back().data()).ok());
      }
      return job;
    }
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

  IterationReport Step(Job& job, uint32_t seed, const ClipOptions& clip,
                       int nan_layer = -1) {
    const Gradients g = MakeGradients(layout_, seed, 1.0f, nan_layer);
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

// Durability by commit interval: iterations 3 and 6 durable, the others
// committed for readers at once but written nowhere for the chunks the
// tier holds; every iteration the same bits as a job without a tier; what
// a restart would find (the store's durable versions) is the last durable
// iteration, every tensor alike.
TEST_F(StateTierPipelineTest, DurableEveryNIterationsWithTheSameBits) {
  MemoryShares shares(kAllStates);
  Job tiered = OpenJob("tiered", &shares, "", /*commit_interval=*/3);
  Job plain = OpenJob("plain", nullptr, "");
  auto durable_tags_are = [&](uint64_t iteration) {
    for (const std::string& name : store_->List("tiered")) {
      auto info = store_->Stat("tiered", name);
      ASSERT_TRUE(info.ok());
      EXPECT_EQ(info->durable_tag, iteration + 1)  // CommitTag
          << name << " at iteration " << iteration;
    }
  };
  for (uint32_t seed = 1; seed <= 7; ++seed) {
    // Unclipped, clipped from the start, clipped once 7 chunks were
    // decided (eager updates redone), skipped for a NaN in the last layer
    // handed over (eager updates rolled back): the updates of chunks whose
    // state only the tier holds wait for the outcome in each.
    // Iterations 2 and 5 follow unclipped ones (no clip predicted) whose
    // states only the tier holds.
    ClipOptions clip{.max_grad_norm = seed == 6 ? 0.5 : 1e9};
    if (seed == 2) {
      clip.max_grad_norm = clip_test::LimitCrossingAt(layout_, seed, 7);
    }
    const int nan_layer = seed == 5 ? 0 : -1;
    const IterationReport a = Step(tiered, seed, clip, nan_layer);
    const IterationReport b = Step(plain, seed, clip, nan_layer);
    ExpectSame(tiered, plain);
    EXPECT_EQ(a.skipped, seed == 5);
    if (seed == 2) {
      EXPECT_TRUE(a.clipped);
      EXPECT_EQ(b.eager_chunks, 7u);  // the plain job's, redone or dropped
      EXPECT_EQ(a.eager_chunks, 0u);  // every state was the tier's alone
    }
    // (The skipped iteration 5 leaves the job at 4: iteration 6 is the
    // step that makes 5, and 7 makes 6, durable.)
    const uint64_t done = seed >= 5 ? seed - 1 : seed;
    const bool durable = done % 3 == 0 && seed != 5;
    EXPECT_EQ(tiered.pipeline->durable_iteration(), done / 3 * 3);
    if (!a.skipped) {
      EXPECT_EQ(a.busy.bytes_written, durable ? b.busy.bytes_written : 0u)
          << "iteration " << seed;
    }
    durable_tags_are(done / 3 * 3);
  }
  // Made durable on demand (a drain, a checkpoint), then closed and opened
  // again: it goes on where it was, with the same bits.
  ASSERT_TRUE(tiered.pipeline->MakeDurable().ok());
  EXPECT_EQ(tiered.pipeline->durable_iteration(), 6u);
  durable_tags_are(6);
  tiered.pipeline.reset();
  tiered = OpenJob("tiered", &shares, "", 3);
  ASSERT_NE(tiered.pipeline, nullptr);
  EXPECT_EQ(tiered.pipeline->iteration(), 6u);
  for (uint32_t seed = 8; seed <= 9; ++seed) {
    Step(tiered, seed, {});
    Step(plain, seed, {});
    ExpectSame(tiered, plain);
  }
}

// A pipeline that goes without making its last iterations durable (as a
// killed daemon does) leaves the job at its last durable iteration: opened
// again, it resumes there, with the bits it had then.
TEST_F(StateTierPipelineTest, AfterACrashTheJobResumesAtItsDurableIteration) {
  MemoryShares shares(kAllStates);
  Job tiered = OpenJob("tiered", &shares, "", /*commit_interval=*/4);
  Job plain = OpenJob("plain", nullptr, "");
  std::vector<std::vector<float>> weights_at_4(kLayers);
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    Step(tiered, seed, {});
    Step(plain, seed, {});
    if (seed == 4) {
      for (size_t l = 0; l < kLayers; ++l) {
        weights_at_4[l].resize(layout_.layer_elements[l]);
        ASSERT_TRUE(
            plain.pipeline->ReadWeights(l, weights_at_4[l].data()).ok());
      }
    }
  }
  // The daemon dies: nothing of the pipeline runs again (it is abandoned,
  // its threads idle, never destroyed: no close makes anything durable),
  // and the store is opened again from its files, as at a restart.
  (void)tiered.pipeline.release();
  plain.pipeline.reset();
  store_.reset();
  auto reopened = TensorStore::Open(clip_test::SmallStore(dir_));
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  store_ = *std::move(reopened);
  MemoryShares fresh(kAllStates);
  tiered = OpenJob("tiered", &fresh, "", 4);
  ASSERT_NE(tiered.pipeline, nullptr);
  EXPECT_EQ(tiered.pipeline->iteration(), 4u);
  for (size_t l = 0; l < kLayers; ++l) {
    std::vector<float> w(layout_.layer_elements[l]);
    ASSERT_TRUE(tiered.pipeline->ReadWeights(l, w.data()).ok());
    EXPECT_EQ(0, std::memcmp(w.data(), weights_at_4[l].data(), 4 * w.size()))
        << "layer " << l;
  }
  tiered.pipeline.reset();  // before `fresh`, which it shares
}

// Durable by time: an iteration is durable once durable_every_seconds
// passed on the pipeline's clock since the last durable one (the clock is
// the test's: each step advances it as the test says), with the bits of a
// job without a tier; seconds_since_durable says what a crash would lose.
TEST_F(StateTierPipelineTest, DurableEveryTSecondsWithTheSameBits) {
  MemoryShares shares(kAllStates);
  double now = 100.0;
  PipelineOptions options;
  options.buffers = 3;
  options.state_tier.shares = &shares;
  options.durable_every_seconds = 10.0;
  options.durability_clock = [&now] { return now; };
  auto opened =
      JobPipeline::Open(store_.get(), *updater_, "timed", layout_, options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  Job timed{*std::move(opened), {}};
  Job plain = OpenJob("plain", nullptr, "");
  for (size_t l = 0; l < kLayers; ++l) {
    timed.out.push_back(plain.out[l]);
    std::vector<float> w(layout_.layer_elements[l]);
    ASSERT_TRUE(plain.pipeline->ReadWeights(l, w.data()).ok());
    ASSERT_TRUE(timed.pipeline->InitializeWeights(l, w.data()).ok());
  }
  // Seconds each step takes on the clock, and whether it is durable: the
  // first whose start is 10 s or more past the last durable commit.
  const struct {
    double seconds;
    bool durable;
  } steps[] = {{4, false}, {4, false}, {4, false},  // starts at 0, 4, 8
               {4, true},                           // starts at 12
               {1, false}, {9, false}, {0.5, true}, {30, false}, {1, true}};
  uint64_t durable_at = 0;
  double durable_since = now;
  for (uint32_t seed = 1; seed <= std::size(steps); ++seed) {
    const bool durable = steps[seed - 1].durable;
    const IterationReport a = Step(timed, seed, {});
    const IterationReport b = Step(plain, seed, {});
    ExpectSame(timed, plain);
    EXPECT_EQ(a.busy.bytes_written, durable ? b.busy.bytes_written : 0u)
        << "iteration " << seed;
    if (durable) {
      durable_at = seed;
      durable_since = now;
    }
    EXPECT_EQ(timed.pipeline->durable_iteration(), durable_at) << seed;
    now += steps[seed - 1].seconds;
    EXPECT_DOUBLE_EQ(timed.pipeline->seconds_since_durable(),
                     now - durable_since)
        << seed;
  }
  EXPECT_EQ(timed.pipeline->durable_every_seconds(), 10.0);
}

// What a durable commit costs beyond a volatile one (durable_write_share
// weighs it): the writes of the chunks the tier holds. A job whose share
// holds half its states writes the other half every iteration; those
// writes are not the durable commit's.
TEST_F(StateTierPipelineTest, ADurableCommitCountsOnlyTheTiersWrites) {
  MemoryShares shares(kAllStates / 2);
  Job half = OpenJob("half", &shares, "", /*commit_interval=*/2);
  std::vector<IterationReport> reports;
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    reports.push_back(Step(half, seed, {}));
  }
  const StateTier::Stats held = half.pipeline->tier_stats();
  ASSERT_GT(held.placed_chunks, 0u);
  ASSERT_LT(held.placed_chunks, kChunks);
  // Iteration 3 volatile, 4 durable, with the same chunks in the tier.
  const uint64_t volatile_writes = reports[2].busy.bytes_written;
  const uint64_t durable_writes = reports[3].busy.bytes_written;
  EXPECT_EQ(half.pipeline->durable_iteration(), 4u);
  EXPECT_GT(volatile_writes, 0u);  // the chunks on the SSDs alone
  EXPECT_EQ(half.pipeline->last_durable_write_bytes(),
            durable_writes - volatile_writes);
  EXPECT_LT(half.pipeline->last_durable_write_bytes(), durable_writes);
}

TEST_F(StateTierPipelineTest, ACommitIntervalThatCannotWorkIsRefused) {
  MemoryShares shares(kAllStates);
  PipelineOptions options;
  options.state_tier.shares = &shares;
  options.commit_interval = 0;
  auto zero =
      JobPipeline::Open(store_.get(), *updater_, "zero", layout_, options);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("commit_interval must be at least 1"),
            std::string::npos)
      << zero.status();
  options.commit_interval = 4;
  options.keep_previous_commit = true;
  auto kept =
      JobPipeline::Open(store_.get(), *updater_, "kept", layout_, options);
  EXPECT_EQ(kept.status().code(), absl::StatusCode::kInvalidArgument);
  // By time: likewise without kept commits, and only a finite time >= 0.
  options.commit_interval = 1;
  options.durable_every_seconds = 60.0;
  auto timed_kept =
      JobPipeline::Open(store_.get(), *updater_, "kept", layout_, options);
  EXPECT_EQ(timed_kept.status().code(), absl::StatusCode::kInvalidArgument);
  options.keep_previous_commit = false;
  for (double bad : {-1.0, std::nan(""), static_cast<double>(INFINITY)}) {
    options.durable_every_seconds = bad;
    auto refused =
        JobPipeline::Open(store_.get(), *updater_, "bad", layout_, options);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace lohan
