#include "plugins/libtorch/layer_plan.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "lohan/lohan_model_cut.h"
#include "plugins/libtorch/lohan_error.h"
#include "plugins/libtorch/model_spec_json.h"

namespace lohan::torch_plugin {
namespace {

using Identity = const void*;

Identity IdentityOf(const torch::Tensor& tensor) {
  return tensor.unsafeGetTensorImpl();
}

struct CutDestroyer {
  void operator()(lohan_model_cut* cut) const { lohan_model_cut_destroy(cut); }
};

template <typename T, typename F>
std::string JsonList(const std::vector<T>& items, F&& item) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    out += (i > 0 ? "," : "") + item(items[i]);
  }
  return out + "]";
}

std::string Quoted(const std::string& text) { return JsonQuoted(text); }

// The trained parameters of `model` as the description lists them, with
// their tensors in the same order.
class Description {
 public:
  Description(torch::nn::Module& model,
              const std::vector<std::shared_ptr<torch::nn::Module>>& blocks) {
    const auto named_modules = model.named_modules();
    std::unordered_map<const torch::nn::Module*, int> position;
    for (const auto& item : named_modules) {
      position.emplace(item.value().get(), static_cast<int>(position.size()));
    }
    int last = -1;
    std::unordered_map<Identity, std::vector<int>> holders;
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (blocks[b] == nullptr || position.count(blocks[b].get()) == 0) {
        throw std::invalid_argument("lohan Engine: blocks[" +
                                    std::to_string(b) +
                                    "] is not a submodule of the model");
      }
      for (const auto& module : blocks[b]->modules(/*include_self=*/true)) {
        auto found = position.find(module.get());
        if (found != position.end()) last = std::max(last, found->second);
      }
      for (const auto& param : blocks[b]->parameters()) {
        std::vector<int>& held = holders[IdentityOf(param)];
        if (held.empty() || held.back() != static_cast<int>(b)) {
          held.push_back(static_cast<int>(b));
        }
      }
    }
    std::unordered_map<Identity, size_t> index;
    for (const auto& item : model.named_parameters()) {
      const torch::Tensor& param = item.value();
      if (!param.requires_grad()) {
        untrained_.push_back(Quoted(item.key()));
        continue;
      }
      const auto [it, first] = index.emplace(IdentityOf(param), params_.size());
      if (!first) {
        aliases_[it->second].push_back(item.key());
        continue;
      }
      const std::string& name = item.key();
      const size_t dot = name.rfind('.');
      const auto* module = named_modules.find(
          dot == std::string::npos ? "" : name.substr(0, dot));
      const int at = module == nullptr ? -1 : position.at(module->get());
      names_.push_back(name);
      params_.push_back(param);
      aliases_.emplace_back();
      blocks_of_.push_back(holders[IdentityOf(param)]);
      after_.push_back(at > last);
    }
    blocks_ = blocks.size();
  }

  // The ModelDescription JSON, with `groups` (fields and a comma first)
  // and `spec_json`.
  std::string Json(const std::string& groups,
                   const std::string& spec_json) const {
    std::string parameters;
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto sizes = params_[i].sizes();
      parameters +=
          std::string(i > 0 ? "," : "") + "{\"name\":" + Quoted(names_[i]) +
          ",\"aliases\":" + JsonList(aliases_[i], Quoted) + ",\"shape\":" +
          JsonList(std::vector<int64_t>(sizes.begin(), sizes.end()),
                   [](int64_t n) { return std::to_string(n); }) +
          ",\"blocks\":" +
          JsonList(blocks_of_[i], [](int b) { return std::to_string(b); }) +
          ",\"after_blocks\":" + (after_[i] ? "true" : "false") + "}";
    }
    return "{\"blocks\":" + std::to_string(blocks_) + ",\"parameters\":[" +
           parameters + "],\"untrained\":[" + Join(untrained_) + "]" + groups +
           (spec_json.empty() ? "" : ",\"spec\":" + spec_json) + "}";
  }

  const std::vector<std::string>& names() const { return names_; }
  const std::vector<torch::Tensor>& params() const { return params_; }

 private:
  static std::string Join(const std::vector<std::string>& items) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i)
      out += (i > 0 ? "," : "") + items[i];
    return out;
  }

  size_t blocks_ = 0;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
  std::vector<std::vector<std::string>> aliases_;
  std::vector<std::vector<int>> blocks_of_;
  std::vector<bool> after_;
  std::vector<std::string> untrained_;  // quoted
};

// Options' groups as ModelDescription fields, each after a comma.
std::string GroupsJson(const Options& options) {
  std::string json =
      ",\"no_weight_decay_1d\":" +
      std::string(options.no_weight_decay_1d ? "true" : "false") +
      ",\"no_weight_decay\":" +
      JsonList(options.no_weight_decay_names, Quoted) + ",\"param_groups\":";
  return json + JsonList(options.param_groups, [](const ParamGroup& group) {
           std::string out = "{\"params\":" + JsonList(group.params, Quoted);
           if (group.lr) out += ",\"lr\":" + JsonNumber(*group.lr);
           if (group.weight_decay) {
             out += ",\"weight_decay\":" + JsonNumber(*group.weight_decay);
           }
           return out + "}";
         });
}

}  // namespace

ModelPlan PlanModel(
    const std::shared_ptr<torch::nn::Module>& model,
    const std::vector<std::shared_ptr<torch::nn::Module>>& blocks,
    const Options* options, const std::string& spec_json) {
  if (blocks.empty()) {
    throw std::invalid_argument(
        "lohan Engine: blocks is empty; pass the model's repeated blocks "
        "(e.g. the children of its ModuleList)");
  }
  const Description description(*model, blocks);
  lohan_model_cut* made = nullptr;
  const int status = lohan_model_cut_create(
      description
          .Json(options != nullptr ? GroupsJson(*options) : "", spec_json)
          .c_str(),
      &made);
  if (status == LOHAN_INVALID_ARGUMENT) {
    throw std::invalid_argument(
        std::string(options != nullptr ? "lohan Options: " : "lohan Engine: ") +
        lohan_last_error());
  }
  ThrowIfFailed(status);
  const std::unique_ptr<lohan_model_cut, CutDestroyer> cut(made);
  ModelPlan plan;
  plan.spec_json = lohan_model_cut_spec_json(cut.get());
  for (uint32_t l = 0; l < lohan_model_cut_layers(cut.get()); ++l) {
    Layer& layer = plan.layers.emplace_back();
    layer.index = l;
    const int32_t block = lohan_model_cut_layer_block(cut.get(), l);
    if (block >= 0) layer.block = blocks[block];
    for (uint32_t p = 0; p < lohan_model_cut_layer_size(cut.get(), l); ++p) {
      uint32_t parameter = 0;
      uint64_t offset = 0;
      ThrowIfFailed(lohan_model_cut_layer_parameter(cut.get(), l, p, &parameter,
                                                    &offset));
      layer.names.push_back(description.names()[parameter]);
      layer.params.push_back(description.params()[parameter]);
      layer.offsets.push_back(static_cast<int64_t>(offset));
      layer.numel += description.params()[parameter].numel();
    }
  }
  return plan;
}

std::vector<Layer> PlanLayers(
    const std::shared_ptr<torch::nn::Module>& model,
    const std::vector<std::shared_ptr<torch::nn::Module>>& blocks) {
  return PlanModel(model, blocks, nullptr, "").layers;
}

}  // namespace lohan::torch_plugin
