#ifndef LOHAN_DAEMON_SESSION_ARENA_LAYOUT_H_
#define LOHAN_DAEMON_SESSION_ARENA_LAYOUT_H_

// How a model's spec takes an arena: its shape (layout/arena_bytes.h
// sizes it), and how many shared buffers an arena of a given
// size holds it with. CreateJob sizes a job's arena for JobSpec.model with
// it, RegisterModel resolves ARENA_FIT_MOST with it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layout/arena_bytes.h"
#include "proto/lohan.pb.h"

namespace lohan {

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
// if that fits, else a weight buffer per layer and the most shared gradient
// buffers (up to grad_slots and fewer than the layers) that fit, else the
// most shared buffers of each kind that fit; RESOURCE_EXHAUSTED naming what one
// buffer per layer and one shared buffer of each take, the limit and the remedy
// when none does.
absl::StatusOr<ArenaChoice> ChooseArena(const v1::ModelSpec& spec,
                                        const ArenaLimit& limit);

// What of a spec its arena depends on (ShapeOf's and ChooseArena's fields:
// layer_elements, dtype, activation_bytes, grad_slots, weight_slots,
// arena_fit), the rest left out: what a job keeps of JobSpec.model.
v1::ModelSpec ArenaFieldsOf(const v1::ModelSpec& spec);

// The least arena a checked spec trains in: with ARENA_FIT_MOST one shared
// buffer of each kind (ChooseArena's last choice; one per layer for a
// model that cannot stream), with ARENA_FIT_AS_GIVEN its own layout.
uint64_t SmallestArena(const v1::ModelSpec& spec);

// CreateJob's sizing for JobSpec.model (checked by CheckModelSpec) of a job
// of `uid`: ChooseArena within the host pool's `pool_bytes` and the
// owner's `quota_bytes` (0: none), whichever is smaller.
absl::StatusOr<v1::ArenaSizing> SizeJobArena(const v1::ModelSpec& model,
                                             uint32_t uid, uint64_t pool_bytes,
                                             uint64_t quota_bytes);

}  // namespace lohan

#endif  // LOHAN_DAEMON_SESSION_ARENA_LAYOUT_H_
