#ifndef LOHAN_LAYOUT_ARENA_BYTES_H_
#define LOHAN_LAYOUT_ARENA_BYTES_H_

// The arena a model's buffers take, as RegisterModel lays them out: the one
// place that knows the arena's sizes (daemon/session sizes and resolves
// jobs' arenas with it, plan/ reports it).

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lohan {

// What RegisterModel allocates for a model, beside its control slots.
struct ArenaShape {
  std::vector<uint64_t> layer_elements;  // not empty
  uint64_t element_bytes = 2;  // of a gradient (= a 16-bit weight) element
  uint64_t activation_bytes = 0;
  // Shared buffers of each kind, each as large as the largest layer; 0 (or
  // >= the layers): one per layer.
  uint64_t grad_buffers = 0;
  uint64_t weight_buffers = 0;
};

// The slot allocator's unit: every slot is rounded up to it.
inline constexpr uint64_t kArenaSlotUnit = 4096;
// The rings and the error text records, with room to spare (checked
// against JobSession's sizes by arena_layout_test).
inline constexpr uint64_t kArenaControlBytes = uint64_t{1} << 20;

// Whether `buffers` shared buffers of a kind stream a model of `layers`
// layers through them (fewer than the layers, and some), rather than one
// per layer.
bool StreamedBuffers(uint64_t buffers, size_t layers);

// The arena that holds `shape`: its gradient and weight buffers, the fp32
// staging slot of the largest layer and the activation area, each rounded
// up to kArenaSlotUnit, and kArenaControlBytes; rounded up to whole MiB.
// REQUIRES: layer_elements is not empty and within CheckModelSpec's limits.
uint64_t ArenaBytes(const ArenaShape& shape);

}  // namespace lohan

#endif  // LOHAN_LAYOUT_ARENA_BYTES_H_
