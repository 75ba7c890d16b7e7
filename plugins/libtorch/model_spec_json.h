#ifndef LOHAN_PLUGINS_LIBTORCH_MODEL_SPEC_JSON_H_
#define LOHAN_PLUGINS_LIBTORCH_MODEL_SPEC_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "lohan/lohan_client.h"
#include "plugins/libtorch/options.h"

namespace lohan::torch_plugin {

// The model in the C ABI's typed form, lohan_model_spec, with the arrays it
// points into; Json() is lohand's ModelSpec as liblohan_client translates
// it (lohan_model_spec_json, the one translation). Defaults as the Python
// plugin's: AdamW, inf/nan steps skipped, deferred clipping.
class ModelSpecBuilder {
 public:
  ModelSpecBuilder();
  ModelSpecBuilder(const ModelSpecBuilder&) = delete;
  ModelSpecBuilder& operator=(const ModelSpecBuilder&) = delete;

  // The scalars (lr, betas, slots, ...); the layers are set below. The
  // groups are the model cut's (layer_plan.h: PlanModel).
  lohan_model_spec& spec() { return spec_; }
  void set_layer_elements(std::vector<uint64_t> elements);
  // The ModelSpec in protobuf JSON; LohanError for a spec the library
  // refuses.
  std::string Json();

 private:
  lohan_model_spec spec_{};
  std::vector<uint64_t> layer_elements_;
};

// `options`' settings in `spec`: dtype, Adam, clipping, the clip schedule,
// the service, durability, chunking (the plugin's one mapping onto the C
// ABI's spec; the model's layers, buffers and iteration are the caller's).
void SetSpecSettings(const Options& options, lohan_model_spec& spec);

// JSON text of a number (every double round-trips; inf and NaN as
// protobuf's JSON writes them, "Infinity" and "NaN") and of a string.
std::string JsonNumber(double value);
std::string JsonQuoted(const std::string& text);

// An OpenJobRequest (proto/job_open.proto) for the job `job_name` whose
// arena the daemon sizes for `model_spec_json` (ModelSpecBuilder::Json),
// or with `resume` the caller's job of that name.
std::string OpenJobRequestJson(const std::string& job_name,
                               const std::string& model_spec_json, bool resume);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_MODEL_SPEC_JSON_H_
