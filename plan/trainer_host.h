#ifndef LOHAN_PLAN_TRAINER_HOST_H_
#define LOHAN_PLAN_TRAINER_HOST_H_

// What the training process holds in host memory at its peak besides
// lohand, under the plugin with its blocks' weights offloaded
// (params="offload", a GPU's default): the one place the planner counts
// it. The parts, as plugins/pytorch/lohan holds them:
// - activations offloaded to host memory (activation_store.py: a pinned
//   copy of each block input or swapped tensor, up to
//   activation_host_bytes); torch's pinned allocator keeps their blocks
//   cached after backward, so they stay the process's between steps;
// - of the activations on the SSDs, the one being read back: backward's
//   get reads a tensor whole into fresh pinned memory before copying it
//   up (the arena's activation area is lohan's);
// - the frozen block weights' pinned host copies (params.py
//   FrozenWeights: a PEFT base's, up to frozen_host_bytes; none when every
//   weight is trained);
// - a checkpoint: loading one (weights=PATH, resume=) stages each layer's
//   rank slice straight into the arena's staging slot with ranged reads
//   (client/checkpoint StageLayer) and engine.save writes from the arena:
//   nothing of the process's own; save_pretrained converts one tensor at a
//   time to its 16-bit output dtype (pretrained.py): the largest
//   parameter's. A load and a save never overlap; a save comes on top of
//   the activations' cached blocks.
// - with a CPU for the device (Machine::device_is_host), the device's
//   working set and the activations it keeps are host memory too.
// Not counted: torch's and CUDA's own baseline (the CUDA context, the
// library code, the caching allocators' slack), the model's buffers,
// lohan's arena (shared memory lohand allocates, mapped into the process:
// reported apart as `arena_mapped`, counted as lohand's), and what a
// caller asks for whole (model.state_dict() or engine.master_weights()
// of an offloaded model bring every layer into host memory).

#include <cstdint>

namespace lohan {

// What the plan knows that the trainer's host memory depends on.
struct TrainerHostInputs {
  uint64_t host_activation_bytes = 0;     // the plan's activations on the host
  uint64_t largest_ssd_tensor_bytes = 0;  // of the activations on the SSDs
  uint64_t frozen_host_bytes = 0;   // frozen block weights kept on the host
  uint64_t largest_parameter = 0;   // elements: the embedding, usually
  uint64_t save_element_bytes = 2;  // save_pretrained's 16-bit dtype
  uint64_t arena_bytes = 0;         // lohand's arena, mapped in
  // device_is_host: the device's working set and the activations it keeps.
  uint64_t device_in_host_bytes = 0;
};

// The parts (see the file's comment) and their sum at the peak.
struct TrainerHostBytes {
  uint64_t activations = 0;
  uint64_t activation_read = 0;
  uint64_t frozen_weights = 0;
  uint64_t checkpoint_load = 0;  // 0: ranged reads into the arena's slot
  uint64_t checkpoint_save = 0;  // save_pretrained's one tensor
  uint64_t device = 0;           // device_is_host only
  uint64_t arena_mapped = 0;     // lohand's, not in total()
  // Everything but the arena; a load and a save are never at once.
  uint64_t total() const;
};

// REQUIRES: the inputs' sum and largest_parameter x save_element_bytes fit
// 64 bits (ValidateCounts' bounds give that for a plan's).
TrainerHostBytes TrainerHostOf(const TrainerHostInputs& inputs);

}  // namespace lohan

#endif  // LOHAN_PLAN_TRAINER_HOST_H_
