#ifndef LOHAN_PLUGINS_LIBTORCH_PARAM_GROUPS_H_
#define LOHAN_PLUGINS_LIBTORCH_PARAM_GROUPS_H_

#include <torch/nn/module.h>

#include <vector>

#include "plugins/libtorch/layer_plan.h"
#include "plugins/libtorch/model_spec_json.h"
#include "plugins/libtorch/options.h"

namespace lohan::torch_plugin {

// What the daemon runs for Options' weight-decay exemptions and
// param_groups, as the Python plugin maps lohan.init's no_weight_decay and
// param_groups (plugins/pytorch/lohan/groups.py), so both plugins send the
// same ModelSpec groups.
struct GroupPlan {
  // Updated with weight decay 0 (the ModelSpec group "no_weight_decay"):
  // the parameters no_weight_decay_1d or no_weight_decay_names picks, but
  // for those of a param group (whose own weight_decay holds).
  std::vector<ElementRange> no_weight_decay;
  // One per Options::param_groups entry, in order ("param_groups[n]"):
  // lr_scale = the group's lr / Options::lr (1 when both are 0).
  std::vector<GroupRanges> param_groups;
};

// Throws std::invalid_argument for a name `model` does not have
// (no_weight_decay_names or a group's), a parameter the engine does not
// train (frozen) in a group, or one parameter in two groups, naming it.
// `layers` is PlanLayers(model, ...).
GroupPlan PlanParamGroups(torch::nn::Module& model,
                          const std::vector<Layer>& layers,
                          const Options& options);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_PARAM_GROUPS_H_
