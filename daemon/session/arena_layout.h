#ifndef LOHAN_DAEMON_SESSION_ARENA_LAYOUT_H_
#define LOHAN_DAEMON_SESSION_ARENA_LAYOUT_H_

// The arena a model's buffers take, as RegisterModel lays them out, and how
// many shared buffers an arena of a given size holds a model with. The one
// place that knows the arena's sizes: CreateJob sizes a job's arena for
// JobSpec.model with it, RegisterModel resolves ARENA_FIT_MOST with it,
// and daemon/plan reports it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/lohan.pb.h"

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

// The arena that holds `shape`: its gradient and weight buffers, the fp32
// staging slot of the largest layer and the activation area, each rounded
// up to kArenaSlotUnit, and kArenaControlBytes; rounded up to whole MiB.
// REQUIRES: layer_elements is not empty and within CheckModelSpec's limits.
uint64_t ArenaBytes(const ArenaShape& shape);

// The shape of a spec CheckModelSpec accepted, with its grad_slots and
// weight_slots as given.
ArenaShape ShapeOf(const v1::ModelSpec& spec);

// How an arena holds a model.
struct ArenaChoice {
  uint64_t arena_bytes = 0;           // ArenaBytes of the layout taken
  uint32_t grad_buffers = 0;          // 0: one per layer
  uint32_t weight_buffers = 0;        // 0: one per layer
  uint64_t resident_arena_bytes = 0;  // ArenaBytes with one per layer
};

// Where the arena's bytes come from, for ChooseArena's refusal.
struct ArenaLimit {
  uint64_t bytes = 0;  // 0: no limit
  std::string what;    // e.g. "the whole host pool"
  std::string remedy;  // how to raise it, e.g. "--host-pool-size"
};

// The layout a checked spec takes within `limit`. ARENA_FIT_AS_GIVEN: its
// grad_slots / weight_slots, whatever the limit (the caller refuses an
// arena too large in its own words). ARENA_FIT_MOST: one buffer per layer
// if that fits, else the most shared buffers, up to grad_slots and fewer
// than the layers, that fit; RESOURCE_EXHAUSTED naming what one buffer per
// layer and one shared buffer of each take, the limit and the remedy when
// none does.
absl::StatusOr<ArenaChoice> ChooseArena(const v1::ModelSpec& spec,
                                        const ArenaLimit& limit);

// CreateJob's sizing for JobSpec.model (checked by CheckModelSpec) of a job
// of `uid`: ChooseArena within the host pool's `pool_bytes` and the
// owner's `quota_bytes` (0: none), whichever is smaller.
absl::StatusOr<v1::ArenaSizing> SizeJobArena(const v1::ModelSpec& model,
                                             uint32_t uid, uint64_t pool_bytes,
                                             uint64_t quota_bytes);

}  // namespace lohan

#endif  // LOHAN_DAEMON_SESSION_ARENA_LAYOUT_H_
