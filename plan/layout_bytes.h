#ifndef LOHAN_PLAN_LAYOUT_BYTES_H_
#define LOHAN_PLAN_LAYOUT_BYTES_H_

// lohan's own layout of a model the plugin trains, in bytes: the arena the
// daemon sizes for it, the daemon's chunk buffers beside it, and what the
// job keeps and sets aside on the SSDs, all from the daemon's layout code
// (layout/: arena_bytes.h, StateLayout, job_space.h and the store's
// footprint rule); tests/python/test_plan_memory.py checks them against
// what a real run allocates.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace lohan {

// Shared gradient and weight buffers the plugin streams through unless
// told otherwise (lohan.init's stream_buffers).
inline constexpr uint64_t kPluginStreamBuffers = 4;
// The plugin's activation area when it swaps activations to the SSDs
// (lohan.init's activation_buffer_bytes).
inline constexpr uint64_t kPluginActivationAreaBytes = uint64_t{16} << 20;

// The arena CreateJob sizes for the plugin's model (daemon/session's
// ArenaBytes): a gradient and a weight buffer of `element_bytes` an element
// per layer, or, with 0 < stream_buffers < layers, `stream_buffers` of each
// kind as large as the largest layer, beside the staging slot, the
// activation area and the control allowance.
// REQUIRES: layer_elements is not empty.
uint64_t PluginArenaBytes(const std::vector<uint64_t>& layer_elements,
                          uint64_t element_bytes, uint64_t activation_bytes,
                          uint64_t stream_buffers);

// The shared buffers the plugin's buffers="streamed" (or "auto" on a pool
// too small for one buffer per layer) takes for `layers` layers:
// min(kPluginStreamBuffers, layers - 1); 0 (one buffer per layer) for one.
uint64_t PluginStreamBuffers(uint64_t layers);

// One layout's bytes (see JobLayoutBytes).
struct JobLayoutBytes {
  uint64_t stream_buffers = 0;  // 0: resident (a buffer per layer)
  uint64_t arena_bytes = 0;     // PluginArenaBytes
  // The daemon's chunk buffers for the job (its update pipeline's, outside
  // the arena) and, streamed, its weight handoff
  // (SessionStatus.update_buffer_bytes).
  uint64_t update_buffer_bytes = 0;
  // SSD space of the tensors the job keeps, one version each: the meta,
  // the fp32 masters and moments in chunks and, streamed, the chunks'
  // 16-bit copies (what its owner holds once its session has closed);
  // and their sizes before block rounding (Job.ssd_bytes then).
  uint64_t ssd_state_bytes = 0;
  uint64_t ssd_state_tensor_bytes = 0;
  // SSD space of one iteration's streamed gradients (0 when resident).
  uint64_t ssd_scratch_bytes = 0;
  // What registering the model sets aside on the SSDs
  // (SessionStatus.ssd_set_aside_bytes): two versions of every kept
  // tensor and a third of the largest per chunk buffer and one more, and
  // the streamed gradients (SetAsideBytes).
  uint64_t ssd_set_aside_bytes = 0;
  // Each state chunk's parameters, in forward order (the daemon's default
  // chunks): the units lohand's state tier holds whole.
  std::vector<uint64_t> chunk_elements;
  uint64_t host_bytes() const { return arena_bytes + update_buffer_bytes; }
  // The SSD space the job needs before activations: the set-aside (the
  // streamed gradients inside it).
  uint64_t ssd_bytes() const { return ssd_set_aside_bytes; }
};

// The bytes of a 16-bit (bf16 or fp16) model of `layer_elements` trained
// as lohan.init does by default (fp32 moments, no AMSGrad, the daemon's
// default chunk, its default chunk buffers), resident or streamed
// (PluginStreamBuffers; a one-layer model is resident either way), with an
// activation area of `activation_bytes`, on a store of `store_block_bytes`.
// INVALID_ARGUMENT naming the problem for a layout the daemon would refuse
// (an empty layer, more than 2^20 chunks in one) or one whose bytes pass
// 64 bits.
absl::StatusOr<JobLayoutBytes> LayoutBytes(
    const std::vector<uint64_t>& layer_elements, bool streamed,
    uint64_t activation_bytes, uint64_t store_block_bytes);

}  // namespace lohan

#endif  // LOHAN_PLAN_LAYOUT_BYTES_H_
