#ifndef LOHAN_PLAN_JOB_PLAN_H_
#define LOHAN_PLAN_JOB_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/model_counts.h"
#include "plan/planner.h"
#include "proto/lohan.pb.h"

namespace lohan {

// PlanJob's translation between the proto and the planner: a running
// job's request (the client's profile of its device and model), lohand's
// measurement of its machine and what the job's layout fixes, into
// PlanFromCounts's terms, and its plan back into a v1::JobPlan. Every
// field of the request is hostile input: a malformed one is
// INVALID_ARGUMENT naming it ("profile.blocks", "profile: block_tensors[2]
// .recompute_flops ...").

// The unit a running job's block weights stream at, as its registered
// model says (ModelSpec.layer_places, which the model cut fills): the
// job's own setting (the plugin's param_unit), not the request's.
struct WeightUnits {
  // kSublayer when the job's largest block (by its layers' elements) has
  // unit layers; else, and for a spec without layer_places (an older
  // client's), kBlock.
  ParamUnit unit = ParamUnit::kBlock;
  // That block's elements as registered (its own layer's and its units';
  // a data-parallel rank's shards for such a job), and each unit's, in
  // unit order (empty with kBlock).
  uint64_t block_elements = 0;
  std::vector<uint64_t> unit_elements;
};

// The weight units of a registered spec. INVALID_ARGUMENT when its
// layer_places are neither none nor one per layer, when its elements pass
// 64 bits, or when the largest block has more than kMaxBlockSublayers
// units (the planner's bound).
absl::StatusOr<WeightUnits> WeightUnitsOf(const v1::ModelSpec& registered);

// What lohand knows of a running job beside its request.
struct JobFacts {
  // The job's arena: lohan's fixed host bytes for it.
  uint64_t arena_bytes = 0;
  // Its registered layout has a weight buffer per layer: the 16-bit
  // weights are resident in host memory, not streamed from the SSDs.
  bool weights_resident = false;
  // SSD space the job may still take for activations (its own limit, its
  // owner's quota and the array's free space, whichever is least).
  uint64_t ssd_room_bytes = 0;
  // Its share of lohand's state tier (its states there are read from RAM)
  // and its commit interval (they are written every commit_interval-th
  // iteration).
  uint64_t state_tier_bytes = 0;
  uint32_t commit_interval = 1;
  // The unit its registered layers stream at (WeightUnitsOf).
  WeightUnits weights;
};

// Saved tensors in all (blocks x block_tensors) a PlanJob may ask about:
// the plan lists one decision for each, and it must fit one response.
constexpr uint64_t kMaxJobPlanTensors = uint64_t{1} << 18;
// MeasuredTensor.name is kept up to this many bytes (it is for people).
constexpr size_t kMaxMeasuredNameBytes = 64;

// The counts the profile gives: blocks are the layers, block_tensors the
// saved tensors in order (always_offloaded ones never recomputed:
// SavedTensor.inter_block), outside_saved_bytes the logits' bytes.
// INVALID_ARGUMENT naming the field when blocks is not 1..65536, or
// block_tensors has more than kMaxBlockTensors entries or blocks x
// block_tensors passes kMaxJobPlanTensors; the numbers themselves are
// PlanFromCounts's to check.
absl::StatusOr<ModelCounts> CountsFromProfile(const v1::ClientProfile& profile);

// The machine: the device (memory, FLOP/s, both links, device_is_host)
// from the client's profile, each rate at least 1 per second and finite
// (INVALID_ARGUMENT naming the field otherwise); the SSDs (their number,
// each one's share of the array's measured bandwidth) and the optimizer
// (per-thread rate x threads) from lohand's. UNAVAILABLE when lohand's
// profile has no SSD figures. host_bytes and ssd_bytes stay 0: a job's
// layout stands in for them.
absl::StatusOr<Machine> MachineFromProfiles(const v1::ClientProfile& client,
                                            const v1::HostProfile& host);

// The proto form of `plan`, made from `profile`'s counts: per block one
// decision per profile.block_tensors entry, in order, and its mode
// ("keep": every decision "device"; "offload": every tensor that is not
// always offloaded recomputed, and there is one; "swap": none recomputed;
// else "mixed"), the predicted times and their binding resources, the
// bytes per tier, the weight unit and the device's working set with it
// and with whole blocks' weights, planned at `planned_unix_seconds`.
v1::JobPlan ToJobPlan(const Plan& plan, const v1::ClientProfile& profile,
                      int64_t planned_unix_seconds);

// All of the above: the plan for `request` (per block when
// request.per_block), the host room for activations its
// activation_host_bytes, the block weights streaming at `job.weights`'
// unit: a sublayer at a time, each unit's share of the profile's
// block_parameters its share of the registered block's elements (the
// backward then runs a sublayer at a time; the client's measured tensors
// all lie between sublayers). INVALID_ARGUMENT for a malformed request
// (the planner's words prefixed "profile: "; a block_parameters too small
// to give every unit a parameter), UNAVAILABLE as MachineFromProfiles,
// FAILED_PRECONDITION from the planner when a memory is short.
absl::StatusOr<v1::JobPlan> PlanForJob(const v1::PlanJobRequest& request,
                                       const v1::HostProfile& host,
                                       const JobFacts& job,
                                       int64_t now_unix_seconds);

}  // namespace lohan

#endif  // LOHAN_PLAN_JOB_PLAN_H_
