#ifndef LOHAN_PLUGINS_LIBTORCH_LAYER_PLAN_H_
#define LOHAN_PLUGINS_LIBTORCH_LAYER_PLAN_H_

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "plugins/libtorch/model_spec_json.h"

namespace lohan::torch_plugin {

// One daemon layer: its trainable parameters, flattened back to back.
struct Layer {
  uint32_t index = 0;
  std::shared_ptr<torch::nn::Module> block;  // null for a rest layer
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  std::vector<int64_t> offsets;  // of each parameter in the flat vector
  int64_t numel = 0;
};

// The layers of `model`, cut as the Python plugin's plan_layers
// (plugins/pytorch/lohan/blocks.py), so both give the same layers: layer
// 0 the trainable parameters outside the blocks of modules before the
// last block (embeddings), layer 1 those of modules after it (final norm,
// head), each absent when empty, then one layer per block with trainable
// parameters, in block order. Parameters in model.named_parameters()
// order, each tensor once under its first name; one shared by two blocks
// goes to a rest layer. Throws std::invalid_argument for no blocks, a
// block outside the model, or no trainable parameters.
std::vector<Layer> PlanLayers(
    const std::shared_ptr<torch::nn::Module>& model,
    const std::vector<std::shared_ptr<torch::nn::Module>>& blocks);

// The element ranges of the parameters `picks` chooses (by the layer's
// name and tensor), in layer order, adjacent ones merged (the Python
// plugin's ranges_of).
using ParamPredicate =
    std::function<bool(const std::string& name, const torch::Tensor& param)>;
std::vector<ElementRange> RangesOf(const std::vector<Layer>& layers,
                                   const ParamPredicate& picks);

// The element ranges of parameters with fewer than 2 dimensions (biases,
// norm weights), adjacent ones merged.
std::vector<ElementRange> OneDimensionalRanges(
    const std::vector<Layer>& layers);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_LAYER_PLAN_H_
