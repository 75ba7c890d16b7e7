#ifndef LOHAN_LAYOUT_FOOTPRINT_H_
#define LOHAN_LAYOUT_FOOTPRINT_H_

#include <cstdint>

namespace lohan {

// The SSD space one version of a tensor of `tensor_bytes` takes in a store
// of `block_size` (StoreOptions::block_size, a power of two): whole stripe
// units, then the last one padded to the block size. What
// TensorStore::FootprintBytes returns and a SpaceBudget is charged; the
// planner sizes a model's states with it too.
constexpr uint64_t TensorFootprintBytes(uint64_t tensor_bytes,
                                        uint64_t block_size) {
  return (tensor_bytes + block_size - 1) / block_size * block_size;
}

}  // namespace lohan

#endif  // LOHAN_LAYOUT_FOOTPRINT_H_
