#include "plugins/libtorch/model_spec_json.h"

#include <cstdio>
#include <string>
#include <utility>

#include "plugins/libtorch/handles.h"
#include "plugins/libtorch/lohan_error.h"

namespace lohan::torch_plugin {
namespace {

std::vector<uint64_t> Triples(const std::vector<ElementRange>& ranges) {
  std::vector<uint64_t> triples;
  for (const ElementRange& range : ranges) {
    triples.insert(triples.end(), {range.layer, range.begin, range.end});
  }
  return triples;
}

}  // namespace

ModelSpecBuilder::ModelSpecBuilder() {
  spec_.struct_size = sizeof(spec_);
  spec_.dtype = LOHAN_DTYPE_FP32;
  spec_.lr = 1e-3;
  spec_.beta1 = 0.9;
  spec_.beta2 = 0.999;
  spec_.eps = 1e-8;
  spec_.adamw = 1;
  spec_.skip_nonfinite = 1;
  spec_.clip_schedule = LOHAN_CLIP_DEFERRED;
}

void ModelSpecBuilder::set_layer_elements(std::vector<uint64_t> elements) {
  layer_elements_ = std::move(elements);
}

void ModelSpecBuilder::set_no_weight_decay(
    const std::vector<ElementRange>& ranges) {
  no_weight_decay_ = Triples(ranges);
}

void ModelSpecBuilder::set_param_groups(
    const std::vector<GroupRanges>& groups) {
  group_ranges_.clear();
  groups_.clear();
  for (const GroupRanges& group : groups) {
    group_ranges_.push_back(Triples(group.ranges));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    groups_.push_back({groups[g].lr_scale, groups[g].weight_decay,
                       group_ranges_[g].data(),
                       static_cast<uint32_t>(groups[g].ranges.size())});
  }
}

std::string ModelSpecBuilder::Json() {
  spec_.layer_elements = layer_elements_.data();
  spec_.num_layers = static_cast<uint32_t>(layer_elements_.size());
  spec_.no_weight_decay = no_weight_decay_.data();
  spec_.num_no_weight_decay =
      static_cast<uint32_t>(no_weight_decay_.size() / 3);
  spec_.param_groups = groups_.data();
  spec_.num_param_groups = static_cast<uint32_t>(groups_.size());
  char* json = nullptr;
  ThrowIfFailed(lohan_model_spec_json(&spec_, &json));
  const OwnedString owned(json);
  return owned.get();
}

std::string JsonNumber(double value) {
  char text[40];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

std::string JsonQuoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string OpenJobRequestJson(const std::string& job_name,
                               const std::string& model_spec_json,
                               bool resume) {
  return "{\"spec\":{\"name\":" + JsonQuoted(job_name) +
         ",\"model\":" + model_spec_json +
         "},\"resume\":" + (resume ? "true" : "false") + "}";
}

}  // namespace lohan::torch_plugin
