#ifndef LOHAN_CLIENT_CTL_PLAN_COMMAND_H_
#define LOHAN_CLIENT_CTL_PLAN_COMMAND_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lohan {

// `lohanctl plan`: what fits on a described machine, how fast, and why.
// Needs no daemon.
struct PlanOptions {
  std::string model;  // a preset name or a config.json path
  std::vector<uint64_t> batches;
  uint64_t seq = 1024;
  // The machine, as the user describes it (sizes as "24GiB"; rates in GB/s
  // and TFLOPS).
  std::string device_memory, host_memory, ssd_capacity;
  double device_tflops = 0, h2d_gbps = 0, d2h_gbps = 0;
  uint32_t ssds = 0;
  double ssd_read_gbps = 0, ssd_write_gbps = 0;
  double optimizer_gparams = 0;  // 0: not a limit
  // "split", a size, "0", or empty (the default: "split" for a described
  // machine, lohand's state tier with --this-machine).
  std::string state_tier;
  // Not given: 1, or lohand's with --this-machine.
  std::optional<int64_t> commit_interval;
  // Host memory, SSDs and optimizer from the daemon on `socket` (its pool
  // and its measured profile); flags given override them.
  bool this_machine = false;
  bool device_is_host = false;  // training on the CPU itself
  std::string socket;
  bool eager_attention = false;  // saves the scores (else fused)
  // The loss over the full logits (the model's own), or in chunks of
  // loss_chunk_tokens (0: the plugin's default).
  bool full_logits = false;
  uint64_t loss_chunk_tokens = 0;
  // "auto" (the block when it fits the device, else a sublayer), "block"
  // or "sublayer": how a recomputed block's backward runs.
  std::string recompute_unit = "auto";
  // "auto" (the block when it fits the device, else a sublayer; with a
  // sublayer-at-a-time backward only), "block" or "sublayer": the unit a
  // block's weights stream at.
  std::string param_unit = "auto";
  bool per_block = false;  // decide whole blocks (what the plugin takes)
  bool json = false;
  bool tensors = false;   // the decision of every tensor class per block
  std::string plot_path;  // an SVG of iteration time vs offloaded bytes
};

// Prints the plans; returns the process's exit code (2: bad options, 1: a
// batch does not fit, 0: all fit).
int RunPlan(const PlanOptions& options);

}  // namespace lohan

#endif  // LOHAN_CLIENT_CTL_PLAN_COMMAND_H_
