#include "layout/job_space.h"

#include <algorithm>

#include "layout/dtype_traits.h"
#include "layout/footprint.h"
#include "layout/job_meta.h"

namespace lohan {
namespace {

uint64_t Aligned(uint64_t bytes) {
  return (bytes + kChunkBufferAlignment - 1) / kChunkBufferAlignment *
         kChunkBufferAlignment;
}

// Adds `count` tensors of `bytes` each.
void Add(KeptSpace& space, uint64_t count, uint64_t bytes,
         uint64_t block_size) {
  const uint64_t footprint = TensorFootprintBytes(bytes, block_size);
  space.tensor_bytes += count * bytes;
  space.footprint += count * footprint;
  if (count > 0) {
    space.largest_footprint = std::max(space.largest_footprint, footprint);
  }
}

// Calls `chunks(count, elements)` for each run of equal chunks of a layer:
// its full chunks, then its shorter last one.
template <typename Chunks>
void ForEachChunkSize(const StateLayout& state, Chunks chunks) {
  for (size_t l = 0; l < state.num_layers(); ++l) {
    const size_t n = state.num_chunks(l);
    const uint64_t first = state.chunk_count(l, 0);
    const uint64_t last = state.chunk_count(l, n - 1);
    if (first == last) {
      chunks(n, first);
    } else {
      chunks(n - 1, first);
      chunks(1, last);
    }
  }
}

}  // namespace

ChunkBufferLayout ChunkBufferFor(const StateLayout& state, DType grad_dtype,
                                 bool stream_gradients, bool stream_weight16) {
  return ChunkBufferForCount(state, state.max_chunk_count(), grad_dtype,
                             stream_gradients, stream_weight16);
}

ChunkBufferLayout ChunkBufferForCount(const StateLayout& state, uint64_t chunk,
                                      DType grad_dtype, bool stream_gradients,
                                      bool stream_weight16) {
  ChunkBufferLayout buffer;
  buffer.grad_offset = Aligned(state.state_bytes(chunk));
  buffer.weight16_offset =
      buffer.grad_offset +
      (stream_gradients ? Aligned(chunk * DTypeSize(grad_dtype)) : 0);
  buffer.bytes =
      buffer.weight16_offset + (stream_weight16 ? Aligned(chunk * 2) : 0);
  return buffer;
}

WeightHandoffSpace WeightHandoffFor(const StateLayout& state,
                                    uint64_t weight_bytes, size_t buffers) {
  WeightHandoffSpace space;
  space.slots = 2 * buffers;
  space.slot_bytes = Aligned(state.max_chunk_count() * weight_bytes);
  return space;
}

KeptSpace KeptTensorSpace(const StateLayout& state, bool stream_weight16,
                          uint64_t block_size) {
  KeptSpace space;
  Add(space, 1, JobMeta::kBytes, block_size);
  ForEachChunkSize(state, [&](uint64_t count, uint64_t elements) {
    Add(space, count, state.state_bytes(elements), block_size);
    // The 16-bit copy is two bytes an element in either 16-bit dtype.
    if (stream_weight16) Add(space, count, elements * 2, block_size);
  });
  return space;
}

uint64_t GradScratchFootprint(const StateLayout& state, DType grad_dtype,
                              uint64_t block_size) {
  KeptSpace space;
  ForEachChunkSize(state, [&](uint64_t count, uint64_t elements) {
    Add(space, count, elements * DTypeSize(grad_dtype), block_size);
  });
  return space.footprint;
}

uint64_t SetAsideBytes(const StateLayout& state, DType grad_dtype,
                       bool stream_gradients, bool stream_weight16,
                       uint64_t block_size, size_t buffers) {
  const KeptSpace kept = KeptTensorSpace(state, stream_weight16, block_size);
  return UpdateSpaceBytes(kept.footprint, kept.largest_footprint, buffers) +
         (stream_gradients ? GradScratchFootprint(state, grad_dtype, block_size)
                           : 0);
}

}  // namespace lohan
