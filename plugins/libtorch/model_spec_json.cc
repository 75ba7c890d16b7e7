#include "plugins/libtorch/model_spec_json.h"

#include <cstdio>
#include <string>
#include <utility>

#include "plugins/libtorch/handles.h"
#include "plugins/libtorch/lohan_error.h"

namespace lohan::torch_plugin {

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

std::string ModelSpecBuilder::Json() {
  spec_.layer_elements = layer_elements_.data();
  spec_.num_layers = static_cast<uint32_t>(layer_elements_.size());
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
