#include "daemon/session/model_spec_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace lohan {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view rule,
                 double value) {
  return absl::InvalidArgumentError(
      absl::StrCat("ModelSpec ", field, " must be ", rule, "; got ", value));
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

}  // namespace

absl::Status CheckModelSpec(const v1::ModelSpec& spec) {
  const uint64_t layers = static_cast<uint64_t>(spec.layer_elements_size());
  if (layers == 0 || layers > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelSpec layer_elements: a model has 1 to ", kMaxLayers,
                     " layers, got ", layers,
                     " (group small tensors into one layer each block)"));
  }
  for (uint64_t l = 0; l < layers; ++l) {
    const uint64_t elements = spec.layer_elements(static_cast<int>(l));
    if (elements == 0 || elements > kMaxLayerElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("ModelSpec layer_elements[", l, "] must be 1 to ",
                       kMaxLayerElements, ", got ", elements));
    }
  }
  switch (spec.dtype()) {
    case v1::DTYPE_FP32:
    case v1::DTYPE_BF16:
    case v1::DTYPE_FP16:
      break;
    default: {
      const std::string& name = v1::DType_Name(spec.dtype());
      return absl::InvalidArgumentError(absl::StrCat(
          "model dtype ",
          name.empty() ? absl::StrCat(static_cast<int>(spec.dtype())) : name,
          " is not supported; use DTYPE_FP32, DTYPE_BF16 or DTYPE_FP16"));
    }
  }
  if (absl::Status adam = CheckAdam(spec.adam()); !adam.ok()) return adam;
  if (!(spec.max_grad_norm() >= 0.0) || std::isinf(spec.max_grad_norm())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_grad_norm must be >= 0 and finite, got ", spec.max_grad_norm()));
  }
  if (spec.clip_schedule() != v1::CLIP_SCHEDULE_DEFERRED &&
      spec.clip_schedule() != v1::CLIP_SCHEDULE_REDO_ALL) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip_schedule ", static_cast<int>(spec.clip_schedule()),
                     " is not 0 (deferred) or 1 (redo-all)"));
  }
  if (spec.initial_iteration() > kMaxInitialIteration) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelSpec initial_iteration must be at most ",
                     kMaxInitialIteration, ", got ", spec.initial_iteration()));
  }
  uint64_t ranges = static_cast<uint64_t>(spec.no_weight_decay_size());
  for (const v1::ParamGroup& group : spec.param_groups()) {
    ranges += static_cast<uint64_t>(group.ranges_size());
  }
  if (ranges > kMaxElementRanges) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelSpec no_weight_decay and param_groups hold ", ranges,
                     " element ranges; at most ", kMaxElementRanges));
  }
  return absl::OkStatus();
}

}  // namespace lohan
