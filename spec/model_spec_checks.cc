#include "spec/model_spec_checks.h"

#include <cmath>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/types/optional.h"

namespace lohan {
namespace {

// The payload that carries a refusal's field (RefusedField).
constexpr char kFieldPayload[] = "lohan.dev/refused-field";

absl::Status Refuse(absl::string_view field, absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kFieldPayload, absl::Cord(field));
  return status;
}

absl::Status Bad(absl::string_view field, absl::string_view rule,
                 double value) {
  return Refuse(field, absl::StrCat("ModelSpec ", field, " must be ", rule,
                                    "; got ", value));
}

absl::Status CheckAdam(const v1::AdamSpec& adam) {
  if (!std::isfinite(adam.lr()) || adam.lr() < 0) {
    return Bad("adam.lr", "finite and >= 0", adam.lr());
  }
  if (!(adam.beta1() >= 0 && adam.beta1() < 1)) {
    return Bad("adam.beta1", "in [0, 1)", adam.beta1());
  }
  if (!(adam.beta2() >= 0 && adam.beta2() < 1)) {
    return Bad("adam.beta2", "in [0, 1)", adam.beta2());
  }
  if (!std::isfinite(adam.eps()) || adam.eps() < 0) {
    return Bad("adam.eps", "finite and >= 0", adam.eps());
  }
  if (!std::isfinite(adam.weight_decay()) || adam.weight_decay() < 0) {
    return Bad("adam.weight_decay", "finite and >= 0", adam.weight_decay());
  }
  return absl::OkStatus();
}

// Group names go into error texts the client reads and the daemon logs.
bool IsGroupName(const std::string& name) {
  if (name.size() > 64) return false;
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

absl::Status CheckLayers(const v1::ModelSpec& spec) {
  const uint64_t layers = static_cast<uint64_t>(spec.layer_elements_size());
  if (layers == 0 || layers > kMaxLayers) {
    return Refuse("layer_elements",
                  absl::StrCat("ModelSpec layer_elements: a model has 1 to ",
                               kMaxLayers, " layers, got ", layers,
                               " (group small tensors into one layer each "
                               "block)"));
  }
  for (uint64_t l = 0; l < layers; ++l) {
    const uint64_t elements = spec.layer_elements(static_cast<int>(l));
    if (elements == 0 || elements > kMaxLayerElements) {
      const std::string field = absl::StrCat("layer_elements[", l, "]");
      return Refuse(field, absl::StrCat("ModelSpec ", field, " must be 1 to ",
                                        kMaxLayerElements, ", got ", elements));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLayerPlaces(const v1::ModelSpec& spec) {
  const int places = spec.layer_places_size();
  if (places == 0) return absl::OkStatus();
  if (places != spec.layer_elements_size()) {
    return Refuse("layer_places",
                  absl::StrCat("ModelSpec layer_places has ", places,
                               " entries for ", spec.layer_elements_size(),
                               " layers; give one per layer or none"));
  }
  for (int l = 0; l < places; ++l) {
    const v1::LayerPlace& place = spec.layer_places(l);
    if (place.block() < -1 || static_cast<int64_t>(place.block()) >=
                                  static_cast<int64_t>(kMaxLayers)) {
      const std::string field = absl::StrCat("layer_places[", l, "].block");
      return Refuse(
          field, absl::StrCat("ModelSpec ", field, " must be -1 (no block) to ",
                              kMaxLayers - 1, ", got ", place.block()));
    }
    if (place.unit() > kMaxLayerUnit ||
        (place.block() < 0 && place.unit() != 0)) {
      const std::string field = absl::StrCat("layer_places[", l, "].unit");
      return Refuse(
          field, absl::StrCat("ModelSpec ", field, " must be at most ",
                              kMaxLayerUnit, ", and 0 outside the blocks; got ",
                              place.unit(), " in block ", place.block()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGroups(const v1::ModelSpec& spec) {
  uint64_t ranges = 0;
  for (int g = 0; g < spec.param_groups_size(); ++g) {
    const v1::ParamGroup& group = spec.param_groups(g);
    ranges += static_cast<uint64_t>(group.ranges_size());
    if (!IsGroupName(group.name())) {
      const std::string field = absl::StrCat("param_groups[", g, "].name");
      return Refuse(field, absl::StrCat("ModelSpec ", field,
                                        " must be at most 64 printable ASCII "
                                        "characters"));
    }
  }
  if (ranges > kMaxElementRanges) {
    return Refuse("param_groups",
                  absl::StrCat("ModelSpec param_groups hold ", ranges,
                               " element ranges; at most ", kMaxElementRanges));
  }
  return absl::OkStatus();
}

absl::Status CheckDtype(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP32:
    case v1::DTYPE_BF16:
    case v1::DTYPE_FP16:
      return absl::OkStatus();
    default: {
      const std::string& name = v1::DType_Name(dtype);
      return Refuse(
          "dtype",
          absl::StrCat(
              "ModelSpec dtype ",
              name.empty() ? absl::StrCat(static_cast<int>(dtype)) : name,
              " is not supported; use DTYPE_FP32, DTYPE_BF16 or "
              "DTYPE_FP16"));
    }
  }
}

absl::Status CheckClipping(const v1::ModelSpec& spec) {
  if (!(spec.max_grad_norm() >= 0.0) || std::isinf(spec.max_grad_norm())) {
    return Refuse("max_grad_norm",
                  absl::StrCat("ModelSpec max_grad_norm must be >= 0 and "
                               "finite, got ",
                               spec.max_grad_norm()));
  }
  if (spec.clip_schedule() != v1::CLIP_SCHEDULE_DEFERRED &&
      spec.clip_schedule() != v1::CLIP_SCHEDULE_REDO_ALL) {
    return Refuse("clip_schedule",
                  absl::StrCat("ModelSpec clip_schedule ",
                               static_cast<int>(spec.clip_schedule()),
                               " is not 0 (deferred) or 1 (redo-all)"));
  }
  return absl::OkStatus();
}

absl::Status CheckArenaFit(const v1::ModelSpec& spec) {
  switch (spec.arena_fit()) {
    case v1::ARENA_FIT_AS_GIVEN:
      return absl::OkStatus();
    case v1::ARENA_FIT_MOST:
      if (spec.grad_slots() != spec.weight_slots()) {
        return Refuse("arena_fit",
                      absl::StrCat("ModelSpec arena_fit ARENA_FIT_MOST takes "
                                   "as many shared weight buffers as gradient "
                                   "ones; got grad_slots ",
                                   spec.grad_slots(), " and weight_slots ",
                                   spec.weight_slots()));
      }
      return absl::OkStatus();
    default:
      return Refuse("arena_fit",
                    absl::StrCat("ModelSpec arena_fit ",
                                 static_cast<int>(spec.arena_fit()),
                                 " is not 0 (as given) or 1 (the most that "
                                 "fit)"));
  }
}

}  // namespace

absl::Status CheckRequestedDurability(const v1::ModelSpec& spec) {
  if (spec.commit_interval() > kMaxCommitInterval) {
    return Refuse(
        "commit_interval",
        absl::StrCat("ModelSpec commit_interval must be at most ",
                     kMaxCommitInterval, " (0: the daemon's default), got ",
                     spec.commit_interval()));
  }
  const double every = spec.durable_every_seconds();
  if (!(every >= 0.0) || every > kMaxDurableEverySeconds) {
    return Refuse(
        "durable_every_seconds",
        absl::StrCat("ModelSpec durable_every_seconds must be from "
                     "0 (the daemon's default) to ",
                     kMaxDurableEverySeconds, " (7 days), got ", every));
  }
  if (every > 0.0 && spec.commit_interval() != 0) {
    return Refuse(
        "durable_every_seconds",
        absl::StrCat("ModelSpec durable_every_seconds (", every,
                     ") and commit_interval (", spec.commit_interval(),
                     ") both set: a job's durability is by steps or by time, "
                     "not both"));
  }
  if ((spec.commit_interval() > 1 || every > 0.0) &&
      spec.clip_schedule() == v1::CLIP_SCHEDULE_REDO_ALL) {
    const char* field =
        every > 0.0 ? "durable_every_seconds" : "commit_interval";
    return Refuse(
        field,
        absl::StrCat(
            "ModelSpec ",
            every > 0.0 ? "durable_every_seconds" : "commit_interval above 1",
            " needs clip_schedule deferred (a redo-all schedule "
            "updates states only host memory holds before the "
            "iteration's outcome is known)"));
  }
  return absl::OkStatus();
}

absl::Status CheckSpecSettings(const v1::ModelSpec& spec) {
  if (absl::Status dtype = CheckDtype(spec.dtype()); !dtype.ok()) {
    return dtype;
  }
  if (absl::Status adam = CheckAdam(spec.adam()); !adam.ok()) return adam;
  if (absl::Status clipping = CheckClipping(spec); !clipping.ok()) {
    return clipping;
  }
  if (absl::Status durability = CheckRequestedDurability(spec);
      !durability.ok()) {
    return durability;
  }
  if (spec.initial_iteration() > kMaxInitialIteration) {
    return Refuse(
        "initial_iteration",
        absl::StrCat("ModelSpec initial_iteration must be at most ",
                     kMaxInitialIteration, ", got ", spec.initial_iteration()));
  }
  if (spec.activation_bytes() > kMaxActivationBytes) {
    return Refuse(
        "activation_bytes",
        absl::StrCat("ModelSpec activation_bytes must be at most ",
                     kMaxActivationBytes, ", got ", spec.activation_bytes()));
  }
  return CheckArenaFit(spec);
}

absl::Status CheckModelSpec(const v1::ModelSpec& spec) {
  if (absl::Status layers = CheckLayers(spec); !layers.ok()) return layers;
  if (absl::Status places = CheckLayerPlaces(spec); !places.ok()) {
    return places;
  }
  if (absl::Status settings = CheckSpecSettings(spec); !settings.ok()) {
    return settings;
  }
  return CheckGroups(spec);
}

absl::Status CheckModelShape(const v1::ModelSpec& spec) {
  if (absl::Status layers = CheckLayers(spec); !layers.ok()) return layers;
  if (absl::Status places = CheckLayerPlaces(spec); !places.ok()) {
    return places;
  }
  return CheckGroups(spec);
}

std::string RefusedField(const absl::Status& status) {
  absl::optional<absl::Cord> field = status.GetPayload(kFieldPayload);
  return field.has_value() ? std::string(*field) : std::string();
}

}  // namespace lohan
