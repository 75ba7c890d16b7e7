#include "plugins/libtorch/layer_plan.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace lohan::torch_plugin {
namespace {

constexpr int kRest = -1;  // owner of a parameter that goes to a rest layer

const void* Identity(const torch::Tensor& tensor) {
  return tensor.unsafeGetTensorImpl();
}

void Add(Layer& layer, const std::string& name, const torch::Tensor& param) {
  layer.names.push_back(name);
  layer.params.push_back(param);
  layer.offsets.push_back(layer.numel);
  layer.numel += param.numel();
}

}  // namespace

std::vector<Layer> PlanLayers(
    const std::shared_ptr<torch::nn::Module>& model,
    const std::vector<std::shared_ptr<torch::nn::Module>>& blocks) {
  if (blocks.empty()) {
    throw std::invalid_argument(
        "lohan Engine: blocks is empty; pass the model's repeated blocks "
        "(e.g. the children of its ModuleList)");
  }
  // Module order as named_modules() yields it, each module at its first
  // position.
  const auto named_modules = model->named_modules();
  std::unordered_map<const torch::nn::Module*, int> position;
  for (const auto& item : named_modules) {
    position.emplace(item.value().get(), static_cast<int>(position.size()));
  }
  int last = -1;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] == nullptr || position.count(blocks[i].get()) == 0) {
      throw std::invalid_argument("lohan Engine: blocks[" + std::to_string(i) +
                                  "] is not a submodule of the model");
    }
    for (const auto& module : blocks[i]->modules(/*include_self=*/true)) {
      auto found = position.find(module.get());
      if (found != position.end()) last = std::max(last, found->second);
    }
  }

  std::unordered_map<const void*, int> owner;
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (const auto& param : blocks[i]->parameters()) {
      if (!param.requires_grad()) continue;
      auto [it, inserted] = owner.emplace(Identity(param), static_cast<int>(i));
      if (!inserted && it->second != static_cast<int>(i)) it->second = kRest;
    }
  }

  Layer before;
  Layer after;
  std::vector<Layer> per_block(blocks.size());
  std::unordered_set<const void*> seen;
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const torch::Tensor& param = item.value();
    if (!param.requires_grad() || !seen.insert(Identity(param)).second) {
      continue;
    }
    auto found = owner.find(Identity(param));
    const int where = found == owner.end() ? kRest : found->second;
    if (where != kRest) {
      Add(per_block[where], name, param);
      continue;
    }
    const size_t dot = name.rfind('.');
    const std::string owner_name =
        dot == std::string::npos ? "" : name.substr(0, dot);
    const auto* module = named_modules.find(owner_name);
    const int at = module == nullptr ? -1 : position.at(module->get());
    Add(at > last ? after : before, name, param);
  }
  for (size_t i = 0; i < blocks.size(); ++i) per_block[i].block = blocks[i];

  std::vector<Layer> layers;
  for (Layer* layer : {&before, &after}) {
    if (layer->numel > 0) layers.push_back(std::move(*layer));
  }
  for (Layer& layer : per_block) {
    if (layer.numel > 0) layers.push_back(std::move(layer));
  }
  if (layers.empty()) {
    throw std::invalid_argument(
        "lohan Engine: the model has no trainable parameters "
        "(requires_grad) for lohan to train");
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i].index = static_cast<uint32_t>(i);
  }
  return layers;
}

std::vector<ElementRange> RangesOf(const std::vector<Layer>& layers,
                                   const ParamPredicate& picks) {
  std::vector<ElementRange> ranges;
  for (const Layer& layer : layers) {
    for (size_t i = 0; i < layer.params.size(); ++i) {
      if (!picks(layer.names[i], layer.params[i])) continue;
      const uint64_t begin = layer.offsets[i];
      const uint64_t end = begin + layer.params[i].numel();
      if (!ranges.empty() && ranges.back().layer == layer.index &&
          ranges.back().end == begin) {
        ranges.back().end = end;
      } else {
        ranges.push_back({layer.index, begin, end});
      }
    }
  }
  return ranges;
}

std::vector<ElementRange> OneDimensionalRanges(
    const std::vector<Layer>& layers) {
  return RangesOf(layers, [](const std::string&, const torch::Tensor& param) {
    return param.dim() < 2;
  });
}

}  // namespace lohan::torch_plugin
