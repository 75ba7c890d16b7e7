#ifndef LOHAN_PLUGINS_LIBTORCH_MODEL_SPEC_JSON_H_
#define LOHAN_PLUGINS_LIBTORCH_MODEL_SPEC_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

namespace lohan::torch_plugin {

// Elements [begin, end) of one layer's flat vector.
struct ElementRange {
  uint32_t layer = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// One of the ModelSpec's param groups beyond "no_weight_decay": elements
// updated with lr x lr_scale and this weight decay.
struct GroupRanges {
  double lr_scale = 1.0;
  double weight_decay = 0.0;
  std::vector<ElementRange> ranges;
};

// The model as lohand's ModelSpec (proto/lohan.proto) takes it; the fields
// the Python plugin's ModelSpec.to_proto sends, with its defaults for the
// rest (AdamW, inf/nan steps skipped, deferred clipping).
struct ModelSpecFields {
  std::vector<uint64_t> layer_elements;
  std::string dtype = "fp32";  // "fp32" or "bf16"
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 0.0;
  // Updated with weight decay 0: sent as the param group
  // "no_weight_decay" (lr_scale 1), as the Python plugin does.
  std::vector<ElementRange> no_weight_decay;
  // Sent after it as "param_groups[0]", "param_groups[1]", ... (the
  // Python plugin's names, so both plugins' ModelSpecs agree).
  std::vector<GroupRanges> param_groups;
  // 0: one buffer per layer; K: K shared ones (ModelSpec.grad_slots).
  uint32_t grad_slots = 0;
  uint32_t weight_slots = 0;
  // ARENA_FIT_MOST when true, else ARENA_FIT_AS_GIVEN.
  bool fit_arena = false;
  // A new job's first update is Adam step initial_iteration + 1 (a
  // checkpoint's step).
  uint64_t initial_iteration = 0;
  // ModelSpec.commit_interval (0: the daemon's default).
  uint32_t commit_interval = 0;
};

// JSON text of a number (every double round-trips) and of a string.
std::string JsonNumber(double value);
std::string JsonQuoted(const std::string& text);

// ModelSpec in protobuf JSON, the proto's field names.
std::string ModelSpecJson(const ModelSpecFields& spec);

// An OpenJobRequest (proto/job_open.proto) for the job `job_name` whose
// arena the daemon sizes for `model_spec_json` (ModelSpecJson's output),
// or with `resume` the caller's job of that name.
std::string OpenJobRequestJson(const std::string& job_name,
                               const std::string& model_spec_json, bool resume);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_MODEL_SPEC_JSON_H_
