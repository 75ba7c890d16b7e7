#ifndef LOHAN_PLAN_PLANNER_H_
#define LOHAN_PLAN_PLANNER_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/layout_bytes.h"
#include "plan/model_counts.h"
#include "plan/model_shape.h"
#include "plan/trainer_host.h"
#include "plan/working_set.h"

namespace lohan {

// What the planner knows of a machine: measured (the profiler) or
// described (lohanctl plan's flags). Rates are bytes or FLOPs per second.
struct Machine {
  uint64_t device_bytes = 0;
  double device_flops = 0;  // sustained, for the training's math
  double host_to_device = 0;
  double device_to_host = 0;
  // Host memory lohan may use for the job: its pinned pool's share.
  uint64_t host_bytes = 0;
  uint32_t ssds = 0;
  double ssd_read = 0;     // per SSD
  double ssd_write = 0;    // per SSD
  uint64_t ssd_bytes = 0;  // all SSDs together; 0: not a limit
  // The store's block size (lohand's [store] block_size): each tensor
  // version's SSD space is a multiple of it.
  uint64_t ssd_block_bytes = 4096;
  // The CPU optimizer's parameters per second, all its threads; 0: not a
  // limit (it hides behind backward).
  double optimizer_params = 0;
  // The training device is the CPU the optimizer runs on (a machine
  // without a GPU): backward's compute and the optimizer take turns on the
  // same cores, so their times add instead of overlapping.
  bool device_is_host = false;
  // Host memory beside host_bytes that holds the job's optimizer states
  // (lohand's [pool] state_tier, the job's share): the states it holds are
  // read from RAM, not the SSDs. 0: none.
  uint64_t state_tier_bytes = 0;
  // lohand's commit interval: the states in the tier reach the SSDs every
  // commit_interval-th iteration (1: every one). At least 1.
  uint32_t commit_interval = 1;
  // host_bytes is all the host memory lohan may take, to be divided
  // between its pool (arena, activations) and the state tier as makes the
  // iteration fastest (state_tier_bytes is not used): what to give lohand
  // as [pool] host_pool and state_tier.
  bool split_host_memory = false;
};

// INVALID_ARGUMENT naming the field when a rate or size is missing or not
// a positive finite number.
absl::Status ValidateMachine(const Machine& machine);

enum class Decision { kDevice, kHost, kSsd, kRecompute };
const char* DecisionName(Decision decision);

// The resources a stage's time is the maximum of (the paper's Equations 4
// and 5, with lohan's own model-state traffic).
enum class Resource {
  kCompute,
  kDeviceToHost,
  kHostToDevice,
  kSsd,
  kOptimizer
};
const char* ResourceName(Resource resource);

struct StageTime {
  double compute = 0, device_to_host = 0, host_to_device = 0, ssd = 0,
         optimizer = 0;
  double seconds() const;
  double work() const;  // the sum of the terms
  Resource binding() const;
};

// The iteration time at one offloaded amount.
struct Estimate {
  // Saved tensors not recomputed: kept on the device (what its spare
  // memory holds of them) or offloaded.
  uint64_t saved_bytes = 0;
  uint64_t offloaded_bytes = 0;  // A_G2M: host and SSD, kept ones excluded
  uint64_t ssd_bytes = 0;        // of them, spilled past the host's room
  double recompute_flops = 0;
  StageTime forward, backward;
  // After backward: the update of the layer whose gradient comes last
  // (the token embedding, used first in forward), which nothing hides:
  // its states read and written, its Adam step.
  double tail = 0;
  double seconds() const {
    return forward.seconds() + backward.seconds() + tail;
  }
  // Every resource's busy time added up: between two points of equal
  // iteration time, the one with less work (fewer FLOPs recomputed, fewer
  // bytes moved) is better once overlap is not perfect.
  double work() const;
};

struct TensorPlan {
  std::string name;
  uint32_t block = 0;
  uint64_t bytes = 0;
  double benefit = 0;  // recompute FLOPs per byte
  Decision decision = Decision::kRecompute;
  bool inter_block = false;  // its SavedTensor's: never recomputed
};

struct Plan {
  ModelShape shape;  // MakePlan's; left empty by PlanFromCounts
  uint64_t batch = 0, seq = 0;
  ModelCounts counts;
  // Algorithm 1's outcome: 1, iteration time only grows with offloading
  // (only the block inputs are offloaded); 2, it only shrinks (everything
  // is); 3, a minimum in between.
  int search_case = 0;
  // Along the greedy order (highest offloading benefit first), from the
  // block inputs alone (curve[0]) to every saved tensor offloaded (or as
  // many as the SSDs can take): curve[i] has the first i offloaded.
  std::vector<Estimate> curve;
  size_t chosen = 0;                // index into curve: Algorithm 1's stop
  Estimate estimate;                // the chosen point, after keeping on device
  std::vector<TensorPlan> tensors;  // per block and class, in forward order
  // Per block, what the plugin's plan says for it: "offload" (its input
  // out, the rest recomputed: any of its tensors but the never-recomputed
  // ones is), "swap" (what it saves goes to host memory or the SSDs) or
  // "keep" (all on the device).
  std::vector<std::string> block_modes() const;
  // Bytes per tier of the saved tensors.
  uint64_t device_bytes = 0, host_bytes = 0, ssd_bytes = 0;
  uint64_t recomputed_bytes = 0;
  // How a recomputed block's backward runs (counts.recompute_unit, or
  // for kAuto the block when its working set fits the device, else a
  // sublayer at a time), and the device's working set with a whole block
  // (what decided it).
  RecomputeUnit recompute_unit = RecomputeUnit::kBlock;
  uint64_t block_unit_working_bytes = 0;
  // The unit the weights stream at (counts.param_unit, or for kAuto the
  // block when the working set fits with it, else a sublayer: only with a
  // sublayer-at-a-time backward), and the working set with whole blocks'
  // weights and the chosen recompute unit (what decided it).
  ParamUnit param_unit = ParamUnit::kBlock;
  uint64_t block_weights_working_bytes = 0;
  // Memory the plan needs besides the activations. The device's:
  // WorkingSetOf(counts, recompute_unit, param_unit).bytes().
  uint64_t device_working_bytes = 0;
  // lohan's layout for the job, as lohan.init sets it up on the host
  // memory the machine has (layout_bytes.h: its arena, the daemon's chunk
  // buffers, its SSD space). With a PlanLayout only arena_bytes is
  // filled: the job's arena.
  JobLayoutBytes layout_bytes;
  // Of the arena, the plugin's activation area: 0 unless activations go
  // to the SSDs (then kPluginActivationAreaBytes, if the host holds it;
  // else none go there).
  uint64_t activation_area_bytes = 0;
  // layout_bytes.host_bytes() (with a PlanLayout, its host_fixed_bytes).
  uint64_t host_fixed_bytes = 0;
  // A gradient and a weight buffer per layer (the 16-bit weights resident
  // in host memory); else streamed through shared ones and the SSDs.
  bool weights_in_host = false;
  uint64_t ssd_fixed_bytes = 0;  // layout_bytes.ssd_bytes(); or 0
  // What the training process holds in host memory at its peak besides
  // lohand (trainer_host.h): the activations on the host above, the one
  // read back from the SSDs, a save_pretrained's largest parameter, on a
  // CPU-only machine the device's memory; no frozen weights (every weight
  // trained). The arena, mapped in, apart.
  TrainerHostBytes trainer_host;
  double model_flops_per_second() const;  // useful FLOPs / iteration time
  // The host memory the plan gives lohan's pool (the machine's host_bytes,
  // less the state tier when it splits them) and the state tier, and the
  // optimizer states (12 bytes a parameter) the tier holds.
  uint64_t pool_bytes = 0, state_tier_bytes = 0, resident_state_bytes = 0;
  // The optimizer states' SSD traffic per iteration, averaged over the
  // commit interval: the spilled states read and written, the resident
  // ones written once every commit_interval iterations.
  double state_ssd_read_bytes = 0, state_ssd_write_bytes = 0;
};

// The plan for `shape` at `batch` x `seq` on `machine`: FAILED_PRECONDITION
// saying which memory is short, by how much, when it cannot fit (the
// device's working set, the host's fixed needs, the SSDs' capacity).
// What one step of the search decides: one saved tensor of a block, or
// all of a block's (the paper's per-layer decisions, and what the plugin
// applies today: a block recomputed, or every tensor it saves kept or
// swapped out).
enum class Granularity { kTensor, kBlock };

// INVALID_ARGUMENT for weights a sublayer at a time under a whole
// block's backward (`params` kSublayer, `unit` kBlock).
absl::StatusOr<Plan> MakePlan(const ModelShape& shape, uint64_t batch,
                              uint64_t seq, const Machine& machine,
                              Attention attention = Attention::kFused,
                              Granularity granularity = Granularity::kTensor,
                              LossChunks loss = {},
                              RecomputeUnit unit = RecomputeUnit::kAuto,
                              ParamUnit params = ParamUnit::kAuto);

// What a running job's layout already fixes, in place of the sizing of
// lohan's layout for the counts (layout_bytes.h, which MakePlan does):
// the room each memory has left for activations.
struct PlanLayout {
  // Host memory for swapped activations before the SSDs (the client's
  // activation_host_bytes).
  uint64_t activation_host_bytes = 0;
  // The 16-bit weights are resident in host memory (the registered
  // layout's weight buffers cover every layer); else they stream from the
  // SSDs.
  bool weights_in_host = false;
  // lohan's host bytes for the job (its arena: buffers, staging, resident
  // weights).
  uint64_t host_fixed_bytes = 0;
  // SSD space for activations: what the job's quota and the array's free
  // space leave it (its states are there already).
  uint64_t activation_ssd_bytes = 0;
};

// Bounds on the counts PlanFromCounts takes.
constexpr uint64_t kMaxPlanLayers = 65536;
constexpr size_t kMaxBlockTensors = 4096;
constexpr size_t kMaxBlockSublayers = 64;
// Saved tensors in all (layers x block_tensors): what the plan lists one
// by one.
constexpr uint64_t kMaxPlanTensors = uint64_t{1} << 20;

// INVALID_ARGUMENT naming the field unless `counts` (a client's
// measurement: hostile input) can be planned: layers 1..kMaxPlanLayers, at
// most kMaxBlockTensors per block and kMaxPlanTensors in all, every FLOP
// count finite and >= 0, byte sums (a block's, all blocks', the device's
// working set, the states) within 64 bits, parameters at least the
// block's, the largest layer's, the head's and the first layer's, and at
// most kMaxBlockSublayers sublayers, each with parameters, together at
// most the block's.
absl::Status ValidateCounts(const ModelCounts& counts);

// The plan from counts alone (measured by the client, or CountModel's) at
// `batch` x `seq` (>= 1; for the record, the counts are for them) on
// `machine`. `counts.block_activation_bytes` is taken as the sum of
// `block_tensors`' bytes. Without `layout` (null), the host and SSD needs
// are sized as MakePlan does (MakePlan is CountModel, then this); with
// one, the layout's rooms stand in for them and `machine.host_bytes` and
// `machine.ssd_bytes` are not used (the device's working set is still
// checked). INVALID_ARGUMENT for bad counts (ValidateCounts) or machine;
// FAILED_PRECONDITION, as MakePlan, when a memory is short.
absl::StatusOr<Plan> PlanFromCounts(
    const ModelCounts& counts, uint64_t batch, uint64_t seq,
    const Machine& machine, const PlanLayout* layout = nullptr,
    Granularity granularity = Granularity::kTensor);

// The largest batch (up to `limit`) that fits, 0 if none does.
uint64_t LargestBatch(const ModelShape& shape, uint64_t seq,
                      const Machine& machine, uint64_t limit = 1 << 16,
                      Attention attention = Attention::kFused,
                      LossChunks loss = {},
                      RecomputeUnit unit = RecomputeUnit::kAuto,
                      ParamUnit params = ParamUnit::kAuto);

}  // namespace lohan

#endif  // LOHAN_PLAN_PLANNER_H_
