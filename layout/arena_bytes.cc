#include "layout/arena_bytes.h"

#include <algorithm>

namespace lohan {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

uint64_t RoundUp(uint64_t value, uint64_t unit) {
  return (value + unit - 1) / unit * unit;
}

// One kind's buffers: one per layer, or `buffers` of the largest.
uint64_t BufferBytes(const ArenaShape& shape, uint64_t buffers,
                     uint64_t largest) {
  if (StreamedBuffers(buffers, shape.layer_elements.size())) {
    return buffers * RoundUp(largest * shape.element_bytes, kArenaSlotUnit);
  }
  uint64_t bytes = 0;
  for (uint64_t elements : shape.layer_elements) {
    bytes += RoundUp(elements * shape.element_bytes, kArenaSlotUnit);
  }
  return bytes;
}

}  // namespace

bool StreamedBuffers(uint64_t buffers, size_t layers) {
  return buffers > 0 && buffers < layers;
}

uint64_t ArenaBytes(const ArenaShape& shape) {
  const uint64_t largest = *std::max_element(shape.layer_elements.begin(),
                                             shape.layer_elements.end());
  const uint64_t buffers = BufferBytes(shape, shape.grad_buffers, largest) +
                           BufferBytes(shape, shape.weight_buffers, largest);
  const uint64_t staging = RoundUp(largest * 4, kArenaSlotUnit);
  const uint64_t activations = RoundUp(shape.activation_bytes, kArenaSlotUnit);
  return RoundUp(buffers + staging + activations + kArenaControlBytes, kMiB);
}

}  // namespace lohan
