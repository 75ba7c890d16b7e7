#include "client/model_spec_from_c.h"

#include <cstddef>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace lohan {
namespace {

// Whether the caller's struct (its struct_size) reaches past `end`, the
// offset just after a field.
bool Has(const lohan_model_spec& spec, size_t end) {
  return spec.struct_size >= end;
}

#define LOHAN_SPEC_END(field) \
  (offsetof(lohan_model_spec, field) + sizeof(lohan_model_spec::field))

// The optional arrays the caller's struct version has (0 when it has none).
struct Counts {
  uint32_t no_weight_decay = 0;
  uint32_t param_groups = 0;
};

Counts CountsOf(const lohan_model_spec& spec) {
  Counts counts;
  if (Has(spec, LOHAN_SPEC_END(num_no_weight_decay))) {
    counts.no_weight_decay = spec.num_no_weight_decay;
  }
  if (Has(spec, LOHAN_SPEC_END(num_param_groups))) {
    counts.param_groups = spec.num_param_groups;
  }
  return counts;
}

absl::Status CheckArrays(const lohan_model_spec& spec, const Counts& counts) {
  if (spec.num_layers == 0 || spec.layer_elements == nullptr) {
    return absl::InvalidArgumentError(
        "lohan_model_register: a model needs layers");
  }
  if (counts.no_weight_decay != 0 && spec.no_weight_decay == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("lohan_model_register: spec->no_weight_decay is NULL but "
                     "num_no_weight_decay is ",
                     counts.no_weight_decay));
  }
  if (counts.param_groups != 0 && spec.param_groups == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("lohan_model_register: spec->param_groups is NULL but "
                     "num_param_groups is ",
                     counts.param_groups));
  }
  for (uint32_t g = 0; g < counts.param_groups; ++g) {
    if (spec.param_groups[g].num_ranges != 0 &&
        spec.param_groups[g].ranges == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("lohan_model_register: param_groups[", g,
                       "].ranges is NULL but num_ranges is ",
                       spec.param_groups[g].num_ranges));
    }
  }
  return absl::OkStatus();
}

// The scalar fields: dtype, Adam, clipping, layout, scheduling.
void CopyScalars(const lohan_model_spec& spec, v1::ModelSpec* model_spec) {
  const bool has_slots = Has(spec, LOHAN_SPEC_END(weight_slots));
  model_spec->set_dtype(static_cast<v1::DType>(spec.dtype));
  v1::AdamSpec* adam = model_spec->mutable_adam();
  adam->set_lr(spec.lr);
  adam->set_beta1(spec.beta1);
  adam->set_beta2(spec.beta2);
  adam->set_eps(spec.eps);
  adam->set_weight_decay(spec.weight_decay);
  adam->set_decoupled_weight_decay(spec.adamw != 0);
  adam->set_amsgrad(spec.amsgrad != 0);
  adam->set_bf16_moments(spec.bf16_moments != 0);
  model_spec->set_max_grad_norm(spec.max_grad_norm);
  model_spec->set_skip_nonfinite(spec.skip_nonfinite != 0);
  model_spec->set_chunk_elements(spec.chunk_elements);
  model_spec->set_activation_bytes(spec.activation_bytes);
  model_spec->set_grad_slots(has_slots ? spec.grad_slots : 0);
  model_spec->set_weight_slots(has_slots ? spec.weight_slots : 0);
  model_spec->set_initial_iteration(Has(spec, LOHAN_SPEC_END(initial_iteration))
                                        ? spec.initial_iteration
                                        : 0);
  model_spec->set_overlap_updates(Has(spec, LOHAN_SPEC_END(overlap_updates)) &&
                                  spec.overlap_updates != 0);
  // The daemon refuses values it does not know, naming them.
  const uint32_t clip_schedule = Has(spec, LOHAN_SPEC_END(clip_schedule))
                                     ? spec.clip_schedule
                                     : uint32_t{LOHAN_CLIP_DEFERRED};
  model_spec->set_clip_schedule(static_cast<v1::ClipSchedule>(clip_schedule));
  model_spec->set_in_order_service(
      Has(spec, LOHAN_SPEC_END(in_order_service)) &&
      spec.in_order_service != 0);
  model_spec->set_commit_interval(
      Has(spec, LOHAN_SPEC_END(commit_interval)) ? spec.commit_interval : 0);
  model_spec->set_arena_fit(Has(spec, LOHAN_SPEC_END(arena_fit_most)) &&
                                    spec.arena_fit_most != 0
                                ? v1::ARENA_FIT_MOST
                                : v1::ARENA_FIT_AS_GIVEN);
  model_spec->set_durable_every_seconds(
      Has(spec, LOHAN_SPEC_END(durable_every_seconds))
          ? spec.durable_every_seconds
          : 0.0);
  adam->set_no_bias_correction(Has(spec, LOHAN_SPEC_END(no_bias_correction)) &&
                               spec.no_bias_correction != 0);
}

// (layer, begin, end) triples into `ranges`; INVALID_ARGUMENT for a layer
// that cannot be one (CheckModelSpec and lohand check the rest).
absl::Status CopyRanges(
    const uint64_t* triples, uint32_t count, absl::string_view what,
    uint32_t layers,
    google::protobuf::RepeatedPtrField<v1::ElementRange>* ranges) {
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t* triple = triples + 3 * size_t{i};
    if (triple[0] > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("lohan_model_register: ", what, " range ", i, " (layer ",
                       triple[0], ", [", triple[1], ", ", triple[2],
                       ")): the model has ", layers, " layers"));
    }
    v1::ElementRange* range = ranges->Add();
    range->set_layer(static_cast<uint32_t>(triple[0]));
    range->set_begin(triple[1]);
    range->set_end(triple[2]);
  }
  return absl::OkStatus();
}

// The exempt elements are a group of their own, named as the caller knows
// them, as are the others.
absl::Status CopyParamGroups(const lohan_model_spec& spec, const Counts& counts,
                             v1::ModelSpec* model_spec) {
  if (counts.no_weight_decay != 0) {
    v1::ParamGroup* exempt = model_spec->add_param_groups();
    exempt->set_name("no_weight_decay");
    exempt->set_lr_scale(1.0);
    if (absl::Status copied = CopyRanges(
            spec.no_weight_decay, counts.no_weight_decay, "no_weight_decay",
            spec.num_layers, exempt->mutable_ranges());
        !copied.ok()) {
      return copied;
    }
  }
  for (uint32_t g = 0; g < counts.param_groups; ++g) {
    const lohan_param_group& from = spec.param_groups[g];
    v1::ParamGroup* group = model_spec->add_param_groups();
    group->set_name(absl::StrCat("param_groups[", g, "]"));
    group->set_lr_scale(from.lr_scale);
    group->set_weight_decay(from.weight_decay);
    if (absl::Status copied = CopyRanges(
            from.ranges, from.num_ranges, absl::StrCat("param_groups[", g, "]"),
            spec.num_layers, group->mutable_ranges());
        !copied.ok()) {
      return copied;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckStructSize(const lohan_model_spec& spec) {
  if (!Has(spec, offsetof(lohan_model_spec, grad_slots))) {
    return absl::InvalidArgumentError(
        "lohan_model_register: spec->struct_size is smaller than any "
        "lohan_model_spec; set it to sizeof(lohan_model_spec)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SpecFromC(const lohan_model_spec& spec,
                       v1::ModelSpec* model_spec) {
  if (absl::Status size = CheckStructSize(spec); !size.ok()) return size;
  const Counts counts = CountsOf(spec);
  if (absl::Status checked = CheckArrays(spec, counts); !checked.ok()) {
    return checked;
  }
  for (uint32_t i = 0; i < spec.num_layers; ++i) {
    model_spec->add_layer_elements(spec.layer_elements[i]);
  }
  CopyScalars(spec, model_spec);
  return CopyParamGroups(spec, counts, model_spec);
}

absl::Status SettingsFromC(const lohan_model_spec& spec,
                           v1::ModelSpec* model_spec) {
  if (absl::Status size = CheckStructSize(spec); !size.ok()) return size;
  CopyScalars(spec, model_spec);
  return absl::OkStatus();
}

#undef LOHAN_SPEC_END

}  // namespace lohan
