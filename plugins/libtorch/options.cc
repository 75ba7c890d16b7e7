#include "plugins/libtorch/options.h"

#include <map>
#include <stdexcept>
#include <string>

#include "lohan/lohan_client.h"
#include "plugins/libtorch/model_spec_json.h"

namespace lohan::torch_plugin {
namespace {

// The core's check of the settings (lohan_model_spec_check_settings, the
// rules lohand runs), its refusal named by the option it came from.
void CheckSettings(const Options& options) {
  ModelSpecBuilder builder;
  SetSpecSettings(options, builder.spec());
  if (lohan_model_spec_check_settings(&builder.spec()) == LOHAN_OK) return;
  static const std::map<std::string, std::string> kOptionOfField = {
      {"adam.lr", "lr"},
      {"adam.beta1", "beta1"},
      {"adam.beta2", "beta2"},
      {"adam.eps", "eps"},
      {"adam.weight_decay", "weight_decay"},
      {"max_grad_norm", "max_grad_norm"},
      {"commit_interval", "commit_interval"},
      {"durable_every_seconds", "durable_every_seconds"},
  };
  const auto option = kOptionOfField.find(lohan_last_error_field());
  throw std::invalid_argument(
      "lohan Options: " +
      (option == kOptionOfField.end() ? "" : option->second + ": ") +
      lohan_last_error());
}

}  // namespace

void ValidateOptions(const Options& options) {
  if (options.clip_schedule != "deferred" &&
      options.clip_schedule != "redo-all") {
    throw std::invalid_argument("lohan Options: clip_schedule=\"" +
                                options.clip_schedule +
                                "\": use \"deferred\" or \"redo-all\"");
  }
  if (options.service != "lanes" && options.service != "in-order") {
    throw std::invalid_argument("lohan Options: service=\"" + options.service +
                                "\": use \"lanes\" or \"in-order\"");
  }
  if (options.dtype != "fp32" && options.dtype != "bf16") {
    throw std::invalid_argument("lohan Options: dtype=\"" + options.dtype +
                                "\" is not supported; use \"fp32\" or "
                                "\"bf16\"");
  }
  if (options.buffers != "auto" && options.buffers != "resident" &&
      options.buffers != "streamed") {
    throw std::invalid_argument(
        "lohan Options: buffers=\"" + options.buffers +
        "\": use \"auto\", \"resident\" or \"streamed\"");
  }
  if (options.stream_buffers < 1) {
    throw std::invalid_argument(
        "lohan Options: stream_buffers must be >= 1, got 0");
  }
  if (options.activations != "keep" && options.activations != "recompute") {
    throw std::invalid_argument("lohan Options: activations=\"" +
                                options.activations +
                                "\": use \"keep\" or \"recompute\"");
  }
  if (options.grad_accumulation_steps < 1) {
    throw std::invalid_argument(
        "lohan Options: grad_accumulation_steps must be >= 1, got " +
        std::to_string(options.grad_accumulation_steps));
  }
  if (options.resume_job && !options.resume_from.empty()) {
    throw std::invalid_argument(
        "lohan Options: resume_job and resume_from exclude each other: "
        "resume_job continues an existing job, resume_from starts a new "
        "one from a checkpoint");
  }
  if (options.no_weight_decay_1d && !options.no_weight_decay_names.empty()) {
    throw std::invalid_argument(
        "lohan Options: no_weight_decay_1d and no_weight_decay_names "
        "exclude each other: name the 1-D parameters too, or use one");
  }
  for (size_t n = 0; n < options.param_groups.size(); ++n) {
    const ParamGroup& group = options.param_groups[n];
    const std::string what = "param_groups[" + std::to_string(n) + "]";
    if (group.params.empty()) {
      throw std::invalid_argument("lohan Options: " + what +
                                  " names no parameters");
    }
    // A group's lr and weight decay are the model cut's to judge
    // (client/model_cut.cc, when the Engine plans its layers).
  }
  if (options.job_name.empty()) {
    throw std::invalid_argument("lohan Options: job_name must not be empty");
  }
  CheckSettings(options);
}

}  // namespace lohan::torch_plugin
