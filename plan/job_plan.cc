#include "plan/job_plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"

namespace lohan {

absl::StatusOr<WeightUnits> WeightUnitsOf(const v1::ModelSpec& registered) {
  WeightUnits units;
  const int places = registered.layer_places_size();
  if (places == 0) return units;  // not said: whole blocks
  if (places != registered.layer_elements_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the registered model has ", places, " layer_places for ",
                     registered.layer_elements_size(), " layers"));
  }
  // Per block: its elements, and per unit (0: its own layer) its layers'.
  std::map<int32_t, std::pair<uint64_t, std::map<uint32_t, uint64_t>>> blocks;
  for (int l = 0; l < places; ++l) {
    const v1::LayerPlace& place = registered.layer_places(l);
    if (place.block() < 0) continue;
    const uint64_t elements = registered.layer_elements(l);
    auto& [total, by_unit] = blocks[place.block()];
    if (__builtin_add_overflow(total, elements, &total)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the registered model's block ", place.block(),
                       " has more than 2^64 elements"));
    }
    by_unit[place.unit()] += elements;  // at most its block's
  }
  const auto largest = std::max_element(
      blocks.begin(), blocks.end(), [](const auto& a, const auto& b) {
        return a.second.first < b.second.first;
      });
  if (largest == blocks.end()) return units;
  const auto& [block_elements, by_unit] = largest->second;
  for (const auto& [unit, elements] : by_unit) {
    if (unit > 0) units.unit_elements.push_back(elements);
  }
  if (units.unit_elements.empty() || block_elements == 0) return WeightUnits{};
  if (units.unit_elements.size() > kMaxBlockSublayers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the registered model's block ", largest->first, " streams its ",
        "weights in ", units.unit_elements.size(), " units; the planner takes ",
        "at most ", kMaxBlockSublayers));
  }
  units.unit = ParamUnit::kSublayer;
  units.block_elements = block_elements;
  return units;
}

namespace {

// `counts` with the block weights streaming at `units`' unit: each unit's
// share of the profile's block_parameters is its share of the registered
// block's elements (exact for a job holding whole layers; a data-parallel
// rank's shards are the same shares but for their padding).
absl::Status SplitBlocks(const WeightUnits& units, ModelCounts& counts) {
  if (units.unit != ParamUnit::kSublayer) return absl::OkStatus();
  counts.param_unit = ParamUnit::kSublayer;
  // Weights a sublayer at a time run backward a sublayer at a time.
  counts.recompute_unit = RecomputeUnit::kSublayer;
  for (const uint64_t elements : units.unit_elements) {
    const uint64_t parameters =
        absl::Uint128Low64(absl::uint128(counts.block_parameters) * elements /
                           units.block_elements);
    if (parameters == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile.block_parameters (", counts.block_parameters,
                       ") is too few for the registered model's block of ",
                       units.unit_elements.size(), " units (",
                       units.block_elements, " elements)"));
    }
    counts.sublayer_parameters.push_back(parameters);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelCounts> CountsFromProfile(const v1::ClientProfile& p) {
  if (p.blocks() == 0 || p.blocks() > kMaxPlanLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile.blocks must be from 1 to ", kMaxPlanLayers,
                     ", got ", p.blocks()));
  }
  const uint64_t tensors = static_cast<uint64_t>(p.block_tensors_size());
  if (tensors > kMaxBlockTensors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile.block_tensors has ", tensors, " entries; at most ",
        kMaxBlockTensors, " saved tensors per block are planned"));
  }
  if (p.blocks() * tensors > kMaxJobPlanTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile.blocks x profile.block_tensors is ", p.blocks(),
                     " x ", tensors, " saved tensors; a plan decides at most ",
                     kMaxJobPlanTensors, " in all"));
  }
  ModelCounts c;
  c.layers = p.blocks();
  c.parameters = p.parameters();
  c.block_parameters = p.block_parameters();
  c.largest_layer_parameters = p.largest_layer_parameters();
  c.head_parameters = p.head_parameters();
  c.first_layer_parameters = p.first_layer_parameters();
  c.forward_flops = p.forward_flops();
  c.block_forward_flops = p.block_forward_flops();
  c.logits_bytes = p.outside_saved_bytes();
  c.block_tensors.reserve(tensors);
  for (const v1::MeasuredTensor& measured : p.block_tensors()) {
    c.block_tensors.push_back(
        SavedTensor{.name = measured.name().substr(0, kMaxMeasuredNameBytes),
                    .bytes = measured.bytes(),
                    .recompute_flops = measured.recompute_flops(),
                    .inter_block = measured.always_offloaded()});
    // PlanFromCounts sums them, checked.
  }
  return c;
}

absl::StatusOr<Machine> MachineFromProfiles(const v1::ClientProfile& client,
                                            const v1::HostProfile& host) {
  if (client.device_bytes() == 0) {
    return absl::InvalidArgumentError(
        "profile.device_bytes must be the device memory the job may use, "
        "got 0");
  }
  for (const auto& [field, rate] :
       {std::pair<const char*, double>{"device_flops", client.device_flops()},
        {"host_to_device_bytes_per_second",
         client.host_to_device_bytes_per_second()},
        {"device_to_host_bytes_per_second",
         client.device_to_host_bytes_per_second()}}) {
    if (!std::isfinite(rate) || rate < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profile.", field,
          " must be a finite rate of at least 1 per second, got ", rate));
    }
  }
  const double read = host.array_read_bytes_per_second();
  const double write = host.array_write_bytes_per_second();
  if (host.ssds_size() == 0 || !std::isfinite(read) || !(read > 0) ||
      !std::isfinite(write) || !(write > 0)) {
    return absl::UnavailableError(
        "lohand's machine profile has no SSD bandwidth (see its log; "
        "`lohand --reprofile` measures again)");
  }
  Machine m;
  m.device_bytes = client.device_bytes();
  m.device_flops = client.device_flops();
  m.host_to_device = client.host_to_device_bytes_per_second();
  m.device_to_host = client.device_to_host_bytes_per_second();
  m.device_is_host = client.device_is_host();
  m.ssds = static_cast<uint32_t>(host.ssds_size());
  // Measured all at once: each SSD's share of what the array did.
  m.ssd_read = read / m.ssds;
  m.ssd_write = write / m.ssds;
  const double optimizer = host.optimizer_parameters_per_second_per_thread() *
                           host.optimizer_threads();
  m.optimizer_params =
      std::isfinite(optimizer) && optimizer > 0 ? optimizer : 0;
  return m;
}

v1::JobPlan ToJobPlan(const Plan& plan, const v1::ClientProfile& profile,
                      int64_t planned_unix_seconds) {
  v1::JobPlan out;
  const Estimate& e = plan.estimate;
  out.set_search_case(plan.search_case);
  out.set_predicted_iteration_seconds(e.seconds());
  out.set_predicted_forward_seconds(e.forward.seconds());
  out.set_predicted_backward_seconds(e.backward.seconds());
  out.set_predicted_tail_seconds(e.tail);
  out.set_forward_binding(ResourceName(e.forward.binding()));
  out.set_backward_binding(ResourceName(e.backward.binding()));
  const size_t per_block = plan.counts.block_tensors.size();
  for (uint64_t b = 0; b < plan.counts.layers; ++b) {
    v1::BlockDecisions* block = out.add_blocks();
    bool all_device = true, any_recomputable = false, all_recomputed = true,
         any_recomputed = false;
    for (size_t t = 0; t < per_block; ++t) {
      const TensorPlan& tensor = plan.tensors[b * per_block + t];
      block->add_decisions(DecisionName(tensor.decision));
      const bool recomputed = tensor.decision == Decision::kRecompute;
      all_device &= tensor.decision == Decision::kDevice;
      any_recomputed |= recomputed;
      if (!tensor.inter_block) {
        any_recomputable = true;
        all_recomputed &= recomputed;
      }
    }
    out.add_block_modes(all_device                           ? "keep"
                        : any_recomputable && all_recomputed ? "offload"
                        : !any_recomputed                    ? "swap"
                                                             : "mixed");
  }
  out.set_device_bytes(plan.device_bytes);
  out.set_host_bytes(plan.host_bytes);
  out.set_ssd_bytes(plan.ssd_bytes);
  out.set_recomputed_bytes(plan.recomputed_bytes);
  out.set_recompute_flops(e.recompute_flops);
  out.set_profiled_iteration_seconds(profile.iteration_seconds());
  out.set_planned_unix_seconds(planned_unix_seconds);
  out.set_param_unit(ParamUnitName(plan.param_unit));
  out.set_device_working_bytes(plan.device_working_bytes);
  out.set_block_weights_working_bytes(plan.block_weights_working_bytes);
  return out;
}

absl::StatusOr<v1::JobPlan> PlanForJob(const v1::PlanJobRequest& request,
                                       const v1::HostProfile& host,
                                       const JobFacts& job,
                                       int64_t now_unix_seconds) {
  const v1::ClientProfile& profile = request.profile();
  absl::StatusOr<ModelCounts> counts = CountsFromProfile(profile);
  if (!counts.ok()) return counts.status();
  if (absl::Status split = SplitBlocks(job.weights, *counts); !split.ok()) {
    return split;
  }
  absl::StatusOr<Machine> machine = MachineFromProfiles(profile, host);
  if (!machine.ok()) return machine.status();
  machine->state_tier_bytes = job.state_tier_bytes;
  machine->commit_interval = std::max(1u, job.commit_interval);
  const PlanLayout layout{
      .activation_host_bytes = request.activation_host_bytes(),
      .weights_in_host = job.weights_resident,
      .host_fixed_bytes = job.arena_bytes,
      .activation_ssd_bytes = job.ssd_room_bytes};
  absl::StatusOr<Plan> plan = PlanFromCounts(
      *counts, profile.batch(), profile.seq(), *machine, &layout,
      request.per_block() ? Granularity::kBlock : Granularity::kTensor);
  if (absl::IsInvalidArgument(plan.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: ", plan.status().message()));
  }
  if (!plan.ok()) return plan.status();
  return ToJobPlan(*plan, profile, now_unix_seconds);
}

}  // namespace lohan
