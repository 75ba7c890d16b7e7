#ifndef LOHAN_PLUGINS_LIBTORCH_MODEL_SPEC_JSON_H_
#define LOHAN_PLUGINS_LIBTORCH_MODEL_SPEC_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "lohan/lohan_client.h"

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

// The model in the C ABI's typed form, lohan_model_spec, with the arrays it
// points into; Json() is lohand's ModelSpec as liblohan_client translates
// it (lohan_model_spec_json, the one translation). Defaults as the Python
// plugin's: AdamW, inf/nan steps skipped, deferred clipping.
class ModelSpecBuilder {
 public:
  ModelSpecBuilder();
  ModelSpecBuilder(const ModelSpecBuilder&) = delete;
  ModelSpecBuilder& operator=(const ModelSpecBuilder&) = delete;

  // The scalars (lr, betas, slots, ...); the arrays are set below.
  lohan_model_spec& spec() { return spec_; }
  void set_layer_elements(std::vector<uint64_t> elements);
  // Updated with weight decay 0: the group "no_weight_decay" (lr_scale 1).
  void set_no_weight_decay(const std::vector<ElementRange>& ranges);
  // Sent after it as "param_groups[0]", "param_groups[1]", ...
  void set_param_groups(const std::vector<GroupRanges>& groups);
  // The ModelSpec in protobuf JSON; LohanError for a spec the library
  // refuses.
  std::string Json();

 private:
  lohan_model_spec spec_{};
  std::vector<uint64_t> layer_elements_;
  std::vector<uint64_t> no_weight_decay_;  // triples
  std::vector<std::vector<uint64_t>> group_ranges_;
  std::vector<lohan_param_group> groups_;
};

// JSON text of a number (every double round-trips) and of a string.
std::string JsonNumber(double value);
std::string JsonQuoted(const std::string& text);

// An OpenJobRequest (proto/job_open.proto) for the job `job_name` whose
// arena the daemon sizes for `model_spec_json` (ModelSpecBuilder::Json),
// or with `resume` the caller's job of that name.
std::string OpenJobRequestJson(const std::string& job_name,
                               const std::string& model_spec_json, bool resume);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_MODEL_SPEC_JSON_H_
