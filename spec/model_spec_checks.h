#ifndef LOHAN_SPEC_MODEL_SPEC_CHECKS_H_
#define LOHAN_SPEC_MODEL_SPEC_CHECKS_H_

#include <cstdint>
#include <string>

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
// otherwise. The one place these rules live: CheckSpecSettings and
// lohand's ResolveJobSettings (daemon/session/job_settings.h) both return
// its refusal.
absl::Status CheckRequestedDurability(const v1::ModelSpec& spec);

// What a training process asks of its job, apart from the model's shape
// (its layers, their places and its param groups' ranges): the dtype,
// Adam's hyperparameters finite and in range, clipping, the clip schedule,
// the durability (CheckRequestedDurability), the initial iteration, the
// activation area and arena_fit's rule (ARENA_FIT_MOST with grad_slots ==
// weight_slots). Checkable before there is a model: the plugins check
// their options with it (lohan_model_spec_check_settings) at init.
absl::Status CheckSpecSettings(const v1::ModelSpec& spec);

// Everything about a spec that can be checked from the spec alone,
// cheaply, before anything is allocated for it: CheckSpecSettings, and the
// model's shape (layers and their sizes, layer_places: none or one per
// layer, each block -1 to kMaxLayers - 1, each unit at most kMaxLayerUnit
// and 0 outside the blocks; printable group names; the ranges' count).
// liblohan_client runs it before a spec leaves the training process and
// lohand at its boundary (clients are not trusted). The layout's own rules
// (ranges within layers, groups apart) are ValidateLayout's.
absl::Status CheckModelSpec(const v1::ModelSpec& spec);

// CheckModelSpec's model part alone (layers, their places, the groups'
// names and ranges' count): for a spec whose settings CheckSpecSettings
// has judged already, e.g. the model cut's, made from a checked one.
absl::Status CheckModelShape(const v1::ModelSpec& spec);

// Every refusal above is INVALID_ARGUMENT naming the field in its text and
// carrying it as a payload: the ModelSpec field's path as protobuf JSON
// writes it ("adam.eps", "commit_interval", "layer_places[3].unit"), so a
// binding can name its own option for it. "" for a status without one.
std::string RefusedField(const absl::Status& status);

}  // namespace lohan

#endif  // LOHAN_SPEC_MODEL_SPEC_CHECKS_H_
