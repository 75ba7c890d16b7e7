#include "plugins/libtorch/model_spec_json.h"

#include <cmath>
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

void SetSpecSettings(const Options& options, lohan_model_spec& spec) {
  spec.dtype = options.dtype == "bf16" ? LOHAN_DTYPE_BF16 : LOHAN_DTYPE_FP32;
  spec.lr = options.lr;
  spec.beta1 = options.beta1;
  spec.beta2 = options.beta2;
  spec.eps = options.eps;
  spec.weight_decay = options.weight_decay;
  spec.max_grad_norm = options.max_grad_norm;
  spec.bf16_moments = options.bf16_moments ? 1 : 0;
  spec.no_bias_correction = options.bias_correction ? 0 : 1;
  spec.skip_nonfinite = options.skip_nonfinite ? 1 : 0;
  spec.clip_schedule = options.clip_schedule == "redo-all"
                           ? LOHAN_CLIP_REDO_ALL
                           : LOHAN_CLIP_DEFERRED;
  spec.chunk_elements = options.chunk_elements;
  spec.in_order_service = options.service == "in-order" ? 1 : 0;
  spec.commit_interval = options.commit_interval;
  spec.durable_every_seconds = options.durable_every_seconds;
}

std::string JsonNumber(double value) {
  // Protobuf's JSON spells the values JSON has no number for as strings,
  // so the library, not the parser, says what is wrong with them.
  if (std::isnan(value)) return "\"NaN\"";
  if (std::isinf(value)) return value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
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
