#include "plan/planner.h"

#include <algorithm>
#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;

ModelShape Preset(const char* name) { return *PresetShape(name); }

// A machine whose host memory and SSDs are never what binds, with the
// host-device links `link` bytes/s each way.
Machine Roomy(double link, uint64_t device_bytes = 80 * kGiB) {
  return Machine{.device_bytes = device_bytes,
                 .device_flops = 100e12,
                 .host_to_device = link,
                 .device_to_host = link,
                 .host_bytes = 4096 * kGiB,
                 .ssds = 64,
                 .ssd_read = 50e9,
                 .ssd_write = 50e9};
}

// `machine` with device memory for the working set of `shape` at `batch`
// x `seq` and 1 MiB more: no saved tensor can stay there, every one not
// recomputed crosses the link (the paper's setting).
Machine Tight(Machine machine, const ModelShape& shape, uint64_t batch,
              uint64_t seq) {
  absl::StatusOr<Plan> roomy = MakePlan(shape, batch, seq, machine);
  EXPECT_TRUE(roomy.ok()) << roomy.status();
  machine.device_bytes = roomy->device_working_bytes + (uint64_t{1} << 20);
  return machine;
}

// The link speed at which sending every saved tensor off the device takes
// twice the forward's compute: recompute-everything and offload-everything
// then cost about alike, and the best point is in between.
double BalancedLink(const ModelShape& shape, uint64_t batch, uint64_t seq) {
  const ModelCounts c = CountModel(shape, batch, seq);
  const double all =
      static_cast<double>(shape.layers * c.block_activation_bytes);
  return all / (2 * c.forward_flops / 100e12);
}

TEST(Planner, TheThreeCasesOfAlgorithmOne) {
  const ModelShape shape = Preset("gpt-1.3b");
  const double balanced = BalancedLink(shape, 8, 1024);
  // A narrow link: offloading only costs; the block inputs alone.
  absl::StatusOr<Plan> narrow = MakePlan(
      shape, 8, 1024, Tight(Roomy(balanced / 100, 12 * kGiB), shape, 8, 1024));
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  EXPECT_EQ(narrow->search_case, 1);
  EXPECT_EQ(narrow->chosen, 0u);
  // A wide one: compute binds even with nothing recomputed.
  absl::StatusOr<Plan> wide = MakePlan(
      shape, 8, 1024, Tight(Roomy(balanced * 100, 12 * kGiB), shape, 8, 1024));
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->search_case, 2);
  EXPECT_EQ(wide->chosen, wide->curve.size() - 1);
  EXPECT_EQ(wide->recomputed_bytes, 0u);
  EXPECT_EQ(wide->estimate.recompute_flops, 0);
  // In between: a minimum inside.
  absl::StatusOr<Plan> balanced_plan = MakePlan(
      shape, 8, 1024, Tight(Roomy(balanced, 12 * kGiB), shape, 8, 1024));
  ASSERT_TRUE(balanced_plan.ok()) << balanced_plan.status();
  EXPECT_EQ(balanced_plan->search_case, 3);
  EXPECT_GT(balanced_plan->chosen, 0u);
  EXPECT_LT(balanced_plan->chosen, balanced_plan->curve.size() - 1);
  EXPECT_LT(balanced_plan->curve[balanced_plan->chosen].seconds(),
            balanced_plan->curve.front().seconds());
  EXPECT_LT(balanced_plan->curve[balanced_plan->chosen].seconds(),
            balanced_plan->curve.back().seconds());
}

// What the device's spare memory holds crosses no link: with a narrow link
// a tight device recomputes everything but the block inputs, a roomy one
// keeps what fits instead of recomputing it, and is faster for it.
TEST(Planner, SavedTensorsTheDeviceHoldsCostNoTransfer) {
  const ModelShape shape = Preset("gpt-1.3b");
  const Machine narrow = Roomy(BalancedLink(shape, 8, 1024) / 100);
  absl::StatusOr<Plan> tight =
      MakePlan(shape, 8, 1024, Tight(narrow, shape, 8, 1024));
  absl::StatusOr<Plan> roomy = MakePlan(shape, 8, 1024, narrow);
  ASSERT_TRUE(tight.ok()) << tight.status();
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  EXPECT_EQ(tight->search_case, 1);
  EXPECT_GT(roomy->device_bytes, 0u);
  EXPECT_LE(roomy->device_bytes,
            narrow.device_bytes - roomy->device_working_bytes);
  EXPECT_LT(roomy->estimate.recompute_flops, tight->estimate.recompute_flops);
  EXPECT_LT(roomy->estimate.seconds(), tight->estimate.seconds());
  // Kept tensors are not offloaded ones.
  EXPECT_EQ(roomy->estimate.offloaded_bytes,
            roomy->host_bytes + roomy->ssd_bytes);
}

// Along the greedy order the iteration time is convex in the offloaded
// bytes (slopes never decrease), so Algorithm 1's first non-improving step
// is the minimum of the whole curve.
TEST(Planner, IterationTimeIsConvexAlongTheGreedyOrder) {
  for (const char* name : {"gpt-1.3b", "gpt-13b", "llama-7b"}) {
    const ModelShape shape = Preset(name);
    for (double scale : {0.01, 0.3, 1.0, 3.0, 100.0}) {
      for (uint64_t host : {uint64_t{64}, uint64_t{4096}}) {
        Machine machine = Roomy(scale * BalancedLink(shape, 8, 1024));
        machine.host_bytes = host * kGiB;  // 64 GiB: activations spill
        machine.ssds = 2;
        machine.ssd_read = 6.5e9;
        machine.ssd_write = 3.4e9;
        // Tight: every saved tensor not recomputed crosses the link; roomy:
        // the first ones stay on the device for free.
        for (const Machine& device :
             {Tight(machine, shape, 8, 1024), machine}) {
          absl::StatusOr<Plan> plan = MakePlan(shape, 8, 1024, device);
          ASSERT_TRUE(plan.ok()) << plan.status();
          const std::vector<Estimate>& curve = plan->curve;
          double last_slope = -INFINITY;
          for (size_t i = 1; i < curve.size(); ++i) {
            const double slope = (curve[i].seconds() - curve[i - 1].seconds()) /
                                 static_cast<double>(curve[i].saved_bytes -
                                                     curve[i - 1].saved_bytes);
            EXPECT_GE(slope, last_slope - 1e-18)
                << name << " x" << scale << " host " << host << " at " << i;
            last_slope = slope;
          }
          size_t best = 0;
          for (size_t i = 0; i < curve.size(); ++i) {
            if (curve[i].seconds() < curve[best].seconds()) best = i;
          }
          EXPECT_NEAR(curve[plan->chosen].seconds(), curve[best].seconds(),
                      1e-9 * curve[best].seconds())
              << name << " x" << scale;
        }
      }
    }
  }
}

// Every decision honours every memory limit: the device holds its working
// set and what it keeps, host memory lohan's buffers and what goes there,
// the SSDs the states and what spills.
TEST(Planner, EveryPlanFitsEveryMemory) {
  for (const char* name : {"gpt-1.3b", "gpt-13b", "gpt-175b", "llama-70b"}) {
    const ModelShape shape = Preset(name);
    for (uint64_t batch : {1, 8, 32}) {
      for (uint64_t host : {uint64_t{128}, uint64_t{256}, uint64_t{768}}) {
        Machine machine = Roomy(BalancedLink(shape, batch, 1024), 24 * kGiB);
        machine.host_bytes = host * kGiB;
        machine.ssds = 12;
        machine.ssd_read = 6.5e9;
        machine.ssd_write = 3.4e9;
        machine.ssd_bytes = 12 * 4000 * kGiB;
        absl::StatusOr<Plan> plan = MakePlan(shape, batch, 1024, machine);
        if (!plan.ok()) {
          EXPECT_TRUE(absl::IsFailedPrecondition(plan.status()))
              << plan.status();
          continue;
        }
        uint64_t device = 0, host_used = 0, ssd = 0;
        for (const TensorPlan& tensor : plan->tensors) {
          if (tensor.decision == Decision::kDevice) device += tensor.bytes;
          if (tensor.decision == Decision::kHost) host_used += tensor.bytes;
          if (tensor.decision == Decision::kSsd) ssd += tensor.bytes;
          if (tensor.name == "input") {
            EXPECT_NE(tensor.decision, Decision::kRecompute);
          }
        }
        EXPECT_EQ(device, plan->device_bytes);
        EXPECT_EQ(ssd, plan->ssd_bytes);
        EXPECT_LE(plan->device_working_bytes + device, machine.device_bytes);
        EXPECT_LE(plan->host_fixed_bytes + host_used, machine.host_bytes);
        EXPECT_LE(plan->ssd_fixed_bytes + ssd, machine.ssd_bytes);
        EXPECT_EQ(plan->tensors.size(),
                  shape.layers * plan->counts.block_tensors.size());
      }
    }
  }
}

TEST(Planner, WhatDoesNotFitSaysWhichMemoryAndByHowMuch) {
  Machine machine = Roomy(16e9, 24 * kGiB);
  // A batch whose one block's activations alone pass 24 GiB.
  absl::StatusOr<Plan> plan = MakePlan(Preset("gpt-175b"), 64, 4096, machine);
  EXPECT_TRUE(absl::IsFailedPrecondition(plan.status()));
  EXPECT_THAT(plan.status().message(), HasSubstr("device's working set"));
  EXPECT_THAT(plan.status().message(), HasSubstr("smaller batch"));
  // States larger than the SSDs.
  machine.ssd_bytes = 100 * kGiB;
  plan = MakePlan(Preset("gpt-175b"), 1, 1024, machine);
  EXPECT_TRUE(absl::IsFailedPrecondition(plan.status()));
  EXPECT_THAT(plan.status().message(), HasSubstr("states on the SSDs"));
  // Host memory smaller than lohan's own buffers.
  machine = Roomy(16e9, 24 * kGiB);
  machine.host_bytes = kGiB / 4;
  plan = MakePlan(Preset("gpt-13b"), 1, 1024, machine);
  EXPECT_TRUE(absl::IsFailedPrecondition(plan.status()));
  EXPECT_THAT(plan.status().message(), HasSubstr("host pool"));
  // A batch and sequence whose attention alone leaves 64 bits.
  plan = MakePlan(Preset("gpt-175b"), 1 << 20, 1 << 20, Roomy(16e9));
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status()));
  EXPECT_THAT(plan.status().message(), HasSubstr("too large to plan"));
  // A machine description with a hole in it.
  machine = Roomy(16e9);
  machine.ssd_write = 0;
  EXPECT_THAT(MakePlan(Preset("gpt-13b"), 1, 1024, machine).status().message(),
              HasSubstr("SSD write bandwidth"));
}

TEST(Planner, WeightsStayInHostMemoryWhenTheyFitAndSpillOtherwise) {
  const ModelShape shape = Preset("gpt-13b");
  Machine machine = Roomy(25e9, 24 * kGiB);
  machine.ssds = 3;
  machine.ssd_read = 6.5e9;
  machine.ssd_write = 3.4e9;
  machine.host_bytes = 256 * kGiB;
  absl::StatusOr<Plan> big = MakePlan(shape, 32, 1024, machine);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_TRUE(big->weights_in_host);
  EXPECT_EQ(big->estimate.forward.ssd, big->estimate.ssd_bytes / (3 * 3.4e9));
  // Less than the 26 GB of 16-bit weights, and than the 13 GB of block
  // inputs, with a device that keeps none of them.
  machine.host_bytes = 8 * kGiB;
  machine.device_bytes = big->device_working_bytes + (uint64_t{1} << 20);
  absl::StatusOr<Plan> small = MakePlan(shape, 32, 1024, machine);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_FALSE(small->weights_in_host);
  EXPECT_GT(small->ssd_bytes, 0u);  // little room: activations spill too
  EXPECT_GT(small->estimate.seconds(), big->estimate.seconds());
}

void ExpectLayout(const Plan& plan, const JobLayoutBytes& want) {
  const JobLayoutBytes& got = plan.layout_bytes;
  EXPECT_EQ(got.stream_buffers, want.stream_buffers);
  EXPECT_EQ(got.arena_bytes, want.arena_bytes);
  EXPECT_EQ(got.update_buffer_bytes, want.update_buffer_bytes);
  EXPECT_EQ(got.ssd_state_bytes, want.ssd_state_bytes);
  EXPECT_EQ(got.ssd_state_tensor_bytes, want.ssd_state_tensor_bytes);
  EXPECT_EQ(got.ssd_scratch_bytes, want.ssd_scratch_bytes);
  EXPECT_EQ(got.ssd_set_aside_bytes, want.ssd_set_aside_bytes);
  EXPECT_EQ(plan.host_fixed_bytes, want.host_bytes());
  EXPECT_EQ(plan.ssd_fixed_bytes, want.ssd_bytes());
  EXPECT_EQ(plan.weights_in_host, want.stream_buffers == 0);
}

// The host and SSD needs are lohan's own layout (LayoutBytes) of the
// layers the plugin cuts: a buffer per layer while the host holds them,
// then shared buffers, then not at all.
TEST(Planner, TheLayoutIsLohansOwn) {
  const ModelShape shape = Preset("gpt-1.3b");
  const ModelCounts counts = CountModel(shape, 8, 1024);
  ASSERT_EQ(counts.layer_elements.size(), shape.layers + 2);
  const JobLayoutBytes resident =
      *LayoutBytes(counts.layer_elements, false, 0, 4096);
  const JobLayoutBytes streamed =
      *LayoutBytes(counts.layer_elements, true, 0, 4096);
  ASSERT_EQ(streamed.stream_buffers, 4u);
  ASSERT_LT(streamed.host_bytes(), resident.host_bytes());
  // A device that keeps every activation: nothing goes to the host.
  Machine machine = Roomy(25e9, 80 * kGiB);
  machine.host_bytes = resident.host_bytes();
  absl::StatusOr<Plan> plan = MakePlan(shape, 8, 1024, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectLayout(*plan, resident);
  EXPECT_EQ(plan->activation_area_bytes, 0u);
  EXPECT_EQ(plan->ssd_bytes, 0u);
  machine.host_bytes = resident.host_bytes() - 1;
  plan = MakePlan(shape, 8, 1024, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectLayout(*plan, streamed);
  machine.host_bytes = streamed.host_bytes() - 1;
  plan = MakePlan(shape, 8, 1024, machine);
  EXPECT_TRUE(absl::IsFailedPrecondition(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("host pool"));
  // The store's block size rounds every tensor.
  machine = Roomy(25e9, 80 * kGiB);
  machine.ssd_block_bytes = 1 << 20;
  plan = MakePlan(shape, 8, 1024, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectLayout(*plan, *LayoutBytes(counts.layer_elements, false, 0, 1 << 20));
}

// Activations that go to the SSDs pass through the plugin's activation
// area in the arena; a host without room for it sends none there.
TEST(Planner, SpilledActivationsTakeTheActivationArea) {
  const ModelShape shape = Preset("gpt-1.3b");
  const ModelCounts counts = CountModel(shape, 8, 1024);
  const JobLayoutBytes streamed =
      *LayoutBytes(counts.layer_elements, true, 0, 4096);
  const JobLayoutBytes with_area = *LayoutBytes(
      counts.layer_elements, true, kPluginActivationAreaBytes, 4096);
  // A device with little room beside its working set and a host with
  // 256 MiB beside lohan's own: the block inputs alone (24 x 32 MiB)
  // spill.
  Machine machine = Tight(Roomy(25e9), shape, 8, 1024);
  machine.host_bytes = with_area.host_bytes() + kGiB / 4;
  absl::StatusOr<Plan> plan = MakePlan(shape, 8, 1024, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->ssd_bytes, 0u);
  EXPECT_EQ(plan->activation_area_bytes, kPluginActivationAreaBytes);
  ExpectLayout(*plan, with_area);
  EXPECT_LE(plan->host_fixed_bytes + plan->host_bytes, machine.host_bytes);
  // Room for lohan's layout but not for the area, and block inputs that
  // need the SSDs: the refusal names the area.
  machine.host_bytes = streamed.host_bytes() + kGiB / 128;
  plan = MakePlan(shape, 8, 1024, machine);
  EXPECT_TRUE(absl::IsFailedPrecondition(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("activation area"));
}

TEST(Planner, TheTrainersHostMemoryIsItsActivationsAndASavesTensor) {
  const ModelShape shape = Preset("gpt-1.3b");
  // Host room for some block inputs, the rest on the SSDs (as above).
  const JobLayoutBytes with_area =
      *LayoutBytes(CountModel(shape, 8, 1024).layer_elements, true,
                   kPluginActivationAreaBytes, 4096);
  Machine machine = Tight(Roomy(25e9), shape, 8, 1024);
  machine.host_bytes = with_area.host_bytes() + kGiB / 4;
  absl::StatusOr<Plan> plan = MakePlan(shape, 8, 1024, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->ssd_bytes, 0u);
  // Of the tensors on the SSDs, the largest is read back whole at once.
  uint64_t largest_on_ssd = 0;
  for (const TensorPlan& tensor : plan->tensors) {
    if (tensor.decision == Decision::kSsd) {
      largest_on_ssd = std::max(largest_on_ssd, tensor.bytes);
    }
  }
  EXPECT_GE(largest_on_ssd, 32u << 20);  // a block input at least
  const TrainerHostBytes& trainer = plan->trainer_host;
  EXPECT_EQ(trainer.activations, plan->host_bytes);
  EXPECT_EQ(trainer.activation_read, largest_on_ssd);
  EXPECT_EQ(trainer.checkpoint_load, 0u);
  EXPECT_EQ(trainer.checkpoint_save, 2 * plan->counts.largest_parameter);
  EXPECT_EQ(trainer.device, 0u);
  EXPECT_EQ(trainer.arena_mapped, plan->layout_bytes.arena_bytes);
  EXPECT_EQ(trainer.total(), plan->host_bytes + largest_on_ssd +
                                 2 * plan->counts.largest_parameter);
  // Everything on the host: nothing is read back from the SSDs.
  plan = MakePlan(shape, 8, 1024, Tight(Roomy(25e9), shape, 8, 1024));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ssd_bytes, 0u);
  EXPECT_EQ(plan->trainer_host.activation_read, 0u);
  EXPECT_EQ(plan->trainer_host.activations, plan->host_bytes);
}

TEST(Planner, OnACpuOnlyMachineTheOptimizerAddsToBackward) {
  const ModelShape shape = Preset("gpt-1.3b");
  Machine machine = Roomy(25e9);
  machine.optimizer_params = 1e9;
  absl::StatusOr<Plan> apart = MakePlan(shape, 4, 1024, machine);
  machine.device_is_host = true;
  absl::StatusOr<Plan> shared = MakePlan(shape, 4, 1024, machine);
  ASSERT_TRUE(apart.ok() && shared.ok());
  const Estimate& a = apart->curve.front();
  const Estimate& s = shared->curve.front();
  EXPECT_DOUBLE_EQ(s.backward.compute,
                   a.backward.compute + a.backward.optimizer);
  EXPECT_EQ(s.backward.optimizer, 0);
  EXPECT_GE(s.seconds(), a.seconds());
}

// Per-block decisions: one step per block, the last blocks first, and a
// plan the plugin can take as it is.
TEST(Planner, PerBlockDecisionsStepAWholeBlockAtATime) {
  const ModelShape shape = Preset("gpt-1.3b");
  const Machine machine =
      Tight(Roomy(BalancedLink(shape, 8, 1024)), shape, 8, 1024);
  absl::StatusOr<Plan> plan =
      MakePlan(shape, 8, 1024, machine, Attention::kFused, Granularity::kBlock);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->curve.size(), shape.layers + 1);
  const uint64_t step = plan->counts.block_activation_bytes -
                        plan->counts.block_tensors.front().bytes;
  for (size_t i = 1; i < plan->curve.size(); ++i) {
    EXPECT_EQ(plan->curve[i].saved_bytes,
              plan->curve[i - 1].saved_bytes + step);
  }
  const std::vector<std::string> modes = plan->block_modes();
  ASSERT_EQ(modes.size(), shape.layers);
  // The chosen number of blocks skip the recompute, the last ones.
  for (size_t b = 0; b < shape.layers; ++b) {
    EXPECT_EQ(modes[b] == "offload", b < shape.layers - plan->chosen) << b;
  }
  EXPECT_EQ(plan->search_case, 3);
}

// A backward bound by slow SSDs hides the recompute: the iteration time is
// flat along the curve, and the search goes on while the work falls (each
// step saves more compute than its bytes cost on a fast link).
TEST(Planner, WhereTheTimeIsFlatLessWorkWins) {
  const ModelShape shape = Preset("gpt-1.3b");
  Machine machine = Roomy(1e12, 40 * kGiB);
  machine.ssds = 1;
  machine.ssd_read = machine.ssd_write = 0.5e9;
  absl::StatusOr<Plan> plan =
      MakePlan(shape, 4, 1024, machine, Attention::kFused, Granularity::kBlock);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<Estimate>& curve = plan->curve;
  for (const Estimate& e : curve) {
    EXPECT_DOUBLE_EQ(e.seconds(), curve.front().seconds());
    EXPECT_EQ(e.backward.binding(), Resource::kSsd);
  }
  EXPECT_EQ(plan->chosen, curve.size() - 1);
  EXPECT_LT(curve.back().work(), curve.front().work());
}

// MakePlan is CountModel, then PlanFromCounts: the same plan, point for
// point, decision for decision.
TEST(PlanFromCounts, OfCountModelIsMakePlan) {
  for (const char* name : {"gpt-1.3b", "llama-7b"}) {
    const ModelShape shape = Preset(name);
    for (double scale : {0.01, 1.0, 100.0}) {
      for (Granularity granularity :
           {Granularity::kTensor, Granularity::kBlock}) {
        Machine machine = Roomy(scale * BalancedLink(shape, 8, 1024));
        machine.host_bytes = 64 * kGiB;
        machine.ssds = 2;
        machine.ssd_read = 6.5e9;
        machine.ssd_write = 3.4e9;
        machine.optimizer_params = 2e9;
        absl::StatusOr<Plan> made =
            MakePlan(shape, 8, 1024, machine, Attention::kFused, granularity);
        absl::StatusOr<Plan> counted = PlanFromCounts(
            CountModel(shape, 8, 1024), 8, 1024, machine, nullptr, granularity);
        ASSERT_TRUE(made.ok() && counted.ok())
            << made.status() << counted.status();
        EXPECT_EQ(counted->search_case, made->search_case);
        EXPECT_EQ(counted->chosen, made->chosen);
        ASSERT_EQ(counted->curve.size(), made->curve.size());
        for (size_t i = 0; i < made->curve.size(); ++i) {
          EXPECT_EQ(counted->curve[i].seconds(), made->curve[i].seconds());
        }
        EXPECT_EQ(counted->estimate.seconds(), made->estimate.seconds());
        EXPECT_EQ(counted->estimate.tail, made->estimate.tail);
        ASSERT_EQ(counted->tensors.size(), made->tensors.size());
        for (size_t i = 0; i < made->tensors.size(); ++i) {
          EXPECT_EQ(counted->tensors[i].decision, made->tensors[i].decision);
        }
        EXPECT_EQ(counted->device_bytes, made->device_bytes);
        EXPECT_EQ(counted->host_bytes, made->host_bytes);
        EXPECT_EQ(counted->ssd_bytes, made->ssd_bytes);
        EXPECT_EQ(counted->host_fixed_bytes, made->host_fixed_bytes);
        EXPECT_EQ(counted->ssd_fixed_bytes, made->ssd_fixed_bytes);
        EXPECT_EQ(counted->block_modes(), made->block_modes());
        EXPECT_EQ(made->shape.name, name);
      }
    }
  }
}

// A client's measurement: 4 blocks of 6 tensors, two of which backward
// cannot make again (the most expensive to recompute, per byte).
ModelCounts Measured() {
  ModelCounts c;
  c.layers = 4;
  c.parameters = 40'000'000;
  c.block_parameters = 8'000'000;
  c.largest_layer_parameters = 8'000'000;
  c.head_parameters = 4'000'000;
  c.first_layer_parameters = 4'000'000;
  const uint64_t mib = uint64_t{1} << 20;
  c.block_tensors = {{"input", 8 * mib, 0, true},
                     {"aten.native_layer_norm", 8 * mib, 1e9, false},
                     {"aten.addmm", 24 * mib, 50e9, false},
                     {"aten.native_dropout", 8 * mib, 1e12, true},
                     {"aten.gelu", 32 * mib, 4e9, false},
                     {"aten.addmm", 32 * mib, 60e9, false}};
  c.block_forward_flops = 200e9;
  c.forward_flops = 4 * c.block_forward_flops + 100e9;
  c.logits_bytes = 64 * mib;
  return c;
}

Machine Small(double link) {
  return Machine{.device_bytes = 4 * kGiB,
                 .device_flops = 10e12,
                 .host_to_device = link,
                 .device_to_host = link,
                 .host_bytes = 64 * kGiB,
                 .ssds = 1,
                 .ssd_read = 2e9,
                 .ssd_write = 1e9};
}

TEST(PlanFromCounts, WhatBackwardCannotMakeAgainIsNeverRecomputed) {
  const ModelCounts counts = Measured();
  for (double link : {1e6, 1e9, 25e9, 1e13}) {
    for (Granularity granularity :
         {Granularity::kTensor, Granularity::kBlock}) {
      absl::StatusOr<Plan> plan =
          PlanFromCounts(counts, 2, 512, Small(link), nullptr, granularity);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(plan->tensors.size(), 4u * 6u);
      for (size_t i = 0; i < plan->tensors.size(); ++i) {
        const TensorPlan& tensor = plan->tensors[i];
        const bool never = counts.block_tensors[i % 6].inter_block;
        EXPECT_EQ(tensor.inter_block, never);
        if (never) {
          EXPECT_NE(tensor.decision, Decision::kRecompute)
              << "link " << link << " block " << tensor.block << " "
              << tensor.name;
        }
      }
    }
  }
  // A narrow link and a device with room for its working set (about 240
  // MiB) and little else: only those are offloaded, everything else
  // recomputed.
  Machine tight = Small(1e6);
  tight.device_bytes = 256 * (uint64_t{1} << 20);
  absl::StatusOr<Plan> narrow = PlanFromCounts(counts, 2, 512, tight);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  EXPECT_EQ(narrow->search_case, 1);
  for (const TensorPlan& tensor : narrow->tensors) {
    EXPECT_EQ(tensor.decision == Decision::kRecompute, !tensor.inter_block)
        << tensor.name;
  }
  // A wide one: nothing recomputed.
  absl::StatusOr<Plan> wide = PlanFromCounts(counts, 2, 512, Small(1e13));
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->recomputed_bytes, 0u);
}

TEST(PlanFromCounts, AJobsLayoutFixesTheRoomsForActivations) {
  const ModelCounts counts = Measured();
  Machine machine = Small(1e13);     // everything offloaded if it fits
  machine.device_bytes = 224 << 20;  // and little kept on the device
  machine.host_bytes = 0;            // not used with a layout
  machine.ssds = 64;  // SSDs that never bind: spilling costs nothing
  machine.ssd_read = machine.ssd_write = 50e9;
  const uint64_t mib = uint64_t{1} << 20;
  PlanLayout layout{.activation_host_bytes = 100 * mib,
                    .weights_in_host = true,
                    .host_fixed_bytes = 48 * mib,
                    .activation_ssd_bytes = 200 * mib};
  absl::StatusOr<Plan> plan =
      PlanFromCounts(counts, 2, 512, machine, &layout, Granularity::kTensor);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->weights_in_host);
  EXPECT_EQ(plan->host_fixed_bytes, 48 * mib);
  EXPECT_LE(plan->host_bytes, layout.activation_host_bytes);
  EXPECT_LE(plan->ssd_bytes, layout.activation_ssd_bytes);
  EXPECT_GT(plan->ssd_bytes, 0u);  // the rest went to the SSDs
  EXPECT_LE(plan->device_working_bytes + plan->device_bytes,
            machine.device_bytes);
  // The 16-bit weights stream from the SSDs when the layout says so.
  layout.weights_in_host = false;
  absl::StatusOr<Plan> streamed =
      PlanFromCounts(counts, 2, 512, machine, &layout);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_FALSE(streamed->weights_in_host);
  EXPECT_GT(streamed->estimate.forward.ssd, plan->estimate.forward.ssd);
  // No SSD room: what the host cannot take is recomputed, or, for what
  // never is, the plan cannot be made.
  layout.activation_ssd_bytes = 0;
  absl::StatusOr<Plan> no_ssd =
      PlanFromCounts(counts, 2, 512, machine, &layout);
  ASSERT_TRUE(no_ssd.ok()) << no_ssd.status();
  EXPECT_EQ(no_ssd->ssd_bytes, 0u);
  EXPECT_LE(no_ssd->host_bytes, layout.activation_host_bytes);
  layout.activation_host_bytes = 8 * mib;
  absl::StatusOr<Plan> short_plan =
      PlanFromCounts(counts, 2, 512, machine, &layout);
  EXPECT_TRUE(absl::IsFailedPrecondition(short_plan.status()))
      << short_plan.status();
  EXPECT_THAT(short_plan.status().message(), HasSubstr("never recomputed"));
}

TEST(PlanFromCounts, HostileCountsAreRefusedByName) {
  const Machine machine = Small(25e9);
  auto refused = [&](const ModelCounts& counts, uint64_t batch = 2,
                     uint64_t seq = 512) {
    absl::StatusOr<Plan> plan = PlanFromCounts(counts, batch, seq, machine);
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
    return std::string(plan.status().message());
  };
  ModelCounts c = Measured();
  c.layers = 0;
  EXPECT_THAT(refused(c), HasSubstr("layers"));
  c.layers = kMaxPlanLayers + 1;
  EXPECT_THAT(refused(c), HasSubstr("layers"));
  c = Measured();
  c.block_tensors.resize(kMaxBlockTensors + 1);
  EXPECT_THAT(refused(c), HasSubstr("block_tensors"));
  c = Measured();
  c.sublayer_parameters.assign(kMaxBlockSublayers + 1, 1);
  EXPECT_THAT(refused(c), HasSubstr("sublayer_parameters has"));
  c.sublayer_parameters = {c.block_parameters, 1};
  EXPECT_THAT(refused(c), HasSubstr("at most block_parameters"));
  c.sublayer_parameters = {0};
  EXPECT_THAT(refused(c), HasSubstr("each be > 0"));
  c.sublayer_parameters = {UINT64_MAX, UINT64_MAX};
  EXPECT_THAT(refused(c), HasSubstr("sublayer_parameters"));
  c = Measured();
  c.layers = kMaxPlanLayers;
  c.block_tensors.resize(kMaxPlanTensors / kMaxPlanLayers + 1);
  EXPECT_THAT(refused(c), HasSubstr("at most"));
  for (double bad : {-1.0, double{NAN}, double{INFINITY}, 1e300}) {
    c = Measured();
    c.block_tensors[2].recompute_flops = bad;
    EXPECT_THAT(refused(c), HasSubstr("block_tensors[2].recompute_flops"));
    c = Measured();
    c.forward_flops = bad;
    EXPECT_THAT(refused(c), HasSubstr("forward_flops"));
    c = Measured();
    c.block_forward_flops = bad;
    EXPECT_THAT(refused(c), HasSubstr("block_forward_flops"));
  }
  c = Measured();
  c.block_tensors[1].bytes = UINT64_MAX - 1;
  EXPECT_THAT(refused(c), HasSubstr("64 bits"));
  c = Measured();
  c.block_tensors[1].bytes = UINT64_MAX / 3;  // fits a block, not 4
  EXPECT_THAT(refused(c), HasSubstr("64 bits"));
  c = Measured();
  c.logits_bytes = UINT64_MAX - 10;
  EXPECT_THAT(refused(c), HasSubstr("working set"));
  c = Measured();
  c.parameters = UINT64_MAX / 2;
  c.largest_layer_parameters = UINT64_MAX / 4;
  EXPECT_THAT(refused(c), HasSubstr("64 bits"));
  for (uint64_t ModelCounts::*field :
       {&ModelCounts::block_parameters, &ModelCounts::largest_layer_parameters,
        &ModelCounts::head_parameters, &ModelCounts::first_layer_parameters}) {
    c = Measured();
    c.*field = c.parameters + 1;
    EXPECT_THAT(refused(c), HasSubstr("must be at least"));
  }
  EXPECT_THAT(refused(Measured(), 0, 512), HasSubstr("batch"));
  EXPECT_THAT(refused(Measured(), 2, 0), HasSubstr("seq"));
  // A machine with a hole in it, as for MakePlan.
  Machine holed = machine;
  holed.device_flops = NAN;
  EXPECT_TRUE(absl::IsInvalidArgument(
      PlanFromCounts(Measured(), 2, 512, holed).status()));
}

// The device holds a block's backward or the loss, never both: the
// working set is what is always there and the larger phase. The full
// logits of GPT 13B at batch 64 need 33 GB; in chunks the loss is small
// and the batch grows until a block's backward fills the device.
TEST(Planner, TheChunkedLossLetsTheBatchGrowUntilABlockFills) {
  const ModelShape shape = Preset("gpt-13b");
  const Machine machine = Roomy(25e9, 24 * kGiB);
  const LossChunks full{false, 0};
  absl::StatusOr<Plan> plan = MakePlan(
      shape, 64, 1024, machine, Attention::kFused, Granularity::kTensor, full);
  ASSERT_TRUE(absl::IsFailedPrecondition(plan.status()));
  EXPECT_THAT(plan.status().message(), HasSubstr("chunk the loss"));
  plan = MakePlan(shape, 64, 1024, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const ModelCounts& c = plan->counts;
  const DeviceWorkingSet set = WorkingSetOf(c, RecomputeUnit::kBlock);
  EXPECT_EQ(set.always, 4 * c.block_parameters + 4 * c.head_parameters);
  uint64_t largest = 0;  // mlp_up or mlp_act, b x s x 4h
  for (const SavedTensor& t : c.block_tensors)
    largest = std::max(largest, t.bytes);
  EXPECT_EQ(largest, 4 * c.hidden_bytes);
  EXPECT_EQ(set.block_backward, 2 * c.block_parameters +
                                    c.block_activation_bytes + c.hidden_bytes +
                                    largest);
  EXPECT_EQ(set.loss, c.logits_bytes + 2 * c.hidden_bytes);
  EXPECT_GT(set.block_backward, set.loss);
  EXPECT_EQ(plan->device_working_bytes, set.always + set.block_backward);
  // The chunks' second head product is charged to backward.
  absl::StatusOr<Plan> roomy_full =
      MakePlan(shape, 8, 1024, Roomy(25e9), Attention::kFused,
               Granularity::kTensor, full);
  absl::StatusOr<Plan> roomy_chunked = MakePlan(shape, 8, 1024, Roomy(25e9));
  ASSERT_TRUE(roomy_full.ok() && roomy_chunked.ok());
  EXPECT_NEAR(roomy_chunked->curve.front().backward.compute -
                  roomy_full->curve.front().backward.compute,
              roomy_chunked->counts.loss_recompute_flops / 100e12, 1e-9);
  EXPECT_GT(
      LargestBatch(shape, 1024, machine),
      2 * LargestBatch(shape, 1024, machine, 1 << 16, Attention::kFused, full));
}

// Where a whole block's backward does not fit, the plan recomputes it a
// sublayer at a time: the tensors between the sublayers and one
// sublayer's, each sublayer's forward charged once more.
TEST(Planner, ABlockTooLargeForTheDeviceRunsASublayerAtATime) {
  const ModelShape shape = Preset("gpt-13b");
  const Machine machine = Roomy(25e9, 24 * kGiB);
  absl::StatusOr<Plan> whole =
      MakePlan(shape, 128, 1024, machine, Attention::kFused,
               Granularity::kTensor, LossChunks{}, RecomputeUnit::kBlock);
  ASSERT_TRUE(absl::IsFailedPrecondition(whole.status()));
  absl::StatusOr<Plan> plan = MakePlan(shape, 128, 1024, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->recompute_unit, RecomputeUnit::kSublayer);
  const ModelCounts& c = plan->counts;
  EXPECT_GT(plan->block_unit_working_bytes, machine.device_bytes);
  EXPECT_EQ(plan->block_unit_working_bytes,
            WorkingSetOf(c, RecomputeUnit::kBlock).bytes());
  uint64_t kept = 0, attention = 0, mlp = 0, largest = 0;
  double sublayer_flops = 0;
  for (const SavedTensor& t : c.block_tensors) {
    largest = std::max(largest, t.bytes);
    (t.sublayer == 0 ? kept : t.sublayer == 1 ? attention : mlp) += t.bytes;
    if (t.sublayer > 0) sublayer_flops += t.recompute_flops;
  }
  EXPECT_GT(attention, 0u);
  EXPECT_GT(mlp, attention);
  EXPECT_EQ(WorkingSetOf(c, RecomputeUnit::kSublayer).block_backward,
            2 * c.block_parameters + kept + mlp + c.hidden_bytes + largest);
  EXPECT_EQ(plan->device_working_bytes,
            WorkingSetOf(c, RecomputeUnit::kSublayer).bytes());
  EXPECT_LE(plan->device_working_bytes, machine.device_bytes);
  // The price, in backward's compute: each sublayer's forward again.
  absl::StatusOr<Plan> roomy = MakePlan(shape, 128, 1024, Roomy(25e9));
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  EXPECT_EQ(roomy->recompute_unit, RecomputeUnit::kBlock);
  absl::StatusOr<Plan> forced =
      MakePlan(shape, 128, 1024, Roomy(25e9), Attention::kFused,
               Granularity::kTensor, LossChunks{}, RecomputeUnit::kSublayer);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_NEAR(forced->curve.front().backward.compute -
                  roomy->curve.front().backward.compute,
              shape.layers * sublayer_flops / 100e12, 1e-6);
  EXPECT_EQ(LargestBatch(shape, 1024, machine, 1 << 16, Attention::kFused,
                         LossChunks{}, RecomputeUnit::kAuto, ParamUnit::kBlock),
            128u);
}

// Llama 3 405B's shape.
ModelShape Llama405b() {
  ModelShape shape;
  shape.name = "llama-405b";
  shape.family = ModelShape::Family::kLlama;
  shape.layers = 126;
  shape.hidden = 16384;
  shape.heads = 128;
  shape.kv_heads = 8;
  shape.ffn = 53248;
  shape.vocab = 128256;
  shape.tied_embeddings = false;
  return shape;
}

// Where a block's weights and gradients leave no room, they stream a
// sublayer at a time: two sublayers' weights (and two blocks' norms) are
// always there, one sublayer's gradients in a block's backward; the
// sublayers' weights cross the link once more in backward.
TEST(Planner, WeightsStreamASublayerAtATimeWhereBlocksLeaveNoRoom) {
  const ModelShape shape = Llama405b();
  const Machine machine = Roomy(25e9, 24 * kGiB);
  absl::StatusOr<Plan> blocks =
      MakePlan(shape, 4, 1024, machine, Attention::kFused, Granularity::kTensor,
               LossChunks{}, RecomputeUnit::kAuto, ParamUnit::kBlock);
  ASSERT_TRUE(absl::IsFailedPrecondition(blocks.status()));
  EXPECT_THAT(blocks.status().message(), HasSubstr("two blocks' weights"));
  absl::StatusOr<Plan> plan = MakePlan(shape, 4, 1024, machine);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->param_unit, ParamUnit::kSublayer);
  EXPECT_EQ(plan->recompute_unit, RecomputeUnit::kSublayer);
  const ModelCounts& c = plan->counts;
  ASSERT_EQ(c.sublayer_parameters.size(), 2u);
  const uint64_t attention = c.sublayer_parameters[0];
  const uint64_t mlp = c.sublayer_parameters[1];
  const uint64_t own = c.block_parameters - attention - mlp;
  EXPECT_EQ(own, 2 * shape.hidden);  // the two RMSNorms
  EXPECT_EQ(mlp, 3 * shape.hidden * shape.ffn);
  const DeviceWorkingSet set =
      WorkingSetOf(c, RecomputeUnit::kSublayer, ParamUnit::kSublayer);
  const DeviceWorkingSet whole = WorkingSetOf(c, RecomputeUnit::kSublayer);
  EXPECT_EQ(set.always,
            2 * (2 * own + attention + mlp) + 4 * c.head_parameters);
  EXPECT_EQ(whole.block_backward - set.block_backward, 2 * attention);
  EXPECT_EQ(plan->device_working_bytes, set.bytes());
  EXPECT_EQ(plan->block_weights_working_bytes, whole.bytes());
  EXPECT_GT(plan->block_weights_working_bytes, machine.device_bytes);
  EXPECT_GE(LargestBatch(shape, 1024, machine), 4u);
  // The price: the attention's weights once more over the link in
  // backward (the MLP, the last sublayer, keeps its weights from the
  // block's recompute into its own).
  const Machine roomy = Roomy(25e9, 1024 * kGiB);
  absl::StatusOr<Plan> forced =
      MakePlan(shape, 4, 1024, roomy, Attention::kFused, Granularity::kTensor,
               LossChunks{}, RecomputeUnit::kSublayer, ParamUnit::kSublayer);
  absl::StatusOr<Plan> unforced =
      MakePlan(shape, 4, 1024, roomy, Attention::kFused, Granularity::kTensor,
               LossChunks{}, RecomputeUnit::kSublayer);
  ASSERT_TRUE(forced.ok() && unforced.ok());
  EXPECT_EQ(unforced->param_unit, ParamUnit::kBlock);
  EXPECT_NEAR(forced->curve.front().backward.host_to_device -
                  unforced->curve.front().backward.host_to_device,
              2.0 * shape.layers * attention / 25e9, 1e-6);
}

TEST(Planner, WeightsASublayerAtATimeNeedASublayerAtATimeBackward) {
  const ModelShape shape = Preset("gpt-1.3b");
  absl::StatusOr<Plan> plan = MakePlan(
      shape, 4, 1024, Roomy(25e9), Attention::kFused, Granularity::kTensor,
      LossChunks{}, RecomputeUnit::kBlock, ParamUnit::kSublayer);
  ASSERT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("param unit \"sublayer\""));
  ModelCounts counts = CountModel(shape, 4, 1024);
  counts.sublayer_parameters.clear();
  counts.recompute_unit = RecomputeUnit::kSublayer;
  counts.param_unit = ParamUnit::kSublayer;
  plan = PlanFromCounts(counts, 4, 1024, Roomy(25e9));
  ASSERT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("sublayers' parameters"));
  // Measured counts (no sublayers): auto streams whole blocks.
  counts.param_unit = ParamUnit::kAuto;
  plan = PlanFromCounts(counts, 4, 1024, Roomy(25e9));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->param_unit, ParamUnit::kBlock);
}

TEST(Planner, TheLargestBatchIsTheLastThatFits) {
  const ModelShape shape = Preset("gpt-13b");
  const Machine machine = Roomy(25e9, 24 * kGiB);
  const uint64_t largest = LargestBatch(shape, 1024, machine);
  ASSERT_GT(largest, 0u);
  EXPECT_TRUE(MakePlan(shape, largest, 1024, machine).ok());
  EXPECT_FALSE(MakePlan(shape, largest + 1, 1024, machine).ok());
}

}  // namespace
}  // namespace lohan
