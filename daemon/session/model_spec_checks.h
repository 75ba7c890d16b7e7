#ifndef LOHAN_DAEMON_SESSION_MODEL_SPEC_CHECKS_H_
#define LOHAN_DAEMON_SESSION_MODEL_SPEC_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "layout/durability.h"
#include "proto/lohan.pb.h"

namespace lohan {

// The largest model a job may register: layers, and parameters per layer.
inline constexpr uint64_t kMaxLayers = uint64_t{1} << 16;
inline constexpr uint64_t kMaxLayerElements = uint64_t{1} << 40;
// The activation area (2^48 bytes, 256 TiB: past any host).
inline constexpr uint64_t kMaxActivationBytes = uint64_t{1} << 48;
// Element ranges (every param group's, together).
inline constexpr uint64_t kMaxElementRanges = uint64_t{1} << 20;
// An iteration number no run reaches, far inside what every counter holds.
inline constexpr uint64_t kMaxInitialIteration = uint64_t{1} << 40;
// A layer's unit within its block (ModelSpec.layer_places; the model cut's
// bound).
inline constexpr uint32_t kMaxLayerUnit = 4096;

// The durability a spec asks for, checked from the spec alone:
// commit_interval at most kMaxCommitInterval (0: the daemon's default),
// durable_every_seconds from 0 (the daemon's default) to
// kMaxDurableEverySeconds, not both set, and neither (beyond an interval of
// 1) with the redo-all clip schedule. INVALID_ARGUMENT naming the option
// otherwise. The one place these rules live: CheckModelSpec and
// ResolveJobSettings (job_settings.h) both return its refusal.
absl::Status CheckRequestedDurability(const v1::ModelSpec& spec);

// Everything about a RegisterModel spec that can be checked from the spec
// alone, cheaply, before the daemon allocates anything for it: sizes and
// counts in range, the optimizer's hyperparameters finite and in range,
// known enum values (named in the message), printable group names,
// layer_places (none or one per layer, each block -1 to kMaxLayers - 1,
// each unit at most kMaxLayerUnit and 0 outside the blocks), and
// arena_fit's rule (ARENA_FIT_MOST with grad_slots == weight_slots),
// the durability asked for (CheckRequestedDurability).
// INVALID_ARGUMENT naming the field otherwise. The layout's own rules (ranges,
// groups) are ValidateLayout's.
absl::Status CheckModelSpec(const v1::ModelSpec& spec);

}  // namespace lohan

#endif  // LOHAN_DAEMON_SESSION_MODEL_SPEC_CHECKS_H_
