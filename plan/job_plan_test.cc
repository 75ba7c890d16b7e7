#include "plan/job_plan.h"

#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A client's profile: 4 blocks of 6 saved tensors, the second always
// offloaded (backward cannot make it again), on a 4 GiB device.
v1::PlanJobRequest Request() {
  v1::PlanJobRequest request;
  request.set_job_id("j-000001");
  request.set_activation_host_bytes(64 * kMiB);
  v1::ClientProfile* p = request.mutable_profile();
  p->set_device_bytes(uint64_t{4} << 30);
  p->set_device_flops(10e12);
  p->set_host_to_device_bytes_per_second(20e9);
  p->set_device_to_host_bytes_per_second(20e9);
  p->set_blocks(4);
  p->set_parameters(40'000'000);
  p->set_block_parameters(8'000'000);
  p->set_largest_layer_parameters(8'000'000);
  p->set_head_parameters(4'000'000);
  p->set_first_layer_parameters(4'000'000);
  p->set_block_forward_flops(200e9);
  p->set_forward_flops(900e9);
  p->set_outside_saved_bytes(64 * kMiB);
  const struct {
    const char* name;
    uint64_t mib;
    double flops;
    bool always;
  } tensors[] = {{"aten.native_layer_norm", 8, 1e9, false},
                 {"aten.native_dropout", 8, 1e12, true},
                 {"aten.addmm", 24, 50e9, false},
                 {"aten.bmm", 8, 10e9, false},
                 {"aten.gelu", 32, 4e9, false},
                 {"aten.addmm", 32, 60e9, false}};
  for (const auto& t : tensors) {
    v1::MeasuredTensor* measured = p->add_block_tensors();
    measured->set_name(t.name);
    measured->set_bytes(t.mib * kMiB);
    measured->set_recompute_flops(t.flops);
    measured->set_always_offloaded(t.always);
  }
  p->set_iteration_seconds(1.5);
  p->set_batch(2);
  p->set_seq(512);
  return request;
}

v1::HostProfile Host() {
  v1::HostProfile host;
  host.add_ssds()->set_path("/ssd0");
  host.add_ssds()->set_path("/ssd1");
  host.set_array_read_bytes_per_second(8e9);
  host.set_array_write_bytes_per_second(4e9);
  host.set_optimizer_parameters_per_second_per_thread(100e6);
  host.set_optimizer_threads(8);
  return host;
}

JobFacts Facts() {
  return JobFacts{.arena_bytes = 96 * kMiB,
                  .weights_resident = true,
                  .ssd_room_bytes = 512 * kMiB};
}

TEST(JobPlan, TheProfileBecomesCountsAndAMachine) {
  v1::PlanJobRequest request = Request();
  request.mutable_profile()->mutable_block_tensors(0)->set_name(
      std::string(1000, 'x'));
  absl::StatusOr<ModelCounts> counts = CountsFromProfile(request.profile());
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->layers, 4u);
  EXPECT_EQ(counts->head_parameters, 4'000'000u);
  EXPECT_EQ(counts->first_layer_parameters, 4'000'000u);
  EXPECT_EQ(counts->logits_bytes, 64 * kMiB);
  ASSERT_EQ(counts->block_tensors.size(), 6u);
  EXPECT_EQ(counts->block_tensors[0].name.size(), kMaxMeasuredNameBytes);
  EXPECT_TRUE(counts->block_tensors[1].inter_block);
  EXPECT_FALSE(counts->block_tensors[2].inter_block);
  EXPECT_EQ(counts->block_tensors[2].bytes, 24 * kMiB);

  absl::StatusOr<Machine> m = MachineFromProfiles(request.profile(), Host());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->ssds, 2u);
  EXPECT_EQ(m->ssd_read, 4e9);
  EXPECT_EQ(m->ssd_write, 2e9);
  EXPECT_EQ(m->optimizer_params, 800e6);
  EXPECT_EQ(m->device_flops, 10e12);
  EXPECT_FALSE(m->device_is_host);
  // lohand still measuring (or its figures lost): ask again later.
  EXPECT_TRUE(absl::IsUnavailable(
      MachineFromProfiles(request.profile(), v1::HostProfile()).status()));
}

TEST(JobPlan, OneDecisionPerMeasuredTensorAndTheRoomsHonoured) {
  for (bool per_block : {false, true}) {
    for (double link : {1e6, 20e9, 1e13}) {
      v1::PlanJobRequest request = Request();
      request.set_per_block(per_block);
      request.mutable_profile()->set_host_to_device_bytes_per_second(link);
      request.mutable_profile()->set_device_to_host_bytes_per_second(link);
      absl::StatusOr<v1::JobPlan> plan =
          PlanForJob(request, Host(), Facts(), 1234);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(plan->planned_unix_seconds(), 1234);
      EXPECT_EQ(plan->profiled_iteration_seconds(), 1.5);
      EXPECT_GT(plan->predicted_iteration_seconds(), 0);
      EXPECT_DOUBLE_EQ(plan->predicted_iteration_seconds(),
                       plan->predicted_forward_seconds() +
                           plan->predicted_backward_seconds() +
                           plan->predicted_tail_seconds());
      EXPECT_FALSE(plan->forward_binding().empty());
      ASSERT_EQ(plan->blocks_size(), 4);
      ASSERT_EQ(plan->block_modes_size(), 4);
      for (int b = 0; b < 4; ++b) {
        const v1::BlockDecisions& block = plan->blocks(b);
        ASSERT_EQ(block.decisions_size(), 6);
        EXPECT_NE(block.decisions(1), "recompute") << b;
        int recomputed = 0, device = 0;
        for (const std::string& d : block.decisions()) {
          EXPECT_THAT(
              (std::vector<std::string>{"device", "host", "ssd", "recompute"}),
              ::testing::Contains(d));
          recomputed += d == "recompute";
          device += d == "device";
        }
        const std::string& mode = plan->block_modes(b);
        if (device == 6) {
          EXPECT_EQ(mode, "keep");
        } else if (recomputed == 5) {
          EXPECT_EQ(mode, "offload");
        } else if (recomputed == 0) {
          EXPECT_EQ(mode, "swap");
        } else {
          EXPECT_EQ(mode, "mixed");
          EXPECT_FALSE(per_block) << "a per-block plan mixes nothing";
        }
      }
      EXPECT_LE(plan->host_bytes(), request.activation_host_bytes());
      EXPECT_LE(plan->ssd_bytes(), Facts().ssd_room_bytes);
    }
  }
  // A narrow link: the always-offloaded tensors go out, the rest is
  // recomputed.
  v1::PlanJobRequest narrow = Request();
  narrow.mutable_profile()->set_host_to_device_bytes_per_second(1e6);
  narrow.mutable_profile()->set_device_to_host_bytes_per_second(1e6);
  // Room for the working set (about 205 MiB) and little else: what is not
  // recomputed must cross the link.
  narrow.mutable_profile()->set_device_bytes(224 * kMiB);
  absl::StatusOr<v1::JobPlan> plan = PlanForJob(narrow, Host(), Facts(), 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->search_case(), 1);
  for (const std::string& mode : plan->block_modes()) {
    EXPECT_EQ(mode, "offload");
  }
}

// The job's share of the state tier: its states there cost the SSDs no
// read, and with a commit interval of N a write every N-th iteration.
TEST(JobPlan, TheJobsStateTierShareLightensTheSsds) {
  v1::PlanJobRequest request = Request();
  // SSDs slow enough to bind backward.
  v1::HostProfile host = Host();
  host.set_array_read_bytes_per_second(1e9);
  host.set_array_write_bytes_per_second(1e9);
  absl::StatusOr<v1::JobPlan> none = PlanForJob(request, host, Facts(), 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->backward_binding(), "SSDs");
  JobFacts facts = Facts();
  facts.state_tier_bytes = 12 * 40'000'000;  // every state
  facts.commit_interval = 4;
  absl::StatusOr<v1::JobPlan> tier = PlanForJob(request, host, facts, 0);
  ASSERT_TRUE(tier.ok()) << tier.status();
  // 24 B/param through the SSDs before (0.96 s at 1 GB/s), 3 now (0.12 s):
  // something else binds.
  EXPECT_NEAR(none->predicted_backward_seconds(), 0.96, 1e-9);
  EXPECT_LT(tier->predicted_backward_seconds(), 0.96 / 4);
  EXPECT_NE(tier->backward_binding(), "SSDs");
  EXPECT_LT(tier->predicted_tail_seconds(), none->predicted_tail_seconds());
}

TEST(JobPlan, HostileProfilesAreRefusedByName) {
  auto refused = [](const v1::PlanJobRequest& request) {
    absl::StatusOr<v1::JobPlan> plan = PlanForJob(request, Host(), Facts(), 0);
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
    return std::string(plan.status().message());
  };
  v1::PlanJobRequest r = Request();
  r.mutable_profile()->set_blocks(0);
  EXPECT_THAT(refused(r), HasSubstr("profile.blocks"));
  r.mutable_profile()->set_blocks(65537);
  EXPECT_THAT(refused(r), HasSubstr("profile.blocks"));
  r = Request();
  for (int i = 0; i < 5000; ++i) r.mutable_profile()->add_block_tensors();
  EXPECT_THAT(refused(r), HasSubstr("profile.block_tensors"));
  r = Request();
  r.mutable_profile()->set_blocks(65536);
  EXPECT_THAT(refused(r), HasSubstr("at most 262144"));
  r = Request();
  r.mutable_profile()->mutable_block_tensors(3)->set_recompute_flops(-1);
  EXPECT_THAT(refused(r),
              HasSubstr("profile: block_tensors[3].recompute_flops"));
  r = Request();
  r.mutable_profile()->set_forward_flops(NAN);
  EXPECT_THAT(refused(r), HasSubstr("forward_flops"));
  r = Request();
  r.mutable_profile()->mutable_block_tensors(0)->set_bytes(UINT64_MAX);
  EXPECT_THAT(refused(r), HasSubstr("64 bits"));
  r = Request();
  r.mutable_profile()->set_block_parameters(50'000'000);
  EXPECT_THAT(refused(r), HasSubstr("block_parameters"));
  r = Request();
  r.mutable_profile()->set_batch(0);
  EXPECT_THAT(refused(r), HasSubstr("batch"));
  for (double bad : {0.0, -5.0, 0.5, double{NAN}, double{INFINITY}}) {
    r = Request();
    r.mutable_profile()->set_device_flops(bad);
    EXPECT_THAT(refused(r), HasSubstr("profile.device_flops"));
  }
  r = Request();
  r.mutable_profile()->set_device_bytes(0);
  EXPECT_THAT(refused(r), HasSubstr("profile.device_bytes"));
}

TEST(JobPlan, MemoryTooShortIsThePlannersFailedPrecondition) {
  v1::PlanJobRequest request = Request();
  request.mutable_profile()->set_device_bytes(64 * kMiB);
  absl::StatusOr<v1::JobPlan> plan = PlanForJob(request, Host(), Facts(), 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("device's working set"));
  // Neither host memory nor SSD room for what is never recomputed.
  request = Request();
  request.set_activation_host_bytes(0);
  JobFacts facts = Facts();
  facts.ssd_room_bytes = 0;
  // The working set (4 x 8M block parameters and 4 x 4M head parameters,
  // then a block's backward, 2 x 8M, 112 MiB of its tensors and the
  // gradient of its largest, 32 MiB, larger than the 64 MiB of logits) and
  // 1 MiB: nothing can stay on the device either.
  request.mutable_profile()->set_device_bytes(48'000'000 + 16'000'000 +
                                              144 * kMiB + kMiB);
  plan = PlanForJob(request, Host(), facts, 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("never recomputed"));
}

// A registered spec as the model cut makes it: the embeddings and the
// head, then per block its own layer (the norms) and its two units
// (attention, MLP), each of `scale` x the elements below (a data-parallel
// rank's shards scale them down alike).
v1::ModelSpec Registered(uint64_t scale_down = 1) {
  v1::ModelSpec spec;
  auto add = [&](int32_t block, uint32_t unit, uint64_t elements) {
    spec.add_layer_elements(elements / scale_down);
    v1::LayerPlace* place = spec.add_layer_places();
    place->set_block(block);
    place->set_unit(unit);
  };
  add(-1, 0, 4'000'000);
  add(-1, 0, 4'000'000);
  for (int32_t block = 0; block < 4; ++block) {
    add(block, 0, 1'000'000);
    add(block, 1, 2'000'000);
    add(block, 2, 5'000'000);
  }
  return spec;
}

TEST(WeightUnitsOf, TheRegisteredLayersSayTheUnitAndEachUnitsElements) {
  absl::StatusOr<WeightUnits> units = WeightUnitsOf(Registered());
  ASSERT_TRUE(units.ok()) << units.status();
  EXPECT_EQ(units->unit, ParamUnit::kSublayer);
  EXPECT_EQ(units->block_elements, 8'000'000u);
  EXPECT_THAT(units->unit_elements,
              ::testing::ElementsAre(2'000'000u, 5'000'000u));
  // A spec without places (an older client's, one made by hand), or whose
  // blocks have no unit layers: whole blocks.
  v1::ModelSpec old = Registered();
  old.clear_layer_places();
  units = WeightUnitsOf(old);
  ASSERT_TRUE(units.ok()) << units.status();
  EXPECT_EQ(units->unit, ParamUnit::kBlock);
  EXPECT_TRUE(units->unit_elements.empty());
  v1::ModelSpec whole;
  for (int32_t block = -1; block < 4; ++block) {
    whole.add_layer_elements(8'000'000);
    whole.add_layer_places()->set_block(block);
  }
  units = WeightUnitsOf(whole);
  ASSERT_TRUE(units.ok()) << units.status();
  EXPECT_EQ(units->unit, ParamUnit::kBlock);
  // Places that are not one per layer, or more units than the planner
  // takes, are refused.
  v1::ModelSpec short_places = Registered();
  short_places.mutable_layer_places()->RemoveLast();
  EXPECT_THAT(WeightUnitsOf(short_places).status().message(),
              HasSubstr("13 layer_places for 14 layers"));
  v1::ModelSpec many;
  for (uint32_t unit = 1; unit <= 65; ++unit) {
    many.add_layer_elements(10);
    v1::LayerPlace* place = many.add_layer_places();
    place->set_block(0);
    place->set_unit(unit);
  }
  EXPECT_TRUE(absl::IsInvalidArgument(WeightUnitsOf(many).status()));
  EXPECT_THAT(WeightUnitsOf(many).status().message(),
              HasSubstr("in 65 units; the planner takes at most 64"));
}

// The device holds what the job's own unit needs: a job registered a
// sublayer at a time is planned so, on a device too small for whole
// blocks' weights.
TEST(JobPlan, AJobRegisteredASublayerAtATimeIsPlannedSo) {
  // Request()'s working set with whole blocks' weights: 2 x 2 x 8M block
  // and 4 x 4M head bytes always, then a block's backward (2 x 8M
  // gradients, 112 MiB of tensors and 32 MiB, its largest's gradient).
  const uint64_t block_working = 64'000'000 + 144 * kMiB;
  // A sublayer at a time (units of 2M and 5M, 1M of the block's own): 2 x
  // (2 x 1M + 5M + 2M) weights and the head's 16M always, then 2 x (1M +
  // 5M) gradients and the same tensors.
  const uint64_t sublayer_working = 46'000'000 + 144 * kMiB;
  v1::PlanJobRequest request = Request();
  request.mutable_profile()->set_device_bytes(55'000'000 + 144 * kMiB);
  absl::StatusOr<v1::JobPlan> whole = PlanForJob(request, Host(), Facts(), 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(whole.status())) << whole.status();
  EXPECT_THAT(whole.status().message(), HasSubstr("two blocks' weights"));
  for (uint64_t shards : {1, 2}) {
    JobFacts facts = Facts();
    absl::StatusOr<WeightUnits> units = WeightUnitsOf(Registered(shards));
    ASSERT_TRUE(units.ok()) << units.status();
    facts.weights = *units;
    absl::StatusOr<v1::JobPlan> plan = PlanForJob(request, Host(), facts, 0);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->param_unit(), "sublayer");
    // A rank's shards are the same shares of the profile's block.
    EXPECT_EQ(plan->device_working_bytes(), sublayer_working) << shards;
    EXPECT_EQ(plan->block_weights_working_bytes(), block_working) << shards;
    EXPECT_EQ(plan->blocks_size(), 4);
  }
  // Whole blocks where they fit: the unit and both working sets said.
  absl::StatusOr<v1::JobPlan> roomy = PlanForJob(Request(), Host(), Facts(), 0);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  EXPECT_EQ(roomy->param_unit(), "block");
  EXPECT_EQ(roomy->device_working_bytes(), block_working);
  EXPECT_EQ(roomy->block_weights_working_bytes(), block_working);
  // A profile whose block is too small to give each unit a parameter.
  JobFacts facts = Facts();
  facts.weights = *WeightUnitsOf(Registered());
  request = Request();
  request.mutable_profile()->set_block_parameters(3);
  absl::StatusOr<v1::JobPlan> bad = PlanForJob(request, Host(), facts, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_THAT(bad.status().message(),
              HasSubstr("profile.block_parameters (3) is too few"));
}

}  // namespace
}  // namespace lohan
