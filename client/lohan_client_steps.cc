// The C ABI of training steps (include/lohan/lohan_steps.h): only
// translation into TrainingSteps.
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/c_abi_handles.h"
#include "client/include/lohan/lohan_steps.h"
#include "client/proto_json.h"
#include "client/training_steps.h"
#include "proto/training_steps.pb.h"

struct lohan_steps {
  std::unique_ptr<lohan::TrainingSteps> impl;
};

namespace {

using lohan::c_abi::CopyOut;
using lohan::c_abi::InvalidArgument;
using lohan::c_abi::Report;

int NullSteps(const char* what) {
  return Report(
      absl::InvalidArgumentError(absl::StrCat(what, ": steps is NULL")));
}

std::optional<double> Optional(const double* value) {
  return value == nullptr ? std::nullopt : std::optional<double>(*value);
}

absl::Duration Timeout(int64_t timeout_ms) {
  return timeout_ms < 0 ? absl::InfiniteDuration()
                        : absl::Milliseconds(timeout_ms);
}

}  // namespace

extern "C" {

int lohan_steps_create(lohan_model* model, const char* options_json,
                       lohan_steps** out) {
  if (model == nullptr || options_json == nullptr || out == nullptr) {
    return InvalidArgument(
        "lohan_steps_create: model, options_json and out are required");
  }
  lohan::v1::TrainingStepsOptions options;
  absl::Status parsed =
      lohan::FromJson(options_json, "TrainingStepsOptions", &options);
  if (!parsed.ok()) return Report(parsed);
  absl::StatusOr<std::unique_ptr<lohan::TrainingSteps>> steps =
      lohan::TrainingSteps::Create(*model->channel, options);
  if (!steps.ok()) return Report(steps.status());
  auto handle = std::make_unique<lohan_steps>();
  handle->impl = std::move(*steps);
  *out = handle.release();
  return Report(absl::OkStatus());
}

void lohan_steps_destroy(lohan_steps* steps) { delete steps; }

uint64_t lohan_steps_committed(const lohan_steps* steps) {
  return steps == nullptr ? 0 : steps->impl->committed();
}

int lohan_steps_active(const lohan_steps* steps) {
  return steps != nullptr && steps->impl->active() ? 1 : 0;
}

double lohan_steps_lr(const lohan_steps* steps) {
  return steps == nullptr ? 0.0 : steps->impl->learning_rate();
}

int lohan_steps_set_lr(lohan_steps* steps, double lr) {
  if (steps == nullptr) return NullSteps("lohan_steps_set_lr");
  return Report(steps->impl->SetLearningRate(lr));
}

int lohan_steps_loss_scaling_json(const lohan_steps* steps, char** out) {
  if (steps == nullptr || out == nullptr) {
    return InvalidArgument(
        "lohan_steps_loss_scaling_json: steps and out are required");
  }
  absl::StatusOr<std::string> json =
      lohan::ToJson(steps->impl->loss_scaling(), /*proto_names=*/true);
  if (!json.ok()) return Report(json.status());
  return CopyOut(*json, out);
}

int lohan_steps_set_loss_scaling_json(lohan_steps* steps, const char* json) {
  if (steps == nullptr || json == nullptr) {
    return InvalidArgument(
        "lohan_steps_set_loss_scaling_json: steps and json are required");
  }
  lohan::v1::LossScaling scaling;
  absl::Status parsed = lohan::FromJson(json, "LossScaling", &scaling);
  if (!parsed.ok()) return Report(parsed);
  return Report(steps->impl->SetLossScaling(scaling));
}

int lohan_steps_scale_loss(lohan_steps* steps, double* scale) {
  if (steps == nullptr || scale == nullptr) {
    return InvalidArgument(
        "lohan_steps_scale_loss: steps and scale are required");
  }
  *scale = steps->impl->ScaleLoss();
  return Report(absl::OkStatus());
}

int lohan_steps_begin(lohan_steps* steps, const double* lr) {
  if (steps == nullptr) return NullSteps("lohan_steps_begin");
  return Report(steps->impl->Begin(Optional(lr)));
}

int lohan_steps_claim_grad_buffer(lohan_steps* steps, uint32_t layer) {
  if (steps == nullptr) return NullSteps("lohan_steps_claim_grad_buffer");
  return Report(steps->impl->ClaimGradBuffer(layer));
}

int lohan_steps_grad_ready(lohan_steps* steps, uint32_t layer) {
  if (steps == nullptr) return NullSteps("lohan_steps_grad_ready");
  return Report(steps->impl->GradReady(layer));
}

int lohan_steps_grad_ready_from_device(lohan_steps* steps, uint32_t layer,
                                       int device, const void* device_source,
                                       uint64_t bytes, void* cuda_stream) {
  if (steps == nullptr || device_source == nullptr || device < 0) {
    return InvalidArgument(
        "lohan_steps_grad_ready_from_device: steps and device_source are "
        "required, device >= 0");
  }
  return Report(steps->impl->GradReadyFromDevice(layer, device, device_source,
                                                 bytes, cuda_stream));
}

int lohan_steps_end(lohan_steps* steps, const double* global_sum_squares,
                    double* global_norm, int* clipped, int* skipped) {
  if (steps == nullptr) return NullSteps("lohan_steps_end");
  absl::StatusOr<lohan::TrainingSteps::Outcome> ended =
      steps->impl->End(Optional(global_sum_squares));
  if (!ended.ok()) return Report(ended.status());
  if (global_norm != nullptr) *global_norm = ended->global_norm;
  if (clipped != nullptr) *clipped = ended->clipped ? 1 : 0;
  if (skipped != nullptr) *skipped = ended->skipped ? 1 : 0;
  return Report(absl::OkStatus());
}

int lohan_steps_discard(lohan_steps* steps) {
  if (steps == nullptr) return NullSteps("lohan_steps_discard");
  return Report(steps->impl->Discard());
}

void lohan_steps_settle(lohan_steps* steps, int64_t timeout_ms) {
  if (steps != nullptr) steps->impl->Settle(Timeout(timeout_ms));
}

}  // extern "C"
