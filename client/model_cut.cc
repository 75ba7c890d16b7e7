#include "client/model_cut.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "spec/model_spec_checks.h"

namespace lohan {
namespace {

using ParameterSet = absl::flat_hash_set<uint32_t>;

// Units beyond this in one block are a describing plugin's mistake (a
// block's linears number in the tens).
constexpr uint32_t kMaxUnitsPerBlock = 4096;

absl::StatusOr<uint64_t> ElementsOf(const v1::DescribedParameter& parameter) {
  uint64_t elements = 1;
  for (const int64_t dimension : parameter.shape()) {
    if (dimension < 0) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ",
                                                     parameter.name(),
                                                     " has a negative "
                                                     "dimension (",
                                                     dimension, ")"));
    }
    elements *= static_cast<uint64_t>(dimension);
  }
  return elements;
}

// The layers, each parameter placed (see CutModel).
absl::StatusOr<std::vector<v1::CutLayer>> CutLayers(
    const v1::ModelDescription& model) {
  if (model.parameters().empty()) {
    return absl::InvalidArgumentError(
        "the model has no trainable parameters (requires_grad) for lohan to "
        "train");
  }
  v1::CutLayer before, after;
  before.set_block(-1);
  after.set_block(-1);
  // Per block, its layers by unit (index 0: the block's own).
  std::vector<std::vector<v1::CutLayer>> blocks(model.blocks());
  for (int i = 0; i < model.parameters_size(); ++i) {
    const v1::DescribedParameter& parameter = model.parameters(i);
    absl::StatusOr<uint64_t> elements = ElementsOf(parameter);
    if (!elements.ok()) return elements.status();
    for (const uint32_t block : parameter.blocks()) {
      if (block >= model.blocks()) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", parameter.name(), " is in block ", block,
                         " of ", model.blocks()));
      }
    }
    if (parameter.unit() > kMaxUnitsPerBlock) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", parameter.name(), " is in unit ", parameter.unit(),
          " of its block; a block has at most ", kMaxUnitsPerBlock, " units"));
    }
    v1::CutLayer* layer = parameter.after_blocks() ? &after : &before;
    if (parameter.blocks_size() == 1) {
      std::vector<v1::CutLayer>& units = blocks[parameter.blocks(0)];
      if (units.size() <= parameter.unit()) units.resize(parameter.unit() + 1);
      layer = &units[parameter.unit()];
      layer->set_block(static_cast<int32_t>(parameter.blocks(0)));
      layer->set_unit(parameter.unit());
    }
    layer->add_parameters(static_cast<uint32_t>(i));
    layer->add_offsets(layer->elements());
    layer->set_elements(layer->elements() + *elements);
  }
  std::vector<v1::CutLayer> layers;
  for (v1::CutLayer* rest : {&before, &after}) {
    if (rest->elements() > 0) layers.push_back(std::move(*rest));
  }
  for (std::vector<v1::CutLayer>& units : blocks) {
    for (v1::CutLayer& layer : units) {
      if (layer.elements() > 0) layers.push_back(std::move(layer));
    }
  }
  return layers;
}

// Every name of the model's parameters -> the trained parameter's index,
// or -1 for an untrained one.
absl::flat_hash_map<std::string, int> NamesOf(
    const v1::ModelDescription& model) {
  absl::flat_hash_map<std::string, int> names;
  for (const std::string& name : model.untrained()) names.emplace(name, -1);
  for (int i = 0; i < model.parameters_size(); ++i) {
    names[model.parameters(i).name()] = i;
    for (const std::string& alias : model.parameters(i).aliases()) {
      names[alias] = i;
    }
  }
  return names;
}

// The element ranges of `picked` parameters, in layer order, adjacent ones
// merged; as ranges of this rank's shards when `world` > 1.
std::vector<v1::ElementRange> RangesOf(const std::vector<v1::CutLayer>& layers,
                                       const v1::ModelDescription& model,
                                       const ParameterSet& picked) {
  std::vector<v1::ElementRange> ranges;
  for (uint32_t l = 0; l < layers.size(); ++l) {
    const v1::CutLayer& layer = layers[l];
    for (int p = 0; p < layer.parameters_size(); ++p) {
      if (!picked.contains(layer.parameters(p))) continue;
      const uint64_t begin = layer.offsets(p);
      const uint64_t end =
          begin + *ElementsOf(model.parameters(layer.parameters(p)));
      if (!ranges.empty() && ranges.back().layer() == l &&
          ranges.back().end() == begin) {
        ranges.back().set_end(end);
        continue;
      }
      v1::ElementRange& range = ranges.emplace_back();
      range.set_layer(l);
      range.set_begin(begin);
      range.set_end(end);
    }
  }
  if (model.world() < 2) return ranges;
  std::vector<v1::ElementRange> local;
  for (const v1::ElementRange& range : ranges) {
    const uint64_t shard =
        (layers[range.layer()].elements() + model.world() - 1) / model.world();
    const uint64_t first = model.rank() * shard;
    const uint64_t low = std::max(range.begin(), first);
    const uint64_t high = std::min(range.end(), first + shard);
    if (low >= high) continue;
    v1::ElementRange& piece = local.emplace_back(range);
    piece.set_begin(low - first);
    piece.set_end(high - first);
  }
  return local;
}

void AddGroup(const std::string& name, double lr_scale, double weight_decay,
              const std::vector<v1::ElementRange>& ranges,
              v1::ModelSpec& spec) {
  v1::ParamGroup* group = spec.add_param_groups();
  group->set_name(name);
  group->set_lr_scale(lr_scale);
  group->set_weight_decay(weight_decay);
  for (const v1::ElementRange& range : ranges) *group->add_ranges() = range;
}

// The members of group `n`; `owner` notes which group holds each.
absl::StatusOr<ParameterSet> GroupMembers(
    const v1::ModelDescription& model, int n,
    const absl::flat_hash_map<std::string, int>& names,
    absl::flat_hash_map<uint32_t, int>& owner) {
  ParameterSet members;
  for (const std::string& name : model.param_groups(n).params()) {
    const auto found = names.find(name);
    if (found == names.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param_groups[", n, "] names \"", name,
          "\", which the model does not have (see its named_parameters())"));
    }
    if (found->second < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param_groups[", n, "] names \"", name,
          "\", a parameter the engine does not train (requires_grad is "
          "false)"));
    }
    const uint32_t index = static_cast<uint32_t>(found->second);
    const auto [it, inserted] = owner.emplace(index, n);
    if (!inserted && it->second != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("param_groups[", it->second, "] and param_groups[", n,
                       "] both hold ", model.parameters(index).name(),
                       "; a parameter may be in one group only"));
    }
    members.insert(index);
  }
  return members;
}

absl::Status AddParamGroups(const v1::ModelDescription& model,
                            const std::vector<v1::CutLayer>& layers,
                            const absl::flat_hash_map<std::string, int>& names,
                            ParameterSet& grouped, v1::ModelSpec& spec) {
  const double job_lr = model.spec().adam().lr();
  absl::flat_hash_map<uint32_t, int> owner;
  for (int n = 0; n < model.param_groups_size(); ++n) {
    const v1::ParamGroupRequest& request = model.param_groups(n);
    absl::StatusOr<ParameterSet> members = GroupMembers(model, n, names, owner);
    if (!members.ok()) return members.status();
    const double lr = request.has_lr() ? request.lr() : job_lr;
    const double decay = request.has_weight_decay()
                             ? request.weight_decay()
                             : model.spec().adam().weight_decay();
    if (!(lr >= 0 && std::isfinite(lr)) ||
        !(decay >= 0 && std::isfinite(decay))) {
      return absl::InvalidArgumentError(
          absl::StrCat("param_groups[", n, "]: lr ", lr, " and weight_decay ",
                       decay, " must be finite and >= 0"));
    }
    if (job_lr == 0 && lr != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param_groups[", n, "] has lr ", lr,
          " but the job's lr is 0: a group runs at a fixed multiple of the "
          "job's lr"));
    }
    AddGroup(absl::StrCat("param_groups[", n, "]"),
             job_lr > 0 ? lr / job_lr : 1.0, decay,
             RangesOf(layers, model, *members), spec);
    grouped.insert(members->begin(), members->end());
  }
  return absl::OkStatus();
}

// The parameters the no-weight-decay rule picks, but for grouped ones.
absl::StatusOr<ParameterSet> ExemptFromDecay(
    const v1::ModelDescription& model,
    const absl::flat_hash_map<std::string, int>& names,
    const ParameterSet& grouped) {
  ParameterSet exempt;
  for (const std::string& name : model.no_weight_decay()) {
    const auto found = names.find(name);
    if (found == names.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no_weight_decay names \"", name,
          "\", which the model does not have (see its named_parameters())"));
    }
    if (found->second >= 0) exempt.insert(static_cast<uint32_t>(found->second));
  }
  if (model.no_weight_decay_1d()) {
    for (int i = 0; i < model.parameters_size(); ++i) {
      if (model.parameters(i).shape_size() < 2) exempt.insert(i);
    }
  }
  for (const uint32_t index : grouped) exempt.erase(index);
  return exempt;
}

}  // namespace

absl::StatusOr<v1::ModelCut> CutModel(const v1::ModelDescription& model) {
  // A description without a spec asks for the layers alone. The settings
  // first: the groups below are judged against the job's lr and decay,
  // which must be sound for those refusals to mean anything.
  if (model.has_spec()) {
    if (absl::Status settings = CheckSpecSettings(model.spec());
        !settings.ok()) {
      return settings;
    }
  }
  absl::StatusOr<std::vector<v1::CutLayer>> layers = CutLayers(model);
  if (!layers.ok()) return layers.status();
  v1::ModelCut cut;
  v1::ModelSpec& spec = *cut.mutable_spec();
  spec = model.spec();
  spec.clear_layer_elements();
  spec.clear_layer_places();
  spec.clear_param_groups();
  for (const v1::CutLayer& layer : *layers) {
    spec.add_layer_elements(model.world() < 2
                                ? layer.elements()
                                : (layer.elements() + model.world() - 1) /
                                      model.world());
    v1::LayerPlace* place = spec.add_layer_places();
    place->set_block(layer.block());
    place->set_unit(layer.unit());
  }
  const absl::flat_hash_map<std::string, int> names = NamesOf(model);
  ParameterSet grouped;
  v1::ModelSpec groups;
  if (absl::Status added =
          AddParamGroups(model, *layers, names, grouped, groups);
      !added.ok()) {
    return added;
  }
  absl::StatusOr<ParameterSet> exempt = ExemptFromDecay(model, names, grouped);
  if (!exempt.ok()) return exempt.status();
  const std::vector<v1::ElementRange> exempt_ranges =
      RangesOf(*layers, model, *exempt);
  if (!exempt_ranges.empty()) {
    AddGroup("no_weight_decay", 1.0, 0.0, exempt_ranges, spec);
  }
  for (const v1::ParamGroup& group : groups.param_groups()) {
    *spec.add_param_groups() = group;
  }
  // Its settings are the description's, checked above.
  if (model.has_spec()) {
    if (absl::Status checked = CheckModelShape(spec); !checked.ok()) {
      return checked;
    }
  }
  for (v1::CutLayer& layer : *layers) *cut.add_layers() = std::move(layer);
  return cut;
}

}  // namespace lohan
