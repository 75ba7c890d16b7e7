#include "daemon/session/model_layout_of.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace lohan {
namespace {

DType GradDtype(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16:
      return DType::kBFloat16;
    case v1::DTYPE_FP16:
      return DType::kFloat16;
    default:
      return DType::kFloat32;
  }
}

std::vector<LayerRange> RangesOf(
    const google::protobuf::RepeatedPtrField<v1::ElementRange>& from) {
  std::vector<LayerRange> ranges;
  ranges.reserve(from.size());
  for (const v1::ElementRange& range : from) {
    ranges.push_back(LayerRange{range.layer(), range.begin(), range.end()});
  }
  return ranges;
}

}  // namespace

absl::StatusOr<ModelLayout> ModelLayoutOf(const v1::ModelSpec& spec) {
  ModelLayout layout;
  layout.layer_elements.assign(spec.layer_elements().begin(),
                               spec.layer_elements().end());
  layout.chunk_elements = spec.chunk_elements() != 0 ? spec.chunk_elements()
                                                     : kDefaultChunkElements;
  layout.grad_dtype = GradDtype(spec.dtype());
  // fp32 models read their weights back in fp32 (FETCH_PARAMS); the
  // 16-bit copy is only written for 16-bit models.
  layout.weight16_dtype = layout.grad_dtype == DType::kFloat32
                              ? DType::kBFloat16
                              : layout.grad_dtype;
  const v1::AdamSpec& adam = spec.adam();
  layout.adam =
      AdamOptions{.lr = adam.lr(),
                  .beta1 = adam.beta1(),
                  .beta2 = adam.beta2(),
                  .eps = adam.eps(),
                  .weight_decay = adam.weight_decay(),
                  .decoupled_weight_decay = adam.decoupled_weight_decay(),
                  .amsgrad = adam.amsgrad(),
                  .bias_correction = !adam.no_bias_correction()};
  layout.moment_dtype =
      adam.bf16_moments() ? DType::kBFloat16 : DType::kFloat32;
  for (int g = 0; g < spec.param_groups_size(); ++g) {
    const v1::ParamGroup& group = spec.param_groups(g);
    const std::string name = group.name().empty()
                                 ? absl::StrCat("param_groups[", g, "]")
                                 : group.name();
    if (absl::Status added = AddElementGroup(
            ElementGroup{name, group.lr_scale(), group.weight_decay()},
            RangesOf(group.ranges()), layout);
        !added.ok()) {
      return added;
    }
  }
  if (absl::Status valid = ValidateLayout(layout); !valid.ok()) return valid;
  return layout;
}

}  // namespace lohan
