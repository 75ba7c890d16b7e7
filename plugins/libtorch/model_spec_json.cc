#include "plugins/libtorch/model_spec_json.h"

#include <cstdio>
#include <string>

namespace lohan::torch_plugin {

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

namespace {

std::string Number(double value) { return JsonNumber(value); }
std::string Quoted(const std::string& text) { return JsonQuoted(text); }

std::string RangesJson(const std::vector<ElementRange>& ranges) {
  std::string out = "[";
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (i > 0) out += ",";
    out += "{\"layer\":" + std::to_string(ranges[i].layer) +
           ",\"begin\":" + std::to_string(ranges[i].begin) +
           ",\"end\":" + std::to_string(ranges[i].end) + "}";
  }
  return out + "]";
}

std::string GroupJson(const std::string& name, double lr_scale,
                      double weight_decay,
                      const std::vector<ElementRange>& ranges) {
  return "{\"name\":" + Quoted(name) + ",\"lr_scale\":" + Number(lr_scale) +
         ",\"weight_decay\":" + Number(weight_decay) +
         ",\"ranges\":" + RangesJson(ranges) + "}";
}

std::string JoinedList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ",";
    out += items[i];
  }
  return out + "]";
}

}  // namespace

std::string ModelSpecJson(const ModelSpecFields& spec) {
  std::string elements = "[";
  for (size_t i = 0; i < spec.layer_elements.size(); ++i) {
    if (i > 0) elements += ",";
    elements += std::to_string(spec.layer_elements[i]);
  }
  elements += "]";
  std::vector<std::string> groups;
  if (!spec.no_weight_decay.empty()) {
    groups.push_back(
        GroupJson("no_weight_decay", 1.0, 0.0, spec.no_weight_decay));
  }
  for (size_t n = 0; n < spec.param_groups.size(); ++n) {
    const GroupRanges& group = spec.param_groups[n];
    groups.push_back(GroupJson("param_groups[" + std::to_string(n) + "]",
                               group.lr_scale, group.weight_decay,
                               group.ranges));
  }
  const std::string dtype = spec.dtype == "bf16" ? "DTYPE_BF16" : "DTYPE_FP32";
  return "{\"layer_elements\":" + elements + ",\"dtype\":" + Quoted(dtype) +
         ",\"adam\":{\"lr\":" + Number(spec.lr) +
         ",\"beta1\":" + Number(spec.beta1) +
         ",\"beta2\":" + Number(spec.beta2) + ",\"eps\":" + Number(spec.eps) +
         ",\"weight_decay\":" + Number(spec.weight_decay) +
         ",\"decoupled_weight_decay\":true,\"amsgrad\":false,"
         "\"bf16_moments\":false}" +
         ",\"max_grad_norm\":" + Number(spec.max_grad_norm) +
         ",\"skip_nonfinite\":true,\"chunk_elements\":0,"
         "\"activation_bytes\":0" +
         ",\"grad_slots\":" + std::to_string(spec.grad_slots) +
         ",\"weight_slots\":" + std::to_string(spec.weight_slots) +
         ",\"arena_fit\":" +
         Quoted(spec.fit_arena ? "ARENA_FIT_MOST" : "ARENA_FIT_AS_GIVEN") +
         ",\"initial_iteration\":" + std::to_string(spec.initial_iteration) +
         ",\"param_groups\":" + JoinedList(groups) +
         ",\"overlap_updates\":false" +
         ",\"clip_schedule\":\"CLIP_SCHEDULE_DEFERRED\"" +
         ",\"in_order_service\":false" +
         ",\"commit_interval\":" + std::to_string(spec.commit_interval) + "}";
}

std::string OpenJobRequestJson(const std::string& job_name,
                               const std::string& model_spec_json,
                               bool resume) {
  return "{\"spec\":{\"name\":" + Quoted(job_name) +
         ",\"model\":" + model_spec_json +
         "},\"resume\":" + (resume ? "true" : "false") + "}";
}

}  // namespace lohan::torch_plugin
