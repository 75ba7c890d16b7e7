#include "daemon/sched/job_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "daemon/optim/half.h"
#include "daemon/optim/worker_pool.h"
#include "daemon/sched/clip_test_util.h"
#include "daemon/store/fault_injection_device.h"
#include "daemon/store/fault_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing_util::TempDir;

// ------------------------------------------------------------ reference
//
// torch.optim.AdamW for one flat layer, in the same float operations as
// daemon/optim's kernels (scalars in double once per step, elementwise in
// float with fused multiply-adds where the kernel fuses). The pipeline must
// match it bit for bit: tolerance 0 on fp32 weights and 16-bit copies.

struct RefLayer {
  std::vector<float> w, m, v, vmax;
};

uint16_t ToHalf(float x, DType dtype) {
  return dtype == DType::kBFloat16 ? FloatToBf16(x) : FloatToFp16(x);
}
float FromHalf(uint16_t x, DType dtype) {
  return dtype == DType::kBFloat16 ? Bf16ToFloat(x) : Fp16ToFloat(x);
}

// `step` is the count before this step; g the gradient's exact values.
// Elements i with no_decay[i] (when given) get weight_decay 0: neither
// AdamW's decay nor Adam's L2 term.
// `group` (per element, -1: none) and `groups`: element groups' lr scale
// and weight decay in place of o's, as the pipeline applies them.
void RefAdamStep(const AdamOptions& job, DType moment_dtype, int64_t step,
                 const std::vector<float>& g_values, float inv_scale,
                 RefLayer& L, const std::vector<int>* group = nullptr,
                 const std::vector<ElementGroup>* groups = nullptr) {
  const double t = static_cast<double>(step + 1);
  const double bc1 = 1.0 - std::pow(job.beta1, t);
  const double bc2 = 1.0 - std::pow(job.beta2, t);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float b1 = static_cast<float>(job.beta1);
  const float omb1 = static_cast<float>(1.0 - job.beta1);
  const float b2 = static_cast<float>(job.beta2);
  const float omb2 = static_cast<float>(1.0 - job.beta2);
  const float eps = static_cast<float>(job.eps);
  const bool bf16 = moment_dtype == DType::kBFloat16;
  auto keep = [&](float x) { return bf16 ? Bf16ToFloat(FloatToBf16(x)) : x; };
  for (size_t i = 0; i < L.w.size(); ++i) {
    AdamOptions o = job;
    if (group != nullptr && (*group)[i] >= 0) {
      const ElementGroup& g = (*groups)[(*group)[i]];
      o.lr = job.lr * g.lr_scale;
      o.weight_decay = g.weight_decay;
    }
    const float neg_step = static_cast<float>(-(o.lr / bc1));
    const float decay = static_cast<float>(
        o.decoupled_weight_decay ? 1.0 - o.lr * o.weight_decay : 1.0);
    // Adam (not AdamW): g += wd * w.
    const bool use_l2 = !o.decoupled_weight_decay && o.weight_decay != 0.0;
    const float l2 = static_cast<float>(o.weight_decay);
    float g = g_values[i] * inv_scale;
    float w = L.w[i] * decay;
    if (use_l2) g = std::fma(l2, w, g);
    const float m = std::fma(b1, L.m[i], omb1 * g);
    float v = std::fma(b2, L.v[i], (omb2 * g) * g);
    L.m[i] = keep(m);
    L.v[i] = keep(v);
    if (o.amsgrad) {
      v = std::max(L.vmax[i], v);
      L.vmax[i] = keep(v);
    }
    const float denom = std::sqrt(v) / bc2_sqrt + eps;
    w = std::fma(neg_step, m / denom, w);
    L.w[i] = w;
  }
}

// A gradient in the layout's dtype and its exact float values.
struct Grad {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

Grad MakeGrad(size_t n, DType dtype, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  Grad g;
  g.values.resize(n);
  g.bytes.resize(n * (dtype == DType::kFloat32 ? 4 : 2));
  for (size_t i = 0; i < n; ++i) {
    const float x = dist(rng);
    if (dtype == DType::kFloat32) {
      g.values[i] = x;
      std::memcpy(&g.bytes[4 * i], &x, 4);
    } else {
      const uint16_t h = ToHalf(x, dtype);
      g.values[i] = FromHalf(h, dtype);
      std::memcpy(&g.bytes[2 * i], &h, 2);
    }
  }
  return g;
}

// ------------------------------------------------------------ fixture

// 4 layers of odd sizes, chunks of 1000: layer 2 is smaller than a chunk,
// the others span 2..5 chunks with a short last one (clip_test_util.h).
using clip_test::Layout;

class JobPipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto updater = AdamUpdater::Create(nullptr, std::nullopt);
    ASSERT_TRUE(updater.ok()) << updater.status();
    updater_.emplace(*updater);
    OpenStore();
  }

  StoreOptions Options() { return clip_test::SmallStore(dir_); }
  void OpenStore() {
    auto s = TensorStore::Open(Options());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }
  // Reopens the store with every device wrapped in a FaultInjectionDevice.
  void OpenStoreWithFaults() {
    store_.reset();
    auto s = testing_util::OpenStoreWithFaults(Options(), &faults_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }

  std::unique_ptr<JobPipeline> OpenJob(const std::string& job,
                                       const ModelLayout& layout,
                                       Schedule schedule) {
    PipelineOptions options;
    options.schedule = schedule;
    options.buffers = 3;
    auto p = JobPipeline::Open(store_.get(), *updater_, job, layout, options);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  // Fresh reference states and initialized pipeline states.
  std::vector<RefLayer> Initialize(JobPipeline& p, const ModelLayout& layout) {
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 0.5f);
    std::vector<RefLayer> ref(layout.layer_elements.size());
    for (size_t l = 0; l < ref.size(); ++l) {
      const size_t n = layout.layer_elements[l];
      ref[l].w.resize(n);
      for (float& x : ref[l].w) x = dist(rng);
      ref[l].m.assign(n, 0.0f);
      ref[l].v.assign(n, 0.0f);
      ref[l].vmax.assign(n, 0.0f);
      EXPECT_TRUE(p.InitializeWeights(l, ref[l].w.data()).ok());
    }
    return ref;
  }

  // One iteration: gradients submitted last layer first (backward order),
  // reference stepped alike (with the pipeline's reported clip scale), and
  // every fp32 and 16-bit weight compared exactly.
  IterationReport RunAndCheck(JobPipeline& p, const ModelLayout& layout,
                              std::vector<RefLayer>& ref, int64_t& ref_step,
                              uint32_t seed, const ClipOptions& clip = {},
                              int nan_layer = -1) {
    std::mt19937 rng(seed);
    const size_t layers = layout.layer_elements.size();
    std::vector<Grad> grads;
    std::vector<std::vector<uint16_t>> out(layers);
    double sum = 0.0;
    for (size_t l = 0; l < layers; ++l) {
      grads.push_back(
          MakeGrad(layout.layer_elements[l], layout.grad_dtype, rng, 0.1f));
      out[l].assign(layout.layer_elements[l], 0xdead);
    }
    if (nan_layer >= 0 && clip.skip_nonfinite) {
      // A skip leaves a buffer it did not update as it was, so here it holds
      // what a client's buffer holds: the committed weights' copy. Updated
      // ones must get it back.
      for (size_t l = 0; l < layers; ++l) {
        for (size_t i = 0; i < out[l].size(); ++i) {
          out[l][i] = ToHalf(ref[l].w[i], layout.weight16_dtype);
        }
      }
    }
    if (nan_layer >= 0) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      Grad& g = grads[nan_layer];
      g.values[3] = nan;
      if (layout.grad_dtype == DType::kFloat32) {
        std::memcpy(&g.bytes[12], &nan, 4);
      } else {
        const uint16_t h = ToHalf(nan, layout.grad_dtype);
        std::memcpy(&g.bytes[6], &h, 2);
      }
    }
    for (const Grad& g : grads) {
      for (float x : g.values) sum += static_cast<double>(x) * x;
    }
    EXPECT_TRUE(p.BeginIteration(1.0f, std::nullopt, clip).ok());
    for (size_t i = 0; i < layers; ++i) {
      const size_t l = layers - 1 - i;
      EXPECT_TRUE(
          p.SubmitGradients(l, grads[l].bytes.data(), out[l].data()).ok());
    }
    absl::StatusOr<IterationReport> report = p.EndIteration();
    EXPECT_TRUE(report.ok()) << report.status();
    if (!report.ok()) return IterationReport{};

    if (nan_layer >= 0) {
      EXPECT_TRUE(report->nonfinite);
    } else {
      EXPECT_NEAR(report->global_norm, std::sqrt(sum), 1e-12 * std::sqrt(sum));
    }
    if (!report->skipped) {
      const float inv_scale =
          report->clipped ? static_cast<float>(report->clip_scale) : 1.0f;
      for (size_t l = 0; l < layers; ++l) {
        RefAdamStep(layout.adam, layout.moment_dtype, ref_step, grads[l].values,
                    inv_scale, ref[l]);
      }
      ++ref_step;
    }
    EXPECT_EQ(report->iteration, static_cast<uint64_t>(ref_step));
    EXPECT_EQ(p.iteration(), static_cast<uint64_t>(ref_step));
    CheckWeights(p, layout, ref);
    for (size_t l = 0; l < layers; ++l) {
      size_t bad = 0;
      for (size_t i = 0; i < out[l].size(); ++i) {
        bad += out[l][i] != ToHalf(ref[l].w[i], layout.weight16_dtype);
      }
      EXPECT_EQ(bad, 0u) << "16-bit weights of layer " << l;
    }
    return *report;
  }

  void CheckWeights(JobPipeline& p, const ModelLayout& layout,
                    const std::vector<RefLayer>& ref) {
    for (size_t l = 0; l < ref.size(); ++l) {
      std::vector<float> w(layout.layer_elements[l]);
      ASSERT_TRUE(p.ReadWeights(l, w.data()).ok());
      size_t bad = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        bad += std::memcmp(&w[i], &ref[l].w[i], 4) != 0;
      }
      EXPECT_EQ(bad, 0u) << "fp32 weights of layer " << l;
    }
  }

  // ReadState gives the reference's moments bit for bit (the reference
  // keeps them rounded to bf16 when the layout does).
  void CheckStates(JobPipeline& p, const ModelLayout& layout,
                   const std::vector<RefLayer>& ref) {
    for (size_t l = 0; l < ref.size(); ++l) {
      const std::pair<StatePart, const std::vector<float>*> parts[] = {
          {StatePart::kExpAvg, &ref[l].m},
          {StatePart::kExpAvgSq, &ref[l].v},
          {StatePart::kMaxExpAvgSq, &ref[l].vmax}};
      for (const auto& [part, expected] : parts) {
        std::vector<float> got(layout.layer_elements[l], -1.0f);
        absl::Status read = p.ReadState(l, part, got.data());
        if (part == StatePart::kMaxExpAvgSq && !layout.adam.amsgrad) {
          EXPECT_EQ(read.code(), absl::StatusCode::kInvalidArgument) << read;
          continue;
        }
        ASSERT_TRUE(read.ok()) << read;
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          bad += std::memcmp(&got[i], &(*expected)[i], 4) != 0;
        }
        EXPECT_EQ(bad, 0u) << "moment " << static_cast<int>(part)
                           << " of layer " << l;
      }
    }
  }

  TempDir dir_;
  std::vector<FaultInjectionDevice*> faults_;
  std::optional<AdamUpdater> updater_;
  std::unique_ptr<TensorStore> store_;
};

struct Variant {
  Schedule schedule;
  DType grad_dtype;
  DType moment_dtype;
  bool amsgrad;
};

class JobPipelineVariantTest : public JobPipelineTest,
                               public ::testing::WithParamInterface<Variant> {};

TEST_P(JobPipelineVariantTest, MatchesReferenceAdamWExactly) {
  ModelLayout layout = Layout(GetParam().grad_dtype);
  layout.moment_dtype = GetParam().moment_dtype;
  layout.adam.amsgrad = GetParam().amsgrad;
  auto p = OpenJob("job", layout, GetParam().schedule);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->state_layout().total_chunks(), 3u + 1 + 1 + 5);
  std::vector<RefLayer> ref = Initialize(*p, layout);
  int64_t step = 0;
  for (uint32_t it = 0; it < 3; ++it) {
    IterationReport r = RunAndCheck(*p, layout, ref, step, 100 + it);
    EXPECT_FALSE(r.clipped);
    EXPECT_FALSE(r.skipped);
  }
  // The moments as the reference computed them (fp32, or bf16 widened).
  CheckStates(*p, layout, ref);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, JobPipelineVariantTest,
    ::testing::Values(
        Variant{Schedule::kPipelined, DType::kFloat32, DType::kFloat32, false},
        Variant{Schedule::kPipelined, DType::kBFloat16, DType::kFloat32, false},
        Variant{Schedule::kPipelined, DType::kFloat16, DType::kBFloat16, true},
        Variant{Schedule::kSerialized, DType::kBFloat16, DType::kFloat32,
                false},
        Variant{Schedule::kAfterBackward, DType::kBFloat16, DType::kFloat32,
                false}));

TEST_F(JobPipelineTest, AllSchedulesGiveIdenticalStates) {
  const ModelLayout layout = Layout(DType::kBFloat16);
  const Schedule schedules[] = {Schedule::kPipelined, Schedule::kSerialized,
                                Schedule::kAfterBackward};
  std::vector<std::vector<float>> weights[3];
  for (int s = 0; s < 3; ++s) {
    auto p = OpenJob("job" + std::to_string(s), layout, schedules[s]);
    ASSERT_NE(p, nullptr);
    std::vector<RefLayer> ref = Initialize(*p, layout);
    int64_t step = 0;
    ClipOptions clip;
    clip.max_grad_norm = 1.0;  // Triggers: the norm is about 2.8.
    for (uint32_t it = 0; it < 2; ++it) {
      EXPECT_TRUE(RunAndCheck(*p, layout, ref, step, 300 + it, clip).clipped);
    }
    for (size_t l = 0; l < ref.size(); ++l) {
      weights[s].emplace_back(layout.layer_elements[l]);
      ASSERT_TRUE(p->ReadWeights(l, weights[s].back().data()).ok());
    }
  }
  for (int s = 1; s < 3; ++s) {
    for (size_t l = 0; l < weights[0].size(); ++l) {
      EXPECT_EQ(0, std::memcmp(weights[0][l].data(), weights[s][l].data(),
                               weights[0][l].size() * 4))
          << "schedule " << s << " layer " << l;
    }
  }
}

TEST_F(JobPipelineTest, ClipsOnlyWhenTheNormExceedsTheMaximum) {
  const ModelLayout layout = Layout(DType::kFloat32);
  auto p = OpenJob("job", layout, Schedule::kPipelined);
  ASSERT_NE(p, nullptr);
  std::vector<RefLayer> ref = Initialize(*p, layout);
  int64_t step = 0;
  ClipOptions loose;
  loose.max_grad_norm = 100.0;
  IterationReport r = RunAndCheck(*p, layout, ref, step, 1, loose);
  EXPECT_FALSE(r.clipped);
  EXPECT_EQ(r.clip_scale, 1.0);
  EXPECT_EQ(r.redo_seconds, 0.0);
  ClipOptions tight;
  tight.max_grad_norm = r.global_norm / 4;
  r = RunAndCheck(*p, layout, ref, step, 2, tight);
  EXPECT_TRUE(r.clipped);
  EXPECT_NEAR(r.clip_scale, tight.max_grad_norm / (r.global_norm + 1e-6),
              1e-15);
  EXPECT_LT(r.clip_scale, 0.3);
  EXPECT_GT(r.busy.compute, 0.0);
  r = RunAndCheck(*p, layout, ref, step, 3, loose);
  EXPECT_FALSE(r.clipped);
  EXPECT_EQ(step, 3);
}

TEST_F(JobPipelineTest, NonFiniteGradientSkipsTheIteration) {
  const ModelLayout layout = Layout(DType::kBFloat16);
  auto p = OpenJob("job", layout, Schedule::kPipelined);
  ASSERT_NE(p, nullptr);
  std::vector<RefLayer> ref = Initialize(*p, layout);
  int64_t step = 0;
  RunAndCheck(*p, layout, ref, step, 1);
  ClipOptions clip;
  clip.max_grad_norm = 1.0;
  // RunAndCheck verifies: weights unchanged, step not advanced, and every
  // 16-bit output (pre-filled with junk) re-published from the committed
  // weights.
  IterationReport r = RunAndCheck(*p, layout, ref, step, 2, clip, 3);
  EXPECT_TRUE(r.skipped);
  EXPECT_FALSE(r.clipped);
  EXPECT_EQ(r.iteration, 1u);
  RunAndCheck(*p, layout, ref, step, 3);
  EXPECT_EQ(step, 2);
}

TEST_F(JobPipelineTest, AbortedIterationLeavesNoTrace) {
  for (Schedule schedule : {Schedule::kPipelined, Schedule::kAfterBackward}) {
    SCOPED_TRACE(static_cast<int>(schedule));
    const std::string job = absl::StrCat("job", static_cast<int>(schedule));
    const ModelLayout layout = Layout(DType::kBFloat16);
    auto p = OpenJob(job, layout, schedule);
    ASSERT_NE(p, nullptr);
    std::vector<RefLayer> ref = Initialize(*p, layout);
    int64_t step = 0;
    RunAndCheck(*p, layout, ref, step, 1);
    const size_t tensors = store_->List(job).size();
    // Backward fails half-way: two of the layers were handed over (and, in
    // the pipelined schedule, updated) when the client gives up.
    EXPECT_EQ(p->AbortIteration().code(),
              absl::StatusCode::kFailedPrecondition);  // none in progress
    ASSERT_TRUE(p->BeginIteration().ok());
    std::mt19937 rng(99);
    const size_t layers = layout.layer_elements.size();
    std::vector<Grad> grads;
    std::vector<std::vector<uint16_t>> out(layers);
    for (size_t l = 0; l < layers; ++l) {
      grads.push_back(
          MakeGrad(layout.layer_elements[l], layout.grad_dtype, rng, 0.1f));
      out[l].assign(layout.layer_elements[l], 0);
    }
    for (size_t l : {layers - 1, layers - 2}) {
      ASSERT_TRUE(
          p->SubmitGradients(l, grads[l].bytes.data(), out[l].data()).ok());
    }
    ASSERT_TRUE(p->AbortIteration().ok());
    EXPECT_EQ(p->iteration(), 1u);
    CheckWeights(*p, layout, ref);  // the committed weights, untouched
    CheckStates(*p, layout, ref);
    EXPECT_EQ(store_->List(job).size(), tensors);  // no scratch, no extras
    EXPECT_EQ(
        p->SubmitGradients(0, grads[0].bytes.data(), out[0].data()).code(),
        absl::StatusCode::kFailedPrecondition);
    // The next iteration is step 2, as if the aborted one never began.
    RunAndCheck(*p, layout, ref, step, 2);
    EXPECT_EQ(step, 2);
  }
}

TEST_F(JobPipelineTest, ReopenResumesAtTheCommittedStep) {
  const ModelLayout layout = Layout(DType::kBFloat16);
  std::vector<RefLayer> ref;
  int64_t step = 0;
  {
    auto p = OpenJob("job", layout, Schedule::kPipelined);
    ASSERT_NE(p, nullptr);
    ref = Initialize(*p, layout);
    RunAndCheck(*p, layout, ref, step, 1);
    RunAndCheck(*p, layout, ref, step, 2);
  }
  store_.reset();
  OpenStore();
  auto p = OpenJob("job", layout, Schedule::kSerialized);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->iteration(), 2u);
  for (size_t l = 0; l < ref.size(); ++l) EXPECT_TRUE(p->layer_initialized(l));
  CheckWeights(*p, layout, ref);
  // Bias correction at step 3 (the reference checks it bit for bit).
  RunAndCheck(*p, layout, ref, step, 3);
  EXPECT_EQ(p->iteration(), 3u);
}

TEST_F(JobPipelineTest, CrashMidIterationLeavesTheLastCommittedIteration) {
  const ModelLayout layout = Layout(DType::kBFloat16);
  std::vector<RefLayer> ref;
  int64_t step = 0;
  std::mt19937 rng(9);
  std::vector<Grad> grads;
  std::vector<std::vector<uint16_t>> out(4);
  for (size_t l = 0; l < 4; ++l) {
    grads.push_back(
        MakeGrad(layout.layer_elements[l], layout.grad_dtype, rng, 0.1f));
    out[l].resize(layout.layer_elements[l]);
  }
  {
    auto p = OpenJob("job", layout, Schedule::kPipelined);
    ASSERT_NE(p, nullptr);
    ref = Initialize(*p, layout);
    RunAndCheck(*p, layout, ref, step, 1);
    ASSERT_TRUE(p->BeginIteration().ok());
    for (size_t l : {3, 2, 1}) {
      ASSERT_TRUE(
          p->SubmitGradients(l, grads[l].bytes.data(), out[l].data()).ok());
    }
    // Destroyed with the iteration in flight: must not hang.
  }
  // Same store, new pipeline: pending versions rolled back.
  {
    auto p = OpenJob("job", layout, Schedule::kPipelined);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->iteration(), 1u);
    CheckWeights(*p, layout, ref);
    ASSERT_TRUE(p->BeginIteration().ok());
    for (size_t l : {3, 2}) {
      ASSERT_TRUE(
          p->SubmitGradients(l, grads[l].bytes.data(), out[l].data()).ok());
    }
  }
  // Simulated crash: the store reopens from its catalog.
  store_.reset();
  OpenStore();
  for (const std::string& name : store_->List("job")) {
    EXPECT_EQ(store_->Stat("job", name)->pending_version, 0u) << name;
  }
  auto p = OpenJob("job", layout, Schedule::kAfterBackward);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->iteration(), 1u);
  CheckWeights(*p, layout, ref);
  RunAndCheck(*p, layout, ref, step, 2);
  EXPECT_EQ(p->iteration(), 2u);
}

TEST_F(JobPipelineTest,
       DestroyedWithWorkQueuedReturnsPromptlyAndLeavesNoPending) {
  ModelLayout layout;
  layout.layer_elements = {60000, 60000};
  layout.chunk_elements = 500;  // 240 chunks through one buffer.
  layout.grad_dtype = DType::kFloat32;
  std::vector<float> w(60000, 1.0f), g(60000, 0.01f);
  std::vector<uint16_t> out(60000);
  PipelineOptions options;
  options.schedule = Schedule::kSerialized;
  for (int round = 0; round < 3; ++round) {
    auto p = JobPipeline::Open(store_.get(), *updater_, "big", layout, options);
    ASSERT_TRUE(p.ok()) << p.status();
    if (round == 0) {
      ASSERT_TRUE((*p)->InitializeWeights(0, w.data()).ok());
      ASSERT_TRUE((*p)->InitializeWeights(1, w.data()).ok());
    }
    ASSERT_TRUE((*p)->BeginIteration().ok());
    ASSERT_TRUE((*p)->SubmitGradients(1, g.data(), out.data()).ok());
    ASSERT_TRUE((*p)->SubmitGradients(0, g.data(), out.data()).ok());
    p->reset();  // With most chunks still queued.
    for (const std::string& name : store_->List("big")) {
      EXPECT_EQ(store_->Stat("big", name)->pending_version, 0u) << name;
    }
  }
  auto p = JobPipeline::Open(store_.get(), *updater_, "big", layout, options);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->iteration(), 0u);
  std::vector<float> back(60000);
  ASSERT_TRUE((*p)->ReadWeights(1, back.data()).ok());
  EXPECT_EQ(back, w);
}

TEST_F(JobPipelineTest, RejectsBadCallsWithoutCrashing) {
  const ModelLayout layout = Layout(DType::kBFloat16);
  auto p = OpenJob("job", layout, Schedule::kPipelined);
  ASSERT_NE(p, nullptr);
  std::vector<float> w(4097, 0.5f);
  std::vector<uint16_t> g(4097, 0), out(4097);
  EXPECT_EQ(p->BeginIteration().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p->ReadWeights(0, w.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p->InitializeWeights(4, w.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p->InitializeWeights(0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  for (size_t l = 0; l < 4; ++l)
    ASSERT_TRUE(p->InitializeWeights(l, w.data()).ok());
  EXPECT_EQ(p->InitializeWeights(1, w.data()).code(),
            absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(p->SubmitGradients(0, g.data(), out.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p->EndIteration().status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (double bad : {-1.0, std::nan(""), HUGE_VAL}) {
    EXPECT_EQ(
        p->BeginIteration(1.0f, std::nullopt, ClipOptions{.max_grad_norm = bad})
            .code(),
        absl::StatusCode::kInvalidArgument)
        << bad;
  }
  ASSERT_TRUE(p->BeginIteration().ok());
  EXPECT_EQ(p->BeginIteration().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p->InitializeWeights(0, w.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p->SubmitGradients(4, g.data(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p->SubmitGradients(1, nullptr, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(p->SubmitGradients(1, g.data(), out.data()).ok());
  EXPECT_EQ(p->SubmitGradients(1, g.data(), out.data()).code(),
            absl::StatusCode::kAlreadyExists);
  // Layers 0, 2, 3 never submitted: the iteration fails and rolls back.
  auto r = p->EndIteration();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
      << r.status();
  EXPECT_EQ(p->iteration(), 0u);
  for (const std::string& name : store_->List("job")) {
    EXPECT_EQ(store_->Stat("job", name)->pending_version, 0u) << name;
  }
  std::vector<float> back(1000);
  ASSERT_TRUE(p->ReadWeights(1, back.data()).ok());
  EXPECT_EQ(back, std::vector<float>(1000, 0.5f));
  // The pipeline is usable again.
  ASSERT_TRUE(p->BeginIteration().ok());
  for (size_t l = 0; l < 4; ++l) {
    ASSERT_TRUE(p->SubmitGradients(l, g.data(), nullptr).ok());
  }
  auto ok = p->EndIteration();
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->iteration, 1u);
  EXPECT_EQ(ok->global_norm, 0.0);
  p.reset();

  // Reopening with another layout is refused; bad layouts and options too.
  ModelLayout other = layout;
  other.chunk_elements = 512;
  PipelineOptions options;
  EXPECT_EQ(JobPipeline::Open(store_.get(), *updater_, "job", other, options)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  other = layout;
  other.layer_elements[2] = 0;
  EXPECT_EQ(JobPipeline::Open(store_.get(), *updater_, "new", other, options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  other = layout;
  other.weight16_dtype = DType::kFloat32;
  EXPECT_EQ(JobPipeline::Open(store_.get(), *updater_, "new", other, options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(JobPipeline::Open(nullptr, *updater_, "new", layout, options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  options.buffers = 0;
  EXPECT_EQ(JobPipeline::Open(store_.get(), *updater_, "new", layout, options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JobPipelineTest, StoreErrorsFailTheIterationAndNameTheTensor) {
  OpenStoreWithFaults();
  const ModelLayout layout = Layout(DType::kBFloat16);
  auto p = OpenJob("job", layout, Schedule::kPipelined);
  ASSERT_NE(p, nullptr);
  std::vector<RefLayer> ref = Initialize(*p, layout);
  int64_t step = 0;
  RunAndCheck(*p, layout, ref, step, 1);
  std::vector<std::vector<uint16_t>> g(4), out(4);
  for (size_t l = 0; l < 4; ++l) {
    g[l].assign(layout.layer_elements[l], 0x3f80);  // bf16 1.0
    out[l].resize(layout.layer_elements[l]);
  }
  using Fault = FaultInjectionDevice::Fault;
  for (IoRequest::Op op : {IoRequest::Op::kRead, IoRequest::Op::kWrite}) {
    faults_[0]->Inject({Fault::kEio, op, 1});
    ASSERT_TRUE(p->BeginIteration().ok());
    for (size_t l = 0; l < 4; ++l) {
      ASSERT_TRUE(p->SubmitGradients(l, g[l].data(), out[l].data()).ok());
    }
    auto r = p->EndIteration();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find("job/layer."), std::string::npos)
        << r.status();
    EXPECT_NE(r.status().message().find("chunk"), std::string::npos);
    EXPECT_EQ(p->iteration(), 1u);
    for (const std::string& name : store_->List("job")) {
      EXPECT_EQ(store_->Stat("job", name)->pending_version, 0u) << name;
    }
    CheckWeights(*p, layout, ref);
  }
  // Usable afterwards, and still exact.
  RunAndCheck(*p, layout, ref, step, 2);
}

TEST_F(JobPipelineTest, WorksWithAWorkerPoolAndOneBuffer) {
  auto pool = WorkerPool::Create(WorkerPoolOptions{2, false});
  ASSERT_TRUE(pool.ok());
  auto updater = AdamUpdater::Create(pool->get(), std::nullopt);
  ASSERT_TRUE(updater.ok());
  updater_.emplace(*updater);
  ModelLayout layout = Layout(DType::kFloat16);
  layout.weight16_dtype = DType::kFloat16;
  PipelineOptions options;
  options.buffers = 1;
  auto p = JobPipeline::Open(store_.get(), *updater_, "job", layout, options);
  ASSERT_TRUE(p.ok()) << p.status();
  std::vector<RefLayer> ref = Initialize(**p, layout);
  int64_t step = 0;
  RunAndCheck(**p, layout, ref, step, 1);
  RunAndCheck(**p, layout, ref, step, 2);
  p->reset();
}

// ------------------------------------------------------------ streamed

// The tensors of `job` whose names start with the scratch prefix.
std::vector<std::string> ScratchTensors(const TensorStore& store,
                                        const std::string& job) {
  std::vector<std::string> scratch;
  for (const std::string& name : store.List(job)) {
    if (name.rfind(StateLayout::kScratchPrefix, 0) == 0) {
      scratch.push_back(name);
    }
  }
  return scratch;
}

struct StepInput {
  uint32_t seed = 1;
  float grad_scale = 1.0f;
  double lr = 0.0;
  int nan_layer = -1;
};

struct StepResult {
  IterationReport report;
  std::vector<std::vector<float>> weights;      // Committed fp32, per layer.
  std::vector<std::vector<uint16_t>> weight16;  // The 16-bit copies.
};

// One iteration the way a client with one buffer per layer (resident) or a
// single reused gradient buffer (streamed) would drive it; the 16-bit copies
// come from the caller's buffers or, streamed, from ReadWeight16.
StepResult Step(JobPipeline& p, const ModelLayout& layout,
                const PipelineOptions& options, const StepInput& in,
                const ClipOptions& clip,
                std::vector<std::vector<uint16_t>>& out) {
  std::mt19937 rng(in.seed);
  const size_t layers = layout.layer_elements.size();
  std::vector<Grad> grads;
  size_t largest = 0;
  for (size_t l = 0; l < layers; ++l) {
    grads.push_back(
        MakeGrad(layout.layer_elements[l], layout.grad_dtype, rng, 0.1f));
    largest = std::max(largest, grads.back().bytes.size());
  }
  if (in.nan_layer >= 0) {
    // 0xffff is a NaN in bf16 and fp16, and half of an fp32 NaN's bytes.
    grads[in.nan_layer].bytes[6] = 0xff;
    grads[in.nan_layer].bytes[7] = 0xff;
  }
  StepResult result;
  EXPECT_TRUE(
      p.BeginIteration(in.grad_scale,
                       in.lr > 0 ? std::optional<double>(in.lr) : std::nullopt,
                       clip)
          .ok());
  std::vector<uint8_t> slot(largest);
  for (size_t i = 0; i < layers; ++i) {
    const size_t l = layers - 1 - i;
    void* weight16_out = options.stream_weight16 ? nullptr : out[l].data();
    if (options.stream_gradients) {
      std::memcpy(slot.data(), grads[l].bytes.data(), grads[l].bytes.size());
      EXPECT_TRUE(p.SubmitGradients(l, slot.data(), weight16_out).ok());
      // The buffer is the client's again: the pipeline must not look.
      std::fill(slot.begin(), slot.end(), 0x7f);
    } else {
      EXPECT_TRUE(
          p.SubmitGradients(l, grads[l].bytes.data(), weight16_out).ok());
    }
  }
  absl::StatusOr<IterationReport> report = p.EndIteration();
  EXPECT_TRUE(report.ok()) << report.status();
  if (report.ok()) result.report = *report;
  for (size_t l = 0; l < layers; ++l) {
    result.weights.emplace_back(layout.layer_elements[l]);
    EXPECT_TRUE(p.ReadWeights(l, result.weights.back().data()).ok());
    if (options.stream_weight16) {
      result.weight16.emplace_back(layout.layer_elements[l]);
      EXPECT_TRUE(p.ReadWeight16(l, result.weight16.back().data()).ok());
    } else {
      result.weight16.push_back(out[l]);
    }
  }
  return result;
}

struct StreamVariant {
  Schedule schedule;
  DType grad_dtype;
  DType weight16_dtype;
  bool stream_gradients;
  bool stream_weight16;
};

class StreamedPipelineTest
    : public JobPipelineTest,
      public ::testing::WithParamInterface<StreamVariant> {};

TEST_P(StreamedPipelineTest, BitIdenticalToResident) {
  const StreamVariant v = GetParam();
  ModelLayout layout = Layout(v.grad_dtype);
  layout.weight16_dtype = v.weight16_dtype;
  PipelineOptions resident;
  resident.schedule = v.schedule;
  resident.buffers = 3;
  PipelineOptions streamed = resident;
  streamed.stream_gradients = v.stream_gradients;
  streamed.stream_weight16 = v.stream_weight16;
  auto r =
      JobPipeline::Open(store_.get(), *updater_, "resident", layout, resident);
  ASSERT_TRUE(r.ok()) << r.status();
  auto s =
      JobPipeline::Open(store_.get(), *updater_, "streamed", layout, streamed);
  ASSERT_TRUE(s.ok()) << s.status();
  Initialize(**r, layout);
  Initialize(**s, layout);
  const size_t layers = layout.layer_elements.size();
  std::vector<std::vector<uint16_t>> out_r(layers), out_s(layers);
  for (size_t l = 0; l < layers; ++l) {
    out_r[l].assign(layout.layer_elements[l], 0xdead);
    out_s[l].assign(layout.layer_elements[l], 0xbeef);
  }
  // Plain; clipped (redo) with a loss scale; a schedule's lr; a non-finite
  // gradient (skipped); plain again.
  ClipOptions clip;
  clip.max_grad_norm = 1.0;  // The norm is about 2.8 at grad_scale 1.
  const StepInput inputs[] = {
      {.seed = 11, .grad_scale = 0.25f},
      {.seed = 12, .grad_scale = 1.0f},
      {.seed = 13, .grad_scale = 0.5f, .lr = 3e-3},
      {.seed = 14, .nan_layer = 1},
      {.seed = 15, .grad_scale = 0.125f, .lr = 2e-2},
  };
  StepResult before_skip;
  for (size_t it = 0; it < std::size(inputs); ++it) {
    StepResult a = Step(**r, layout, resident, inputs[it], clip, out_r);
    StepResult b = Step(**s, layout, streamed, inputs[it], clip, out_s);
    EXPECT_EQ(a.report.iteration, b.report.iteration) << it;
    // Bitwise: a skipped iteration's norm is a NaN.
    EXPECT_EQ(0, std::memcmp(&a.report.global_norm, &b.report.global_norm,
                             sizeof(double)))
        << it << ": " << a.report.global_norm << " vs " << b.report.global_norm;
    EXPECT_EQ(a.report.nonfinite, b.report.nonfinite) << it;
    EXPECT_EQ(a.report.clipped, b.report.clipped) << it;
    EXPECT_EQ(a.report.clip_scale, b.report.clip_scale) << it;
    EXPECT_EQ(a.report.skipped, b.report.skipped) << it;
    for (size_t l = 0; l < layers; ++l) {
      EXPECT_EQ(0, std::memcmp(a.weights[l].data(), b.weights[l].data(),
                               a.weights[l].size() * 4))
          << "iteration " << it << " layer " << l;
      EXPECT_EQ(a.weight16[l], b.weight16[l])
          << "iteration " << it << " layer " << l;
      for (size_t i = 0; i < a.weights[l].size(); ++i) {
        ASSERT_EQ(b.weight16[l][i],
                  ToHalf(b.weights[l][i], layout.weight16_dtype))
            << it << "/" << l << "/" << i;
      }
    }
    if (it == 1) {
      EXPECT_TRUE(b.report.clipped);
    }
    if (it == 3) {
      // Skipped: committed weights and their 16-bit copies as they were.
      EXPECT_TRUE(b.report.skipped);
      EXPECT_EQ(b.report.iteration, 3u);
      for (size_t l = 0; l < layers; ++l) {
        EXPECT_EQ(b.weights[l], before_skip.weights[l]);
        EXPECT_EQ(b.weight16[l], before_skip.weight16[l]);
      }
    }
    if (v.stream_gradients) {
      EXPECT_GT(b.report.busy.grad_store, 0.0);
      EXPECT_GT(b.report.busy.bytes_written, a.report.busy.bytes_written);
    }
    before_skip = b;
    EXPECT_TRUE(ScratchTensors(*store_, "streamed").empty()) << it;
    for (const std::string& name : store_->List("streamed")) {
      EXPECT_EQ(store_->Stat("streamed", name)->pending_version, 0u) << name;
    }
  }
  EXPECT_EQ((*s)->iteration(), 4u);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, StreamedPipelineTest,
    ::testing::Values(StreamVariant{Schedule::kPipelined, DType::kBFloat16,
                                    DType::kBFloat16, true, true},
                      StreamVariant{Schedule::kPipelined, DType::kFloat32,
                                    DType::kBFloat16, true, false},
                      StreamVariant{Schedule::kSerialized, DType::kFloat16,
                                    DType::kFloat16, false, true},
                      StreamVariant{Schedule::kAfterBackward, DType::kBFloat16,
                                    DType::kBFloat16, true, true}));

// ------------------------------------------------------------ no weight decay

struct NoDecayVariant {
  Schedule schedule;
  DType grad_dtype;
  DType moment_dtype;
  bool amsgrad;
  bool adamw;  // false: Adam, weight decay as an L2 term in the gradient
  bool stream_gradients;
  bool stream_weight16;
};

class ElementGroupTest : public JobPipelineTest,
                         public ::testing::WithParamInterface<NoDecayVariant> {
};

// SmallLayout's layers {2500, 1000, 37, 4097} in chunks of 1000, with
// no_weight_decay ranges (given out of order) at a layer's first and last
// elements, inside a chunk, across chunk boundaries, touching each other,
// ending at a chunk boundary, covering a chunk exactly and a whole layer.
std::vector<LayerRange> ExemptRanges() {
  return {{3, 4090, 4097}, {0, 2000, 2500}, {0, 0, 7},       {0, 130, 517},
          {0, 1010, 1013}, {0, 990, 1010},  {0, 1999, 2000}, {1, 0, 1000},
          {2, 36, 37},     {2, 5, 6},       {3, 1000, 2000}, {3, 2500, 4001},
          {3, 17, 18}};
}

// A param group with half the lr and its own weight decay, next to the
// exempt ranges (touching them: pieces of different groups never merge),
// covering a chunk exactly and ending at a layer's last exempt range.
std::vector<LayerRange> ScaledRanges() {
  return {{0, 7, 130}, {0, 1013, 1500}, {2, 0, 5},
          {2, 6, 36},  {3, 2000, 2500}, {3, 4001, 4090}};
}

TEST_P(ElementGroupTest, GroupedElementsMatchReferenceWithTheirOptions) {
  const NoDecayVariant v = GetParam();
  ModelLayout layout = Layout(v.grad_dtype);
  layout.moment_dtype = v.moment_dtype;
  layout.adam.amsgrad = v.amsgrad;
  layout.adam.decoupled_weight_decay = v.adamw;
  layout.adam.weight_decay = 0.1;
  ASSERT_TRUE(
      AddElementGroup(NoWeightDecayGroup(), ExemptRanges(), layout).ok());
  ASSERT_TRUE(
      AddElementGroup(ElementGroup{"scaled", 0.5, 0.3}, ScaledRanges(), layout)
          .ok());
  ASSERT_TRUE(ValidateLayout(layout).ok());
  const size_t layers = layout.layer_elements.size();
  // Per element: its group (-1: none); and how many are in one.
  std::vector<std::vector<int>> exempt(layers);
  size_t exempt_count = 0;
  for (size_t l = 0; l < layers; ++l) {
    exempt[l].assign(layout.layer_elements[l], -1);
    for (const GroupRange& r : layout.group_ranges[l]) {
      for (uint64_t i = r.begin; i < r.end; ++i) exempt[l][i] = r.group;
      exempt_count += r.end - r.begin;
    }
  }
  PipelineOptions options;
  options.schedule = v.schedule;
  options.buffers = 3;
  options.stream_gradients = v.stream_gradients;
  options.stream_weight16 = v.stream_weight16;
  auto opened =
      JobPipeline::Open(store_.get(), *updater_, "job", layout, options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<JobPipeline> p = *std::move(opened);
  std::vector<RefLayer> ref = Initialize(*p, layout);
  // Every element decayed: what the exempt ones must not be.
  std::vector<RefLayer> decayed = ref;
  int64_t ref_step = 0;
  std::vector<std::vector<uint16_t>> out(layers);
  for (size_t l = 0; l < layers; ++l) {
    out[l].assign(layout.layer_elements[l], 0xdead);
  }

  // One iteration through `pipeline` checked against the reference with
  // `mask` (null: every element decayed).
  auto run = [&](JobPipeline& pipeline, const PipelineOptions& opts,
                 const StepInput& in, const ClipOptions& clip,
                 const std::vector<std::vector<int>>* mask) {
    StepResult r = Step(pipeline, layout, opts, in, clip, out);
    std::mt19937 rng(in.seed);  // Step's gradients, regenerated.
    std::vector<Grad> grads;
    double sum = 0.0;
    for (size_t l = 0; l < layers; ++l) {
      grads.push_back(
          MakeGrad(layout.layer_elements[l], layout.grad_dtype, rng, 0.1f));
      for (float x : grads.back().values) {
        const double g = x * in.grad_scale;
        sum += g * g;
      }
    }
    if (in.nan_layer >= 0) {
      EXPECT_TRUE(r.report.skipped);
    } else {
      EXPECT_NEAR(r.report.global_norm, std::sqrt(sum), 1e-12 * std::sqrt(sum));
      EXPECT_FALSE(r.report.skipped);
      const float inv_scale =
          r.report.clipped
              ? static_cast<float>(r.report.clip_scale * in.grad_scale)
              : in.grad_scale;
      AdamOptions adam = layout.adam;
      if (in.lr > 0) adam.lr = in.lr;
      for (size_t l = 0; l < layers; ++l) {
        RefAdamStep(adam, layout.moment_dtype, ref_step, grads[l].values,
                    inv_scale, ref[l], mask == nullptr ? nullptr : &(*mask)[l],
                    &layout.groups);
        RefAdamStep(adam, layout.moment_dtype, ref_step, grads[l].values,
                    inv_scale, decayed[l]);
      }
      ++ref_step;
    }
    EXPECT_EQ(r.report.iteration, static_cast<uint64_t>(ref_step));
    for (size_t l = 0; l < layers; ++l) {
      size_t bad = 0, bad16 = 0;
      for (size_t i = 0; i < ref[l].w.size(); ++i) {
        bad += std::memcmp(&r.weights[l][i], &ref[l].w[i], 4) != 0;
        bad16 += r.weight16[l][i] != ToHalf(ref[l].w[i], layout.weight16_dtype);
      }
      EXPECT_EQ(bad, 0u) << "fp32 weights of layer " << l << ", seed "
                         << in.seed;
      EXPECT_EQ(bad16, 0u) << "16-bit weights of layer " << l << ", seed "
                           << in.seed;
    }
    CheckStates(pipeline, layout, ref);
    return r.report;
  };

  ClipOptions clip;
  clip.max_grad_norm = 1.0;  // The norm is about 8.7 at grad_scale 1.
  EXPECT_FALSE(
      run(*p, options, {.seed = 21, .grad_scale = 0.0625f}, clip, &exempt)
          .clipped);
  EXPECT_TRUE(run(*p, options, {.seed = 22}, clip, &exempt).clipped);
  EXPECT_TRUE(run(*p, options, {.seed = 23, .grad_scale = 0.5f, .lr = 3e-3},
                  clip, &exempt)
                  .clipped);
  EXPECT_TRUE(
      run(*p, options, {.seed = 24, .nan_layer = 3}, clip, &exempt).skipped);
  run(*p, options, {.seed = 25, .grad_scale = 0.125f, .lr = 2e-2}, clip,
      &exempt);
  EXPECT_EQ(p->iteration(), 4u);

  // The test tells the two apart: elements outside the ranges are exactly
  // the all-decayed reference's, (nearly) every exempt one differs.
  size_t differ = 0;
  for (size_t l = 0; l < layers; ++l) {
    for (size_t i = 0; i < ref[l].w.size(); ++i) {
      const bool same = std::memcmp(&ref[l].w[i], &decayed[l].w[i], 4) == 0;
      if (exempt[l][i] < 0) {
        ASSERT_TRUE(same) << l << "/" << i;
      } else {
        differ += !same;
      }
    }
  }
  EXPECT_GT(differ, exempt_count * 9 / 10) << "of " << exempt_count;

  // The ranges are not part of the layout's fingerprint: the job reopens
  // without them, and then decays every element.
  p.reset();
  ModelLayout plain = layout;
  plain.groups.clear();
  plain.group_ranges.clear();
  opened = JobPipeline::Open(store_.get(), *updater_, "job", plain, options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  p = *std::move(opened);
  EXPECT_EQ(p->iteration(), 4u);
  decayed = ref;
  run(*p, options, {.seed = 26, .grad_scale = 0.25f}, clip, nullptr);
  for (size_t l = 0; l < layers; ++l) {
    EXPECT_EQ(0, std::memcmp(ref[l].w.data(), decayed[l].w.data(),
                             ref[l].w.size() * 4));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ElementGroupTest,
    ::testing::Values(
        // AdamW, resident, each schedule.
        NoDecayVariant{Schedule::kPipelined, DType::kBFloat16, DType::kFloat32,
                       false, true, false, false},
        NoDecayVariant{Schedule::kSerialized, DType::kFloat32, DType::kFloat32,
                       false, true, false, false},
        NoDecayVariant{Schedule::kAfterBackward, DType::kFloat16,
                       DType::kBFloat16, true, true, false, false},
        // Adam with L2 decay.
        NoDecayVariant{Schedule::kPipelined, DType::kBFloat16, DType::kFloat32,
                       false, false, false, false},
        NoDecayVariant{Schedule::kAfterBackward, DType::kFloat32,
                       DType::kBFloat16, true, false, true, false},
        // Streamed gradients and 16-bit weights.
        NoDecayVariant{Schedule::kPipelined, DType::kBFloat16, DType::kFloat32,
                       false, true, true, true},
        NoDecayVariant{Schedule::kSerialized, DType::kFloat16, DType::kFloat32,
                       true, false, false, true}));

TEST_F(JobPipelineTest, ScratchGradientsNeverOutliveTheirIteration) {
  const ModelLayout layout = Layout(DType::kBFloat16);
  PipelineOptions options;
  options.stream_gradients = true;
  options.stream_weight16 = true;
  std::vector<uint16_t> g(4097, 0x3c00);  // bf16 ~0.0078
  std::vector<float> w0;
  {
    auto p = JobPipeline::Open(store_.get(), *updater_, "job", layout, options);
    ASSERT_TRUE(p.ok()) << p.status();
    Initialize(**p, layout);
    w0.resize(2500);
    ASSERT_TRUE((*p)->ReadWeights(0, w0.data()).ok());
    // A failed iteration (layers never submitted): scratch dropped.
    ASSERT_TRUE((*p)->BeginIteration().ok());
    ASSERT_TRUE((*p)->SubmitGradients(3, g.data(), nullptr).ok());
    ASSERT_TRUE((*p)->SubmitGradients(0, g.data(), nullptr).ok());
    EXPECT_EQ(ScratchTensors(*store_, "job").size(), 5u + 3);
    EXPECT_EQ((*p)->EndIteration().status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(ScratchTensors(*store_, "job").empty());
    EXPECT_EQ((*p)->iteration(), 0u);
    // An abandoned one (the pipeline goes with the iteration in flight).
    ASSERT_TRUE((*p)->BeginIteration().ok());
    ASSERT_TRUE((*p)->SubmitGradients(2, g.data(), nullptr).ok());
    ASSERT_TRUE((*p)->SubmitGradients(1, g.data(), nullptr).ok());
    EXPECT_EQ(ScratchTensors(*store_, "job").size(), 2u);
  }
  EXPECT_TRUE(ScratchTensors(*store_, "job").empty());
  for (const std::string& name : store_->List("job")) {
    EXPECT_EQ(store_->Stat("job", name)->pending_version, 0u) << name;
  }
  // One left by a crash: the store comes back with it (uncommitted), and
  // the daemon's sweep or the next Open deletes it.
  const std::string left = StateLayout::GradScratchName(1, 0);
  ASSERT_TRUE(store_->Create("job", left, 2000).ok());
  ASSERT_TRUE(store_->Write("job", left, std::vector<uint8_t>(2000)).ok());
  ASSERT_TRUE(store_->Create("other", left, 2000).ok());
  store_.reset();
  OpenStore();
  EXPECT_EQ(ScratchTensors(*store_, "job").size(), 1u);
  ASSERT_TRUE(JobPipeline::DropScratchTensors(store_.get(), "other").ok());
  EXPECT_TRUE(ScratchTensors(*store_, "other").empty());
  auto p = JobPipeline::Open(store_.get(), *updater_, "job", layout, options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(ScratchTensors(*store_, "job").empty());
  std::vector<float> w(2500);
  ASSERT_TRUE((*p)->ReadWeights(0, w.data()).ok());
  EXPECT_EQ(w, w0);
  // Still trains, and cleans up after a good iteration too.
  ASSERT_TRUE((*p)->BeginIteration().ok());
  for (size_t l = 0; l < 4; ++l) {
    ASSERT_TRUE((*p)->SubmitGradients(l, g.data(), nullptr).ok());
  }
  auto ok = (*p)->EndIteration();
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->iteration, 1u);
  EXPECT_TRUE(ScratchTensors(*store_, "job").empty());
}

TEST_F(JobPipelineTest, StreamedStoreErrorsFailTheIterationCleanly) {
  OpenStoreWithFaults();
  const ModelLayout layout = Layout(DType::kBFloat16);
  PipelineOptions options;
  options.stream_gradients = true;
  options.stream_weight16 = true;
  // Stage reads happen in EndIteration, after the faults are armed.
  options.schedule = Schedule::kAfterBackward;
  auto p = JobPipeline::Open(store_.get(), *updater_, "job", layout, options);
  ASSERT_TRUE(p.ok()) << p.status();
  Initialize(**p, layout);
  std::vector<uint16_t> g(4097, 0x3f80);
  using Fault = FaultInjectionDevice::Fault;
  // Storing a gradient fails: that GRAD_READY fails, the iteration too.
  faults_[0]->Inject({Fault::kEio, IoRequest::Op::kWrite, 1});
  faults_[1]->Inject({Fault::kEio, IoRequest::Op::kWrite, 1});
  ASSERT_TRUE((*p)->BeginIteration().ok());
  absl::Status submitted = (*p)->SubmitGradients(3, g.data(), nullptr);
  EXPECT_FALSE(submitted.ok());
  EXPECT_NE(submitted.message().find("streamed gradient"), std::string::npos)
      << submitted;
  faults_[0]->ClearFaults();
  faults_[1]->ClearFaults();
  for (size_t l = 0; l < 3; ++l) {
    ASSERT_TRUE((*p)->SubmitGradients(l, g.data(), nullptr).ok());
  }
  EXPECT_FALSE((*p)->EndIteration().ok());
  EXPECT_TRUE(ScratchTensors(*store_, "job").empty());
  // Reading a stored gradient back fails: the iteration fails, nothing
  // stays pending, the committed 16-bit copy is intact.
  std::vector<uint16_t> copy0(2500), copy(2500);
  ASSERT_TRUE((*p)->ReadWeight16(0, copy0.data()).ok());
  ASSERT_TRUE((*p)->BeginIteration().ok());
  for (size_t l = 0; l < 4; ++l) {
    ASSERT_TRUE((*p)->SubmitGradients(l, g.data(), nullptr).ok());
  }
  faults_[0]->Inject({Fault::kEio, IoRequest::Op::kRead, 1});
  faults_[1]->Inject({Fault::kEio, IoRequest::Op::kRead, 1});
  EXPECT_EQ((*p)->EndIteration().status().code(), absl::StatusCode::kDataLoss);
  faults_[0]->ClearFaults();
  faults_[1]->ClearFaults();
  EXPECT_TRUE(ScratchTensors(*store_, "job").empty());
  for (const std::string& name : store_->List("job")) {
    EXPECT_EQ(store_->Stat("job", name)->pending_version, 0u) << name;
  }
  ASSERT_TRUE((*p)->ReadWeight16(0, copy.data()).ok());
  EXPECT_EQ(copy, copy0);
}

TEST_F(JobPipelineTest, Weight16CopiesAreRebuiltWhenStale) {
  ModelLayout layout = Layout(DType::kBFloat16);
  PipelineOptions resident;
  PipelineOptions streamed;
  streamed.stream_gradients = true;
  streamed.stream_weight16 = true;
  std::vector<uint16_t> g(4097, 0x3c00);
  std::vector<uint16_t> out(4097);
  auto iterate = [&](JobPipeline& p, bool stream) {
    ASSERT_TRUE(p.BeginIteration().ok());
    for (size_t l = 0; l < 4; ++l) {
      ASSERT_TRUE(
          p.SubmitGradients(l, g.data(), stream ? nullptr : out.data()).ok());
    }
    ASSERT_TRUE(p.EndIteration().ok());
  };
  auto expect_current = [&](JobPipeline& p, DType dtype) {
    for (size_t l = 0; l < 4; ++l) {
      const size_t n = layout.layer_elements[l];
      std::vector<float> w(n);
      std::vector<uint16_t> copy(n);
      ASSERT_TRUE(p.ReadWeights(l, w.data()).ok());
      ASSERT_TRUE(p.ReadWeight16(l, copy.data()).ok());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(copy[i], ToHalf(w[i], dtype)) << l << "/" << i;
      }
    }
  };
  {
    auto p =
        JobPipeline::Open(store_.get(), *updater_, "job", layout, streamed);
    ASSERT_TRUE(p.ok()) << p.status();
    Initialize(**p, layout);
    iterate(**p, true);
    expect_current(**p, DType::kBFloat16);
    EXPECT_EQ((*p)->ReadWeight16(4, out.data()).code(),
              absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE((*p)->BeginIteration().ok());
    EXPECT_EQ((*p)->SubmitGradients(0, g.data(), out.data()).code(),
              absl::StatusCode::kInvalidArgument);
  }
  {
    // A run that keeps them in its own buffers: the store's go stale.
    auto p =
        JobPipeline::Open(store_.get(), *updater_, "job", layout, resident);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ((*p)->ReadWeight16(0, out.data()).code(),
              absl::StatusCode::kFailedPrecondition);
    iterate(**p, false);
    iterate(**p, false);
  }
  {
    auto p =
        JobPipeline::Open(store_.get(), *updater_, "job", layout, streamed);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ((*p)->iteration(), 3u);
    expect_current(**p, DType::kBFloat16);
  }
  // Another 16-bit dtype: rebuilt in it.
  layout.weight16_dtype = DType::kFloat16;
  auto p = JobPipeline::Open(store_.get(), *updater_, "job", layout, streamed);
  ASSERT_TRUE(p.ok()) << p.status();
  expect_current(**p, DType::kFloat16);
  iterate(**p, true);
  expect_current(**p, DType::kFloat16);
}

// ------------------------------------------------------------ checkpoints

// Every moment the layout stores, per layer: ReadState's values.
std::vector<std::vector<std::vector<float>>> ReadMoments(
    const JobPipeline& p, const ModelLayout& layout) {
  std::vector<StatePart> parts = {StatePart::kExpAvg, StatePart::kExpAvgSq};
  if (layout.adam.amsgrad) parts.push_back(StatePart::kMaxExpAvgSq);
  std::vector<std::vector<std::vector<float>>> moments;
  for (StatePart part : parts) {
    moments.emplace_back();
    for (size_t l = 0; l < layout.layer_elements.size(); ++l) {
      moments.back().emplace_back(layout.layer_elements[l]);
      absl::Status read = p.ReadState(l, part, moments.back().back().data());
      EXPECT_TRUE(read.ok()) << read;
    }
  }
  return moments;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct RestoreVariant {
  DType moment_dtype;
  bool amsgrad;
  bool stream;  // The restored job streams gradients and 16-bit weights.
};

class RestorePipelineTest
    : public JobPipelineTest,
      public ::testing::WithParamInterface<RestoreVariant> {};

// A portable checkpoint: job A trains k iterations; job B starts at
// iteration k, gets A's fp32 weights (InitializeWeights) and moments
// (ReadState -> InitState); trained on with the same gradients, B stays
// bit-identical to A (weights, 16-bit copies, moments, steps).
TEST_P(RestorePipelineTest, ANewJobStartedAtStepKContinuesBitIdentically) {
  const RestoreVariant v = GetParam();
  ModelLayout layout = Layout(DType::kBFloat16);
  layout.moment_dtype = v.moment_dtype;
  layout.adam.amsgrad = v.amsgrad;
  const size_t layers = layout.layer_elements.size();
  PipelineOptions a_options;
  a_options.buffers = 3;
  auto a = JobPipeline::Open(store_.get(), *updater_, "a", layout, a_options);
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<RefLayer> ref = Initialize(**a, layout);
  std::vector<std::vector<uint16_t>> out_a(layers), out_b(layers);
  for (size_t l = 0; l < layers; ++l) {
    out_a[l].assign(layout.layer_elements[l], 0);
    out_b[l].assign(layout.layer_elements[l], 0);
  }
  int64_t step = 0;
  for (uint32_t it = 0; it < 3; ++it) {
    RunAndCheck(**a, layout, ref, step, 40 + it);
  }
  ASSERT_EQ((*a)->iteration(), 3u);
  CheckStates(**a, layout, ref);

  PipelineOptions b_options = a_options;
  b_options.stream_gradients = v.stream;
  b_options.stream_weight16 = v.stream;
  b_options.initial_iteration = 3;
  auto b = JobPipeline::Open(store_.get(), *updater_, "b", layout, b_options);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->iteration(), 3u);
  std::vector<float> buffer(4097);
  // No states before its weights.
  EXPECT_EQ((*b)->InitState(0, StatePart::kExpAvg, buffer.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*b)->ReadState(0, StatePart::kExpAvg, buffer.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<StatePart> parts = {StatePart::kExpAvg, StatePart::kExpAvgSq};
  if (v.amsgrad) parts.push_back(StatePart::kMaxExpAvgSq);
  for (size_t l = 0; l < layers; ++l) {
    ASSERT_TRUE((*a)->ReadWeights(l, buffer.data()).ok());
    ASSERT_TRUE((*b)->InitializeWeights(l, buffer.data()).ok());
    // Zero moments until restored.
    ASSERT_TRUE((*b)->ReadState(l, StatePart::kExpAvgSq, buffer.data()).ok());
    EXPECT_TRUE(std::all_of(buffer.begin(),
                            buffer.begin() + layout.layer_elements[l],
                            [](float x) { return x == 0.0f; }));
    for (StatePart part : parts) {
      ASSERT_TRUE((*a)->ReadState(l, part, buffer.data()).ok());
      ASSERT_TRUE((*b)->InitState(l, part, buffer.data()).ok());
    }
  }
  EXPECT_EQ((*b)->iteration(), 3u);
  // Restored: the same moments, and weights untouched by InitState (the
  // streamed 16-bit copies still those of the weights).
  CheckStates(**b, layout, ref);
  CheckWeights(**b, layout, ref);
  if (v.stream) {
    for (size_t l = 0; l < layers; ++l) {
      std::vector<uint16_t> copy(layout.layer_elements[l]);
      ASSERT_TRUE((*b)->ReadWeight16(l, copy.data()).ok());
      for (size_t i = 0; i < copy.size(); ++i) {
        ASSERT_EQ(copy[i], ToHalf(ref[l].w[i], layout.weight16_dtype))
            << l << "/" << i;
      }
    }
  }
  for (const std::string& name : store_->List("b")) {
    EXPECT_EQ(store_->Stat("b", name)->pending_version, 0u) << name;
  }

  // Trained on alike: plain, clipped with a loss scale, a schedule's lr.
  ClipOptions clip;
  clip.max_grad_norm = 1.0;  // The norm is about 2.8 at grad_scale 1.
  const StepInput inputs[] = {
      {.seed = 51},
      {.seed = 52, .grad_scale = 0.5f},
      {.seed = 53, .lr = 3e-3},
  };
  for (size_t it = 0; it < std::size(inputs); ++it) {
    StepResult ra = Step(**a, layout, a_options, inputs[it], clip, out_a);
    StepResult rb = Step(**b, layout, b_options, inputs[it], clip, out_b);
    EXPECT_EQ(ra.report.iteration, 4 + it);
    EXPECT_EQ(rb.report.iteration, 4 + it);
    EXPECT_EQ(ra.report.clipped, rb.report.clipped) << it;
    EXPECT_EQ(ra.report.clip_scale, rb.report.clip_scale) << it;
    for (size_t l = 0; l < layers; ++l) {
      EXPECT_TRUE(BitEqual(ra.weights[l], rb.weights[l]))
          << "iteration " << it << " layer " << l;
      EXPECT_EQ(ra.weight16[l], rb.weight16[l])
          << "iteration " << it << " layer " << l;
    }
    const auto ma = ReadMoments(**a, layout);
    const auto mb = ReadMoments(**b, layout);
    for (size_t part = 0; part < ma.size(); ++part) {
      for (size_t l = 0; l < layers; ++l) {
        EXPECT_TRUE(BitEqual(ma[part][l], mb[part][l]))
            << "iteration " << it << " moment " << part + 1 << " layer " << l;
      }
    }
  }

  // Without initial_iteration the same restore is a different step
  // (bias correction): the test above would have seen it.
  auto c = JobPipeline::Open(store_.get(), *updater_, "c", layout, a_options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->iteration(), 0u);
  for (size_t l = 0; l < layers; ++l) {
    ASSERT_TRUE((*a)->ReadWeights(l, buffer.data()).ok());
    ASSERT_TRUE((*c)->InitializeWeights(l, buffer.data()).ok());
    for (StatePart part : parts) {
      ASSERT_TRUE((*a)->ReadState(l, part, buffer.data()).ok());
      ASSERT_TRUE((*c)->InitState(l, part, buffer.data()).ok());
    }
  }
  StepResult ra = Step(**a, layout, a_options, {.seed = 54}, clip, out_a);
  StepResult rc = Step(**c, layout, a_options, {.seed = 54}, clip, out_b);
  EXPECT_EQ(rc.report.iteration, 1u);
  EXPECT_FALSE(BitEqual(ra.weights[0], rc.weights[0]));
}

INSTANTIATE_TEST_SUITE_P(
    Variants, RestorePipelineTest,
    ::testing::Values(RestoreVariant{DType::kFloat32, false, false},
                      RestoreVariant{DType::kBFloat16, false, true},
                      RestoreVariant{DType::kFloat32, true, true},
                      RestoreVariant{DType::kBFloat16, true, false}));

TEST_F(JobPipelineTest, InitStateRoundsBf16MomentsToNearestEven) {
  ModelLayout layout = Layout(DType::kBFloat16);
  layout.moment_dtype = DType::kBFloat16;
  auto p = OpenJob("job", layout, Schedule::kPipelined);
  ASSERT_NE(p, nullptr);
  Initialize(*p, layout);
  // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0); a
  // little more rounds up; 3 + 3 x 2^-7 ties to even upwards (3 + 2^-5).
  const float values[] = {1.0f + 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f,
                          3.0f + 3 * 0x1p-7f, -2.5e-3f};
  std::vector<float> in(2500), got(2500);
  for (size_t i = 0; i < in.size(); ++i) in[i] = values[i % 4] * (1 + i / 4);
  ASSERT_TRUE(p->InitState(0, StatePart::kExpAvg, in.data()).ok());
  ASSERT_TRUE(p->ReadState(0, StatePart::kExpAvg, got.data()).ok());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(got[i], Bf16ToFloat(FloatToBf16(in[i]))) << i;
  }
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 1.0f + 0x1p-7f);
  EXPECT_EQ(got[2], 3.0f + 0x1p-5f);
  // The other moment and the weights are as they were.
  ASSERT_TRUE(p->ReadState(0, StatePart::kExpAvgSq, got.data()).ok());
  EXPECT_EQ(got, std::vector<float>(2500, 0.0f));
}

TEST_F(JobPipelineTest, StateCallsRefuseBadArgumentsAndStates) {
  ModelLayout layout = Layout(DType::kBFloat16);
  auto p = OpenJob("job", layout, Schedule::kPipelined);
  ASSERT_NE(p, nullptr);
  std::vector<float> buffer(4097, 0.25f);
  std::vector<uint16_t> g(4097, 0), out(4097);
  // Uninitialized layer.
  absl::Status s = p->ReadState(1, StatePart::kExpAvg, buffer.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  s = p->InitState(1, StatePart::kExpAvg, buffer.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("no states"), std::string::npos) << s;
  for (size_t l = 0; l < 4; ++l) {
    ASSERT_TRUE(p->InitializeWeights(l, buffer.data()).ok());
  }
  // Bad layer, null buffer, unknown part, max_exp_avg_sq without AMSGrad.
  EXPECT_EQ(p->ReadState(4, StatePart::kExpAvg, buffer.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p->InitState(0, StatePart::kExpAvg, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p->ReadState(0, static_cast<StatePart>(4), buffer.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p->InitState(0, static_cast<StatePart>(0), buffer.data()).code(),
            absl::StatusCode::kInvalidArgument);
  s = p->ReadState(0, StatePart::kMaxExpAvgSq, buffer.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("AMSGrad"), std::string::npos) << s;
  EXPECT_EQ(p->InitState(0, StatePart::kMaxExpAvgSq, buffer.data()).code(),
            absl::StatusCode::kInvalidArgument);
  // Inside an iteration (and after EndIteration was called it is over).
  ASSERT_TRUE(p->BeginIteration().ok());
  s = p->ReadState(0, StatePart::kExpAvg, buffer.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("iteration"), std::string::npos) << s;
  EXPECT_EQ(p->InitState(0, StatePart::kExpAvgSq, buffer.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  for (size_t l = 0; l < 4; ++l) {
    ASSERT_TRUE(p->SubmitGradients(l, g.data(), out.data()).ok());
  }
  ASSERT_TRUE(p->EndIteration().ok());
  EXPECT_TRUE(p->ReadState(0, StatePart::kExpAvg, buffer.data()).ok());
  // Nothing was left pending by the refused calls.
  for (const std::string& name : store_->List("job")) {
    EXPECT_EQ(store_->Stat("job", name)->pending_version, 0u) << name;
  }
}

TEST_F(JobPipelineTest, InitialIterationAppliesOnlyToAJobWithoutStates) {
  const ModelLayout layout = Layout(DType::kBFloat16);
  PipelineOptions options;
  options.initial_iteration = 7;
  {
    auto p = JobPipeline::Open(store_.get(), *updater_, "job", layout, options);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ((*p)->iteration(), 7u);
  }
  // Its meta was written, but no layer has states yet: it starts over at
  // whatever is asked (0: as stored).
  options.initial_iteration = 0;
  {
    auto p = JobPipeline::Open(store_.get(), *updater_, "job", layout, options);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ((*p)->iteration(), 7u);
  }
  options.initial_iteration = 5;
  {
    auto p = JobPipeline::Open(store_.get(), *updater_, "job", layout, options);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ((*p)->iteration(), 5u);
    Initialize(**p, layout);
    std::vector<uint16_t> g(4097, 0x3c00), out(4097);
    ASSERT_TRUE((*p)->BeginIteration().ok());
    for (size_t l = 0; l < 4; ++l) {
      ASSERT_TRUE((*p)->SubmitGradients(l, g.data(), out.data()).ok());
    }
    auto r = (*p)->EndIteration();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->iteration, 6u);
  }
  store_.reset();
  OpenStore();
  // With states: the stored iteration, or refused.
  for (uint64_t initial : {uint64_t{0}, uint64_t{6}}) {
    options.initial_iteration = initial;
    auto p = JobPipeline::Open(store_.get(), *updater_, "job", layout, options);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ((*p)->iteration(), 6u);
  }
  for (uint64_t initial : {uint64_t{5}, uint64_t{7}}) {
    options.initial_iteration = initial;
    auto p = JobPipeline::Open(store_.get(), *updater_, "job", layout, options);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition)
        << p.status();
    EXPECT_NE(p.status().message().find("iteration 6"), std::string::npos)
        << p.status();
  }
  options.initial_iteration = 0;
  auto p = JobPipeline::Open(store_.get(), *updater_, "job", layout, options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->iteration(), 6u);
}

}  // namespace
}  // namespace lohan
