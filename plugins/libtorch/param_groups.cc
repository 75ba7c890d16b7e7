#include "plugins/libtorch/param_groups.h"

#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace lohan::torch_plugin {
namespace {

using Identity = const void*;
using IdentitySet = std::unordered_set<Identity>;

Identity IdentityOf(const torch::Tensor& tensor) {
  return tensor.unsafeGetTensorImpl();
}

// Every name model.named_parameters() gives (a tied tensor under each of
// its names) -> the tensor.
std::unordered_map<std::string, Identity> Aliases(torch::nn::Module& model) {
  std::unordered_map<std::string, Identity> aliases;
  for (const auto& item : model.named_parameters()) {
    aliases.emplace(item.key(), IdentityOf(item.value()));
  }
  return aliases;
}

// The trained parameters' identities -> the name the layers know them by.
std::unordered_map<Identity, std::string> TrainedNames(
    const std::vector<Layer>& layers) {
  std::unordered_map<Identity, std::string> names;
  for (const Layer& layer : layers) {
    for (size_t i = 0; i < layer.params.size(); ++i) {
      names.emplace(IdentityOf(layer.params[i]), layer.names[i]);
    }
  }
  return names;
}

Identity Resolve(const std::unordered_map<std::string, Identity>& aliases,
                 const std::string& name, const std::string& what) {
  const auto found = aliases.find(name);
  if (found == aliases.end()) {
    throw std::invalid_argument("lohan Options: " + what + " names \"" + name +
                                "\", which the model does not have (see its "
                                "named_parameters())");
  }
  return found->second;
}

ParamPredicate Among(const IdentitySet& chosen, const IdentitySet& excluded) {
  return [&chosen, &excluded](const std::string&, const torch::Tensor& param) {
    const Identity id = IdentityOf(param);
    return chosen.count(id) > 0 && excluded.count(id) == 0;
  };
}

}  // namespace

GroupPlan PlanParamGroups(torch::nn::Module& model,
                          const std::vector<Layer>& layers,
                          const Options& options) {
  const auto aliases = Aliases(model);
  const auto trained = TrainedNames(layers);
  GroupPlan plan;
  // Which group holds each parameter, to refuse one in two.
  std::unordered_map<Identity, size_t> owner;
  IdentitySet grouped;
  const IdentitySet none;
  for (size_t n = 0; n < options.param_groups.size(); ++n) {
    const ParamGroup& group = options.param_groups[n];
    const std::string what = "param_groups[" + std::to_string(n) + "]";
    IdentitySet members;
    for (const std::string& name : group.params) {
      const Identity id = Resolve(aliases, name, what);
      const auto name_found = trained.find(id);
      if (name_found == trained.end()) {
        throw std::invalid_argument(
            "lohan Options: " + what + " names \"" + name +
            "\", a parameter the engine does not train (requires_grad is "
            "false)");
      }
      const auto [it, inserted] = owner.emplace(id, n);
      if (!inserted && it->second != n) {
        throw std::invalid_argument("lohan Options: param_groups[" +
                                    std::to_string(it->second) + "] and " +
                                    what + " both hold " + name_found->second +
                                    "; a parameter may be in one group only");
      }
      members.insert(id);
    }
    const double lr = group.lr.value_or(options.lr);
    GroupRanges ranges;
    ranges.lr_scale = options.lr > 0.0 ? lr / options.lr : 1.0;
    ranges.weight_decay = group.weight_decay.value_or(options.weight_decay);
    ranges.ranges = RangesOf(layers, Among(members, none));
    plan.param_groups.push_back(std::move(ranges));
    grouped.insert(members.begin(), members.end());
  }
  if (options.no_weight_decay_1d) {
    plan.no_weight_decay = RangesOf(
        layers, [&grouped](const std::string&, const torch::Tensor& param) {
          return param.dim() < 2 && grouped.count(IdentityOf(param)) == 0;
        });
  } else if (!options.no_weight_decay_names.empty()) {
    IdentitySet exempt;
    for (const std::string& name : options.no_weight_decay_names) {
      exempt.insert(Resolve(aliases, name, "no_weight_decay_names"));
    }
    plan.no_weight_decay = RangesOf(layers, Among(exempt, grouped));
  }
  return plan;
}

}  // namespace lohan::torch_plugin
