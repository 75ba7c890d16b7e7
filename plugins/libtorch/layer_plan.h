#ifndef LOHAN_PLUGINS_LIBTORCH_LAYER_PLAN_H_
#define LOHAN_PLUGINS_LIBTORCH_LAYER_PLAN_H_

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plugins/libtorch/options.h"

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

// The model as liblohan_client cuts it (lohan_model_cut.h, the cut the
// Python plugin gets too): the layers, and the job's ModelSpec in
// protobuf JSON.
struct ModelPlan {
  std::vector<Layer> layers;
  std::string spec_json;
};

// Describes `model` to liblohan_client (its trained parameters in
// named_parameters() order, each tensor once under its first name with
// its other names as aliases; which blocks hold each; whether its module
// comes after the last block) and builds the layers from the cut: layer 0
// the rest before the blocks (embeddings), layer 1 the rest after them
// (final norm, head), each absent when empty, then one layer per block
// with trainable parameters; a parameter two blocks share goes to a rest
// layer. With `options`, its groups (no_weight_decay_1d / _names,
// param_groups) go into the spec, whose other fields are `spec_json`'s (a
// ModelSpec). Throws std::invalid_argument for no blocks, a block outside
// the model, no trainable parameters, or groups the library refuses
// ("lohan Options: " and its words).
ModelPlan PlanModel(
    const std::shared_ptr<torch::nn::Module>& model,
    const std::vector<std::shared_ptr<torch::nn::Module>>& blocks,
    const Options* options, const std::string& spec_json);

// PlanModel's layers alone.
std::vector<Layer> PlanLayers(
    const std::shared_ptr<torch::nn::Module>& model,
    const std::vector<std::shared_ptr<torch::nn::Module>>& blocks);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_LAYER_PLAN_H_
