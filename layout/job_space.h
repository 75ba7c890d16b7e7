#ifndef LOHAN_LAYOUT_JOB_SPACE_H_
#define LOHAN_LAYOUT_JOB_SPACE_H_

// What a job's update pipeline takes, from its layout alone: the host
// memory of its chunk buffers, the SSD space of the tensors it keeps and
// of a step's streamed gradients, and the space its updates have set
// aside. JobPipeline and JobSession size themselves with these, and the
// planner (plan/) sizes a described model with them, so the two
// cannot drift.

#include <cstddef>
#include <cstdint>

#include "layout/dtype.h"
#include "layout/model_layout.h"

namespace lohan {

// Chunk buffers a pipeline has in flight (PipelineOptions::buffers) unless
// its owner chooses: lohand's sessions keep this.
inline constexpr size_t kDefaultChunkBuffers = 4;
// Alignment of each part of a chunk buffer (O_DIRECT's: the store copies
// through bounce buffers otherwise).
inline constexpr uint64_t kChunkBufferAlignment = 4096;

// One chunk buffer: [state | streamed gradient | streamed 16-bit copy],
// each part sized for the layout's largest chunk and aligned to
// kChunkBufferAlignment; the gradient part only with stream_gradients, the
// copy only with stream_weight16.
struct ChunkBufferLayout {
  uint64_t grad_offset = 0;
  uint64_t weight16_offset = 0;
  uint64_t bytes = 0;  // the whole buffer
};
ChunkBufferLayout ChunkBufferFor(const StateLayout& state, DType grad_dtype,
                                 bool stream_gradients, bool stream_weight16);
// The same for a chunk of `count` elements: its parts packed for its own
// size (within ChunkBufferFor's buffer, which fits every chunk's).
ChunkBufferLayout ChunkBufferForCount(const StateLayout& state, uint64_t count,
                                      DType grad_dtype, bool stream_gradients,
                                      bool stream_weight16);

// The host memory a pipeline whose client fetches each layer's new weights
// (streamed weights) keeps them in after an update, until they are fetched
// (JobPipeline's weight handoff): `slots` chunks' weights of `slot_bytes`
// each (the largest chunk's, at `weight_bytes` an element: 4 for an fp32
// layout's masters, 2 for the 16-bit copy), twice as many as the chunk
// buffers, so the updates may run that far ahead of the fetches before a
// fetch reads the SSDs again. Allocated as used, up to this.
struct WeightHandoffSpace {
  size_t slots = 0;
  uint64_t slot_bytes = 0;
  uint64_t bytes() const { return slots * slot_bytes; }
};
WeightHandoffSpace WeightHandoffFor(const StateLayout& state,
                                    uint64_t weight_bytes, size_t buffers);

// The store tensors a pipeline keeps for `state` between iterations, one
// version each (what JobPipeline::Open creates: the meta, every chunk's
// state tensor and, with stream_weight16, every chunk's 16-bit copy), in a
// store of `block_size`.
struct KeptSpace {
  uint64_t tensor_bytes = 0;       // their sizes (TensorInfo::bytes)
  uint64_t footprint = 0;          // their SSD space (TensorFootprintBytes)
  uint64_t largest_footprint = 0;  // the largest one's
};
KeptSpace KeptTensorSpace(const StateLayout& state, bool stream_weight16,
                          uint64_t block_size);

// SSD space of one iteration's streamed gradients (stream_gradients: one
// scratch tensor per chunk, written by SubmitGradients, deleted when the
// iteration ends), in a store of `block_size`.
uint64_t GradScratchFootprint(const StateLayout& state, DType grad_dtype,
                              uint64_t block_size);

// The SSD space a registered job's updates have set aside (its ledger
// claim), from the SSD space of the tensors it keeps (`footprint`, the
// largest `largest_footprint`) and its chunk buffers: every kept tensor has
// a committed and a pending version during an iteration, and a tensor
// rewritten while pending (a clip redo) briefly has a third, one per chunk
// buffer in flight and one more.
constexpr uint64_t UpdateSpaceBytes(uint64_t footprint,
                                    uint64_t largest_footprint,
                                    size_t buffers) {
  return 2 * footprint + (buffers + 1) * largest_footprint;
}

// The SSD space a registered job's pipeline sets aside (its ledger claim,
// which no other write may take): UpdateSpaceBytes of the tensors it keeps
// and, with stream_gradients, one iteration's streamed gradients (written
// in backward, deleted when the iteration ends) beside them.
uint64_t SetAsideBytes(const StateLayout& state, DType grad_dtype,
                       bool stream_gradients, bool stream_weight16,
                       uint64_t block_size, size_t buffers);

}  // namespace lohan

#endif  // LOHAN_LAYOUT_JOB_SPACE_H_
