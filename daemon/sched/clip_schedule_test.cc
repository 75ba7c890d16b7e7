// ClipSchedule::kDeferWhenCertain against kRedoAll: two jobs of the same
// shape and initial weights, driven with the same gradients, must end every
// iteration with the same bits (norm, scale, outcome, fp32 weights, moments,
// 16-bit copies), while the deferred schedule updates each chunk once when
// the outcome is certain early and redoes only what it updated before.
// (job_pipeline_test checks the default schedule, kDeferWhenCertain,
// against a reference AdamW bit for bit.)

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "daemon/optim/adam.h"
#include "daemon/optim/half.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/store/aio_device.h"
#include "daemon/store/fault_injection_device.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing_util::TempDir;

// Layers {2500, 1000, 37, 4097} in chunks of 1000: 3 + 1 + 1 + 5 chunks.
// Backward hands them over last layer first, so decisions run over layer
// 3's five chunks, then 2, 1, and layer 0's three.
constexpr size_t kChunks = 10;

ModelLayout Layout(DType grad_dtype) {
  ModelLayout layout;
  layout.layer_elements = {2500, 1000, 37, 4097};
  layout.chunk_elements = 1000;
  layout.grad_dtype = grad_dtype;
  layout.weight16_dtype = DType::kBFloat16;
  layout.adam.lr = 1e-2;
  layout.adam.weight_decay = 0.1;
  return layout;
}

struct Variant {
  Schedule schedule;
  DType grad_dtype;
  bool streamed;  // Gradients and 16-bit weights through the store.
  bool predict;
  bool settle = false;  // The deferred job's settle_in_background.
};

// One iteration's gradients: bytes in the layout's dtype, with the exact
// sums of squares (double) of each layer and of each chunk, in backward
// order, to place the clip limit.
struct Gradients {
  std::vector<std::vector<uint8_t>> bytes;
  // Cumulative sum of squares after each chunk, in decision order.
  std::vector<double> cumulative;
};

Gradients MakeGradients(const ModelLayout& layout, uint32_t seed,
                        float grad_scale, int nan_layer) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.1f);
  const size_t size = layout.grad_dtype == DType::kFloat32 ? 4 : 2;
  Gradients g;
  std::vector<std::vector<double>> chunk_sums(layout.layer_elements.size());
  for (size_t l = 0; l < layout.layer_elements.size(); ++l) {
    const uint64_t n = layout.layer_elements[l];
    g.bytes.emplace_back(n * size);
    for (uint64_t i = 0; i < n; ++i) {
      float x = dist(rng);
      if (size == 4) {
        std::memcpy(&g.bytes[l][4 * i], &x, 4);
      } else {
        const uint16_t h = layout.grad_dtype == DType::kBFloat16
                               ? FloatToBf16(x)
                               : FloatToFp16(x);
        std::memcpy(&g.bytes[l][2 * i], &h, 2);
        x = layout.grad_dtype == DType::kBFloat16 ? Bf16ToFloat(h)
                                                  : Fp16ToFloat(h);
      }
      if (i % layout.chunk_elements == 0) chunk_sums[l].push_back(0.0);
      const double scaled = static_cast<double>(x * grad_scale);
      chunk_sums[l].back() += scaled * scaled;
    }
  }
  if (nan_layer >= 0) {
    // 0xffff is a NaN in bf16 and fp16, and half of an fp32 NaN's bytes.
    g.bytes[nan_layer][6] = 0xff;
    g.bytes[nan_layer][7] = 0xff;
  }
  double running = 0.0;
  for (size_t j = 0; j < chunk_sums.size(); ++j) {
    for (double s : chunk_sums[chunk_sums.size() - 1 - j]) {
      running += s;
      g.cumulative.push_back(running);
    }
  }
  return g;
}

// What one job produced in an iteration.
struct Outcome {
  IterationReport report;
  std::vector<std::vector<float>> weights, exp_avg, exp_avg_sq;
  std::vector<std::vector<uint16_t>> weight16;
};

class ClipScheduleTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    auto updater = AdamUpdater::Create(nullptr, std::nullopt);
    ASSERT_TRUE(updater.ok()) << updater.status();
    updater_.emplace(*updater);
    StoreOptions o;
    o.ssd_paths = {dir_.Subdir("ssd0"), dir_.Subdir("ssd1")};
    o.state_dir = dir_.path() + "/state";
    o.stripe_unit = 64 << 10;
    o.queue_depth = 8;
    o.device_capacity_bytes = 16 << 20;
    auto store = TensorStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    layout_ = Layout(GetParam().grad_dtype);
    for (int k = 0; k < 2; ++k) {
      PipelineOptions options;
      options.schedule = GetParam().schedule;
      options.buffers = 3;
      options.stream_gradients = GetParam().streamed;
      options.stream_weight16 = GetParam().streamed;
      options.clip_schedule =
          k == 0 ? ClipSchedule::kRedoAll : ClipSchedule::kDeferWhenCertain;
      options.predict_clipping = GetParam().predict;
      options.settle_in_background = k == 1 && GetParam().settle;
      auto p = JobPipeline::Open(store_.get(), *updater_,
                                 k == 0 ? "old" : "new", layout_, options);
      ASSERT_TRUE(p.ok()) << p.status();
      jobs_[k] = *std::move(p);
      std::mt19937 rng(7);
      std::normal_distribution<float> dist(0.0f, 0.5f);
      out_[k].resize(layout_.layer_elements.size());
      for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
        std::vector<float> w(layout_.layer_elements[l]);
        for (float& x : w) x = dist(rng);
        ASSERT_TRUE(jobs_[k]->InitializeWeights(l, w.data()).ok());
        // What a client's buffer holds: the committed weights' copy.
        out_[k][l].resize(w.size());
        for (size_t i = 0; i < w.size(); ++i) out_[k][l][i] = FloatToBf16(w[i]);
      }
    }
  }

  Outcome Run(int k, const Gradients& g, float grad_scale,
              const ClipOptions& clip) {
    JobPipeline& p = *jobs_[k];
    const size_t layers = layout_.layer_elements.size();
    EXPECT_TRUE(p.BeginIteration(grad_scale, 0.0, clip).ok());
    std::vector<uint8_t> slot;
    for (size_t j = 0; j < layers; ++j) {
      const size_t l = layers - 1 - j;
      if (GetParam().streamed) {
        // One reused buffer: the pipeline may not look after the call.
        slot = g.bytes[l];
        EXPECT_TRUE(p.SubmitGradients(l, slot.data(), nullptr).ok());
        std::fill(slot.begin(), slot.end(), 0x7f);
      } else {
        EXPECT_TRUE(
            p.SubmitGradients(l, g.bytes[l].data(), out_[k][l].data()).ok());
      }
    }
    Outcome o;
    absl::StatusOr<IterationReport> report = p.EndIteration();
    EXPECT_TRUE(report.ok()) << report.status();
    if (report.ok()) o.report = *report;
    // Settling: whenever updates are left after the norm (and, timing
    // permitting, when eager ones still run); never without the option or
    // after a skip.
    const bool settles = k == 1 && GetParam().settle && !o.report.skipped;
    if (!settles) EXPECT_FALSE(o.report.settling);
    if (settles &&
        (o.report.deferred_chunks > 0 || o.report.redone_chunks > 0)) {
      EXPECT_TRUE(o.report.settling);
    }
    for (size_t l = 0; l < layers; ++l) {
      const size_t n = layout_.layer_elements[l];
      // As the next forward would: this layer's update, and only it.
      EXPECT_TRUE(p.WaitLayer(l).ok());
      o.weights.emplace_back(n);
      o.exp_avg.emplace_back(n);
      o.exp_avg_sq.emplace_back(n);
      EXPECT_TRUE(p.ReadWeights(l, o.weights.back().data()).ok());
      EXPECT_TRUE(
          p.ReadState(l, StatePart::kExpAvg, o.exp_avg.back().data()).ok());
      EXPECT_TRUE(
          p.ReadState(l, StatePart::kExpAvgSq, o.exp_avg_sq.back().data())
              .ok());
      if (GetParam().streamed) {
        o.weight16.emplace_back(n);
        EXPECT_TRUE(p.ReadWeight16(l, o.weight16.back().data()).ok());
      } else {
        o.weight16.push_back(out_[k][l]);
      }
    }
    return o;
  }

  // Runs both jobs on the same iteration and checks they agree bit for bit;
  // returns the deferred job's report, with the redo-all job's in `old`.
  IterationReport RunBoth(uint32_t seed, const ClipOptions& clip,
                          float grad_scale = 1.0f, int nan_layer = -1,
                          IterationReport* old = nullptr) {
    const Gradients g = MakeGradients(layout_, seed, grad_scale, nan_layer);
    const Outcome a = Run(0, g, grad_scale, clip);
    const Outcome b = Run(1, g, grad_scale, clip);
    EXPECT_EQ(0, std::memcmp(&a.report.global_norm, &b.report.global_norm, 8))
        << a.report.global_norm << " vs " << b.report.global_norm;
    EXPECT_EQ(a.report.clipped, b.report.clipped);
    EXPECT_EQ(a.report.skipped, b.report.skipped);
    EXPECT_EQ(a.report.nonfinite, b.report.nonfinite);
    EXPECT_EQ(a.report.iteration, b.report.iteration);
    EXPECT_EQ(0, std::memcmp(&a.report.clip_scale, &b.report.clip_scale, 8));
    for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
      const size_t n = layout_.layer_elements[l];
      EXPECT_EQ(0, std::memcmp(a.weights[l].data(), b.weights[l].data(), 4 * n))
          << "fp32 weights of layer " << l;
      EXPECT_EQ(0, std::memcmp(a.exp_avg[l].data(), b.exp_avg[l].data(), 4 * n))
          << "exp_avg of layer " << l;
      EXPECT_EQ(
          0, std::memcmp(a.exp_avg_sq[l].data(), b.exp_avg_sq[l].data(), 4 * n))
          << "exp_avg_sq of layer " << l;
      EXPECT_EQ(a.weight16[l], b.weight16[l]) << "16-bit copy of layer " << l;
      size_t stale = 0;
      for (size_t i = 0; i < n; ++i) {
        stale += b.weight16[l][i] != FloatToBf16(b.weights[l][i]);
      }
      EXPECT_EQ(stale, 0u) << "16-bit copies of layer " << l
                           << " that are not the committed weights'";
    }
    for (const char* job : {"old", "new"}) {
      for (const std::string& name : store_->List(job)) {
        EXPECT_EQ(store_->Stat(job, name)->pending_version, 0u) << name;
        EXPECT_NE(name.rfind(StateLayout::kScratchPrefix, 0), 0u) << name;
      }
    }
    if (old != nullptr) *old = a.report;
    return b.report;
  }

  // A limit whose square lies halfway between the cumulative sums before
  // and after decision `chunk` (0-based): clipping becomes certain exactly
  // at that chunk.
  double LimitCrossingAt(uint32_t seed, size_t chunk, float grad_scale = 1) {
    const Gradients g = MakeGradients(layout_, seed, grad_scale, -1);
    const double before = chunk == 0 ? 0.0 : g.cumulative[chunk - 1];
    return std::sqrt((before + g.cumulative[chunk]) / 2);
  }

  // Streamed: the bytes of one iteration's gradients stored at submit.
  uint64_t GradBytes() const {
    if (!GetParam().streamed) return 0;
    uint64_t elements = 0;
    for (uint64_t n : layout_.layer_elements) elements += n;
    return elements * (layout_.grad_dtype == DType::kFloat32 ? 4 : 2);
  }

  bool AfterBackward() const {
    return GetParam().schedule == Schedule::kAfterBackward;
  }

  TempDir dir_;
  std::optional<AdamUpdater> updater_;
  std::unique_ptr<TensorStore> store_;
  ModelLayout layout_;
  std::unique_ptr<JobPipeline> jobs_[2];
  std::vector<std::vector<uint16_t>> out_[2];
};

TEST_P(ClipScheduleTest, NeverClippedUpdatesEagerlyAndOnce) {
  for (uint32_t seed : {1, 2}) {
    IterationReport old;
    const IterationReport r =
        RunBoth(seed, ClipOptions{.max_grad_norm = 1e9}, 1.0f, -1, &old);
    EXPECT_FALSE(r.clipped);
    EXPECT_EQ(r.eager_chunks, AfterBackward() ? 0u : kChunks);
    EXPECT_EQ(r.deferred_chunks, AfterBackward() ? kChunks : 0u);
    EXPECT_EQ(r.redone_chunks, 0u);
    if (!GetParam().settle) {  // Else counted in the next report.
      EXPECT_EQ(r.busy.bytes_read, old.busy.bytes_read);
      EXPECT_EQ(r.busy.bytes_written, old.busy.bytes_written);
    }
  }
}

TEST_P(ClipScheduleTest, ClippedFromTheFirstChunkPaysOnePass) {
  IterationReport old;
  const IterationReport r = RunBoth(
      3, ClipOptions{.max_grad_norm = LimitCrossingAt(3, 0)}, 1.0f, -1, &old);
  EXPECT_TRUE(r.clipped);
  EXPECT_EQ(r.eager_chunks, 0u);
  EXPECT_EQ(r.deferred_chunks, kChunks);
  EXPECT_EQ(r.redone_chunks, 0u);
  EXPECT_EQ(old.redone_chunks, kChunks);
  // Each chunk's state read and written once: what redo-all moves for its
  // first pass alone.
  if (!GetParam().settle) {  // Else counted in the next report.
    EXPECT_EQ(r.busy.bytes_read * 2, old.busy.bytes_read);
    // Streamed, both store each gradient once at submit.
    EXPECT_EQ(r.busy.bytes_written * 2, old.busy.bytes_written + GradBytes());
  }
}

TEST_P(ClipScheduleTest, CrossingLateRedoesOnlyTheChunksBefore) {
  // Certain at decision 7: layer 0's first chunk, after layers 3, 2 and 1.
  const IterationReport r =
      RunBoth(4, ClipOptions{.max_grad_norm = LimitCrossingAt(4, 7)});
  EXPECT_TRUE(r.clipped);
  EXPECT_EQ(r.eager_chunks, AfterBackward() ? 0u : 7u);
  EXPECT_EQ(r.deferred_chunks, AfterBackward() ? kChunks : 3u);
  EXPECT_EQ(r.redone_chunks, r.eager_chunks);
  // Crossing in the middle of layer 3 (decision 2), with a loss scale
  // (after a clipped iteration, unless the start is not predicted).
  const IterationReport mid = RunBoth(
      5, ClipOptions{.max_grad_norm = LimitCrossingAt(5, 2, 0.5f)}, 0.5f);
  EXPECT_TRUE(mid.clipped);
  EXPECT_EQ(mid.eager_chunks, AfterBackward() || GetParam().predict ? 0u : 2u);
  EXPECT_EQ(mid.redone_chunks, mid.eager_chunks);
}

TEST_P(ClipScheduleTest, ClippingStreaksStartDeferredWhenPredicted) {
  const ClipOptions clip{.max_grad_norm = LimitCrossingAt(6, 8)};
  const IterationReport first = RunBoth(6, clip);
  EXPECT_TRUE(first.clipped);
  EXPECT_EQ(first.started_deferred, AfterBackward());
  // The same gradients and limit again: the history says clip.
  const IterationReport second = RunBoth(6, clip);
  EXPECT_TRUE(second.clipped);
  const bool predicted = GetParam().predict || AfterBackward();
  EXPECT_EQ(second.started_deferred, predicted);
  EXPECT_EQ(second.eager_chunks, predicted ? 0u : 8u);
  // A wrong guess: the next iteration does not clip. Its updates wait for
  // the norm, but each is made once, with the same result.
  const IterationReport third = RunBoth(8, ClipOptions{.max_grad_norm = 1e9});
  EXPECT_FALSE(third.clipped);
  EXPECT_EQ(third.started_deferred, predicted);
  EXPECT_EQ(third.redone_chunks, 0u);
  EXPECT_EQ(third.deferred_chunks, predicted ? kChunks : 0u);
  // And the one after that is eager again.
  const IterationReport fourth = RunBoth(9, ClipOptions{.max_grad_norm = 1e9});
  EXPECT_EQ(fourth.started_deferred, AfterBackward());
}

TEST_P(ClipScheduleTest, NonFiniteGradientsSkipAtAnyPoint) {
  // inf/NaN in the first layer handed over (layer 3) and in the last
  // (layer 0): the skip is certain at once, or after seven updates that
  // are then rolled back and their 16-bit copies restored.
  // A limit the finite gradients never reach: only the inf/NaN decides.
  const ClipOptions clip{.max_grad_norm = 1e9, .skip_nonfinite = true};
  RunBoth(10, ClipOptions{.max_grad_norm = 1e9});
  const IterationReport early = RunBoth(11, clip, 1.0f, /*nan_layer=*/3);
  EXPECT_TRUE(early.skipped);
  EXPECT_EQ(early.eager_chunks, 0u);
  const IterationReport late = RunBoth(12, clip, 1.0f, /*nan_layer=*/0);
  EXPECT_TRUE(late.skipped);
  EXPECT_EQ(late.iteration, 1u);
  EXPECT_EQ(late.eager_chunks, AfterBackward() ? 0u : 7u);
  // Without skipping, the update is committed as computed, unclipped, also
  // when the finite part had made clipping look certain (a norm of about
  // 2.8 against 1.0) and the chunks after it waited.
  const IterationReport kept = RunBoth(
      13, ClipOptions{.max_grad_norm = 1.0, .skip_nonfinite = false}, 1.0f, 0);
  EXPECT_FALSE(kept.skipped);
  EXPECT_FALSE(kept.clipped);
  EXPECT_EQ(kept.iteration, 2u);
  EXPECT_GT(kept.deferred_chunks, 0u);
}

// ------------------------------------------------------------ settling

// settle_in_background on a store whose reads are slowed: the iteration's
// last updates run after EndIteration returned, each layer is usable once
// WaitLayer says so and not before, the commit follows, and a failure
// there is reported and rolled back.
class SettleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto updater = AdamUpdater::Create(nullptr, std::nullopt);
    ASSERT_TRUE(updater.ok()) << updater.status();
    updater_.emplace(*updater);
    OpenStore();
  }

  void OpenStore() {
    store_.reset();
    faults_.clear();
    StoreOptions o;
    o.ssd_paths = {dir_.Subdir("ssd0"), dir_.Subdir("ssd1")};
    o.state_dir = dir_.path() + "/state";
    o.stripe_unit = 64 << 10;
    o.queue_depth = 8;
    o.device_capacity_bytes = 16 << 20;
    std::vector<std::unique_ptr<BlockDevice>> devices;
    for (const std::string& path : o.ssd_paths) {
      auto aio = AioBlockDevice::Open(
          AioDeviceOptions{.path = path,
                           .capacity_bytes = o.device_capacity_bytes,
                           .queue_depth = o.queue_depth});
      ASSERT_TRUE(aio.ok()) << aio.status();
      auto f = std::make_unique<FaultInjectionDevice>(*std::move(aio));
      faults_.push_back(f.get());
      devices.push_back(std::move(f));
    }
    auto s = TensorStore::OpenWithDevices(o, std::move(devices));
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }

  std::unique_ptr<JobPipeline> Open(const std::string& job, bool settle) {
    PipelineOptions options;
    options.buffers = 3;
    options.settle_in_background = settle;
    auto p = JobPipeline::Open(store_.get(), *updater_, job, layout_, options);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  void Initialize(JobPipeline& p, std::vector<std::vector<uint16_t>>& out) {
    out.resize(layout_.layer_elements.size());
    for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
      std::vector<float> w(layout_.layer_elements[l], 0.25f + 0.01f * l);
      ASSERT_TRUE(p.InitializeWeights(l, w.data()).ok());
      out[l].assign(w.size(), FloatToBf16(w[0]));
    }
  }

  // Begins an iteration that clips from its first chunk (so every update
  // waits for the norm) and hands over every layer, last layer first.
  void Backward(JobPipeline& p, const Gradients& g,
                std::vector<std::vector<uint16_t>>& out) {
    ASSERT_TRUE(
        p.BeginIteration(1.0f, 0.0, ClipOptions{.max_grad_norm = 1e-3}).ok());
    for (size_t j = 0; j < g.bytes.size(); ++j) {
      const size_t l = g.bytes.size() - 1 - j;
      ASSERT_TRUE(p.SubmitGradients(l, g.bytes[l].data(), out[l].data()).ok());
    }
  }

  // A reference job that settles in the foreground and a job that settles
  // in the background, both initialized alike; the reference then runs the
  // iteration of `g` to its commit.
  void OpenPairAndRunReference(const Gradients& g) {
    ref_ = Open("ref", /*settle=*/false);
    job_ = Open("job", /*settle=*/true);
    ASSERT_TRUE(ref_ && job_);
    Initialize(*ref_, ref_out_);
    Initialize(*job_, out_);
    Backward(*ref_, g, ref_out_);
    absl::StatusOr<IterationReport> want = ref_->EndIteration();
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(want->clipped);
  }

  // The reference's and the job's fp32 weights, bit for bit.
  void ExpectSameWeights() {
    for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
      std::vector<float> a(layout_.layer_elements[l]), b(a.size());
      ASSERT_TRUE(ref_->ReadWeights(l, a.data()).ok());
      ASSERT_TRUE(job_->ReadWeights(l, b.data()).ok());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), 4 * a.size())) << l;
    }
  }

  void SlowReads(int delay_ms) {
    for (FaultInjectionDevice* f : faults_) {
      f->Inject({.fault = FaultInjectionDevice::Fault::kDelay,
                 .op = IoRequest::Op::kRead,
                 .count = 1000,
                 .delay_ms = delay_ms});
    }
  }

  TempDir dir_;
  std::optional<AdamUpdater> updater_;
  std::unique_ptr<TensorStore> store_;
  std::vector<FaultInjectionDevice*> faults_;
  const ModelLayout layout_ = Layout(DType::kBFloat16);
  std::unique_ptr<JobPipeline> ref_, job_;
  std::vector<std::vector<uint16_t>> ref_out_, out_;
};

TEST_F(SettleTest, EachLayerWaitsForItsOwnUpdateOnly) {
  const Gradients g = MakeGradients(layout_, 21, 1.0f, -1);
  OpenPairAndRunReference(g);
  JobPipeline* job = job_.get();
  std::vector<std::vector<uint16_t>>& out = out_;
  const std::vector<std::vector<uint16_t>>& ref_out = ref_out_;
  Backward(*job, g, out);
  // Every state read of the settle pass takes 100 ms: ten chunks, layer 0's
  // three first.
  SlowReads(100);
  absl::StatusOr<IterationReport> r = job->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->settling);
  EXPECT_TRUE(r->clipped);
  EXPECT_EQ(r->iteration, 1u);
  EXPECT_EQ(r->deferred_chunks, kChunks);
  EXPECT_EQ(job->iteration(), 0u);  // Not committed yet.
  ASSERT_TRUE(job->WaitLayer(0).ok());
  // Layer 0 has its new weights while layer 3's five reads are still to
  // come: the commit has not happened.
  EXPECT_EQ(out[0], ref_out[0]);
  EXPECT_EQ(job->iteration(), 0u);
  for (size_t l = 1; l < layout_.layer_elements.size(); ++l) {
    ASSERT_TRUE(job->WaitLayer(l).ok());
    EXPECT_EQ(out[l], ref_out[l]) << "layer " << l;
  }
  for (FaultInjectionDevice* f : faults_) f->ClearFaults();
  // The next iteration begins once the commit is done.
  ASSERT_TRUE(job->BeginIteration().ok());
  EXPECT_EQ(job->iteration(), 1u);
  ASSERT_TRUE(job->AbortIteration().ok());
  ExpectSameWeights();
}

TEST_F(SettleTest, UnclippedTailRunsLayerZeroFirst) {
  // Nothing clips: every chunk was handed to the stages in backward order
  // (layer 3 first), and reads are slow, so most of them are still queued
  // when EndIteration returns. Those left go in forward order: layer 0's
  // update is done while later layers' still run.
  auto job = Open("job", /*settle=*/true);
  ASSERT_TRUE(job);
  std::vector<std::vector<uint16_t>> out;
  Initialize(*job, out);
  const Gradients g = MakeGradients(layout_, 26, 1.0f, -1);
  SlowReads(100);
  ASSERT_TRUE(
      job->BeginIteration(1.0f, 0.0, ClipOptions{.max_grad_norm = 1e9}).ok());
  for (size_t j = 0; j < g.bytes.size(); ++j) {
    const size_t l = g.bytes.size() - 1 - j;
    ASSERT_TRUE(job->SubmitGradients(l, g.bytes[l].data(), out[l].data()).ok());
  }
  absl::StatusOr<IterationReport> r = job->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->clipped);
  EXPECT_EQ(r->eager_chunks, kChunks);
  ASSERT_TRUE(r->settling);
  ASSERT_TRUE(job->WaitLayer(0).ok());
  EXPECT_GT(job->layers_settling(), 0u);
  ASSERT_TRUE(job->WaitLayer(3).ok());
  for (FaultInjectionDevice* f : faults_) f->ClearFaults();
  ASSERT_TRUE(job->BeginIteration().ok());
  EXPECT_EQ(job->iteration(), 1u);
  EXPECT_EQ(job->layers_settling(), 0u);
  ASSERT_TRUE(job->AbortIteration().ok());
}

TEST_F(SettleTest, ReadsOfTheWeightsWaitAndSeeTheNewOnes) {
  const Gradients g = MakeGradients(layout_, 22, 1.0f, -1);
  OpenPairAndRunReference(g);
  JobPipeline* ref = ref_.get();
  JobPipeline* job = job_.get();
  Backward(*job, g, out_);
  SlowReads(30);
  ASSERT_TRUE(job->EndIteration().ok());
  // ReadWeights of the last layer in forward order, mid-settle: the new
  // fp32 weights (pending until the commit), as the reference committed.
  std::vector<float> a(layout_.layer_elements[3]), b(a.size());
  ASSERT_TRUE(job->ReadWeights(3, b.data()).ok());
  for (FaultInjectionDevice* f : faults_) f->ClearFaults();
  ASSERT_TRUE(ref->ReadWeights(3, a.data()).ok());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), 4 * a.size()));
  // States are read between iterations only: after the commit.
  std::vector<float> m(layout_.layer_elements[0]);
  ASSERT_TRUE(job->ReadState(0, StatePart::kExpAvg, m.data()).ok());
  EXPECT_EQ(job->iteration(), 1u);
}

TEST_F(SettleTest, AFailedSettleIsRolledBackAndReported) {
  auto job = Open("job", /*settle=*/true);
  ASSERT_TRUE(job);
  std::vector<std::vector<uint16_t>> out;
  Initialize(*job, out);
  std::vector<float> before(layout_.layer_elements[3]);
  ASSERT_TRUE(job->ReadWeights(3, before.data()).ok());
  // Resident: the pipeline reads the gradients until the iteration ends.
  const Gradients g = MakeGradients(layout_, 23, 1.0f, -1);
  Backward(*job, g, out);
  // The settle pass's writes fail (after a delay, so EndIteration returns
  // first).
  for (FaultInjectionDevice* f : faults_) {
    f->Inject({.fault = FaultInjectionDevice::Fault::kDelay,
               .op = IoRequest::Op::kRead,
               .count = 1,
               .delay_ms = 50});
    f->Inject({.fault = FaultInjectionDevice::Fault::kEio,
               .op = IoRequest::Op::kWrite,
               .count = 1000});
  }
  absl::StatusOr<IterationReport> r = job->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->settling) << r->deferred_chunks << " deferred, clipped "
                           << r->clipped << " norm " << r->global_norm;
  absl::Status waited = job->WaitLayer(3);
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_NE(waited.message().find("stays at iteration 0"), std::string::npos)
      << waited;
  EXPECT_EQ(job->iteration(), 0u);
  // Refused from now on, with the same words.
  EXPECT_EQ(job->BeginIteration().code(), absl::StatusCode::kAborted);
  for (FaultInjectionDevice* f : faults_) f->ClearFaults();
  job.reset();
  // Opened again: at iteration 0, the weights as they were, and trainable.
  job = Open("job", /*settle=*/true);
  ASSERT_TRUE(job);
  EXPECT_EQ(job->iteration(), 0u);
  std::vector<float> after(before.size());
  ASSERT_TRUE(job->ReadWeights(3, after.data()).ok());
  EXPECT_EQ(before, after);
  const Gradients next = MakeGradients(layout_, 24, 1.0f, -1);
  Backward(*job, next, out);
  ASSERT_TRUE(job->EndIteration().ok());
  ASSERT_TRUE(job->BeginIteration().ok());
  EXPECT_EQ(job->iteration(), 1u);
}

TEST_F(SettleTest, ClosingWhileSettlingCommitsFirst) {
  const Gradients g = MakeGradients(layout_, 25, 1.0f, -1);
  OpenPairAndRunReference(g);
  Backward(*job_, g, out_);
  SlowReads(20);
  absl::StatusOr<IterationReport> r = job_->EndIteration();
  ASSERT_TRUE(r.ok() && r->settling);
  job_.reset();  // The step was reported done: it must not be lost.
  for (FaultInjectionDevice* f : faults_) f->ClearFaults();
  job_ = Open("job", /*settle=*/true);
  ASSERT_TRUE(job_);
  EXPECT_EQ(job_->iteration(), 1u);
  ExpectSameWeights();
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ClipScheduleTest,
    ::testing::Values(
        Variant{Schedule::kPipelined, DType::kBFloat16, false, true},
        Variant{Schedule::kPipelined, DType::kBFloat16, false, false},
        Variant{Schedule::kPipelined, DType::kFloat32, true, true},
        Variant{Schedule::kPipelined, DType::kFloat16, true, false},
        Variant{Schedule::kSerialized, DType::kBFloat16, false, true},
        Variant{Schedule::kAfterBackward, DType::kBFloat16, false, true},
        Variant{Schedule::kAfterBackward, DType::kBFloat16, true, false},
        Variant{Schedule::kPipelined, DType::kBFloat16, false, true, true},
        Variant{Schedule::kPipelined, DType::kFloat32, true, false, true},
        Variant{Schedule::kAfterBackward, DType::kFloat16, false, true, true}));

}  // namespace
}  // namespace lohan

namespace lohan {
namespace {

// Many aborts right after the gradients are handed over, then a full
// iteration: each abort leaves the job at iteration 0 and the iteration
// after them commits step 1. (An abort waits only until every chunk of its
// pass is finished, and the decide stage takes its count of a chunk off a
// moment after; a stale count taken off the next pass's once wrapped it
// below zero and the next EndIteration waited for ever. The rounds give
// that narrow race chances; the pass check in DecideLoop closes it.)
TEST_F(SettleTest, AbortsRightAfterSubmittingNeverStallTheNextIteration) {
  auto job = Open("job", /*settle=*/false);
  ASSERT_TRUE(job);
  std::vector<std::vector<uint16_t>> out;
  Initialize(*job, out);
  const Gradients g = MakeGradients(layout_, 31, 1.0f, -1);
  for (int round = 0; round < 200; ++round) {
    ASSERT_TRUE(
        job->BeginIteration(1.0f, 0.0, ClipOptions{.max_grad_norm = 1e9}).ok());
    for (size_t l = 0; l < g.bytes.size(); ++l) {
      ASSERT_TRUE(
          job->SubmitGradients(l, g.bytes[l].data(), out[l].data()).ok());
    }
    ASSERT_TRUE(job->AbortIteration().ok()) << "round " << round;
  }
  ASSERT_TRUE(
      job->BeginIteration(1.0f, 0.0, ClipOptions{.max_grad_norm = 1e9}).ok());
  for (size_t l = 0; l < g.bytes.size(); ++l) {
    ASSERT_TRUE(job->SubmitGradients(l, g.bytes[l].data(), out[l].data()).ok());
  }
  absl::StatusOr<IterationReport> r = job->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->iteration, 1u);
}

}  // namespace
}  // namespace lohan
