#include "daemon/optim/optim_c_api.h"

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/optim/adam.h"
#include "daemon/optim/calibration.h"
#include "daemon/optim/isa.h"
#include "daemon/optim/optim_types.h"
#include "daemon/optim/sgd.h"
#include "daemon/optim/worker_pool.h"

struct lohan_optim {
  std::unique_ptr<lohan::WorkerPool> pool;  // null: calling thread
  std::optional<lohan::AdamUpdater> adam;
  std::optional<lohan::SgdUpdater> sgd;
  std::optional<lohan::Isa> forced_isa;  // as created
  std::string tuning_name = lohan::TuningName(lohan::KernelTuning{});

  // Both updaters on `isa` (nullopt: $LOHAN_OPTIM_ISA or the best), with
  // the default tuning; on an error the handle is unchanged.
  absl::Status UseIsa(std::optional<lohan::Isa> isa) {
    absl::StatusOr<lohan::AdamUpdater> new_adam =
        lohan::AdamUpdater::Create(pool.get(), isa);
    if (!new_adam.ok()) return new_adam.status();
    absl::StatusOr<lohan::SgdUpdater> new_sgd =
        lohan::SgdUpdater::Create(pool.get(), new_adam->isa());
    if (!new_sgd.ok()) return new_sgd.status();
    adam = *new_adam;
    sgd = *new_sgd;
    tuning_name = lohan::TuningName(lohan::KernelTuning{});
    return absl::OkStatus();
  }

  void SetTuning(const lohan::KernelTuning& tuning) {
    adam = adam->WithTuning(tuning);
    sgd = sgd->WithTuning(tuning);
    tuning_name = lohan::TuningName(tuning);
  }
};

namespace {

thread_local std::string last_error;

int Fail(const absl::Status& status) {
  last_error = std::string(status.message());
  return static_cast<int>(status.code());
}

int Fail(absl::StatusCode code, const char* message) {
  return Fail(absl::Status(code, message));
}

// Maps a dtype code; out-of-range codes become a value the updaters reject.
lohan::DType ToDType(int code) {
  return static_cast<lohan::DType>(code >= 0 && code <= 2 ? code : 255);
}

void Report(const lohan::StepStats& stats, double* sum_squares,
            int* nonfinite) {
  if (sum_squares != nullptr) *sum_squares = stats.grad_sum_squares;
  if (nonfinite != nullptr) *nonfinite = stats.grad_nonfinite ? 1 : 0;
}

}  // namespace

extern "C" {

const char* lohan_optim_last_error(void) { return last_error.c_str(); }

int lohan_optim_cpu_supports(const char* isa) {
  if (isa == nullptr) return -1;
  absl::StatusOr<lohan::Isa> parsed = lohan::ParseIsa(isa);
  if (!parsed.ok()) return -1;
  return lohan::CpuSupportsIsa(*parsed) ? 1 : 0;
}

int lohan_optim_create(const char* isa, int num_threads, int pin,
                       lohan_optim** out) {
  if (out == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "out is null");
  }
  *out = nullptr;
  std::optional<lohan::Isa> requested;
  if (isa != nullptr && isa[0] != '\0') {
    absl::StatusOr<lohan::Isa> parsed = lohan::ParseIsa(isa);
    if (!parsed.ok()) return Fail(parsed.status());
    requested = *parsed;
  }
  auto handle = std::make_unique<lohan_optim>();
  if (num_threads != 0) {
    absl::StatusOr<std::unique_ptr<lohan::WorkerPool>> pool =
        lohan::WorkerPool::Create({num_threads, pin != 0});
    if (!pool.ok()) return Fail(pool.status());
    handle->pool = std::move(*pool);
  }
  if (absl::Status made = handle->UseIsa(requested); !made.ok()) {
    return Fail(made);
  }
  handle->forced_isa = requested;
  *out = handle.release();
  return 0;
}

void lohan_optim_destroy(lohan_optim* handle) { delete handle; }

const char* lohan_optim_isa(const lohan_optim* handle) {
  return handle == nullptr ? "" : lohan::IsaName(handle->adam->isa()).data();
}

const char* lohan_optim_kernel_name(const lohan_optim* handle) {
  return handle == nullptr ? "" : handle->adam->kernel_name();
}

const char* lohan_optim_tuning(const lohan_optim* handle) {
  return handle == nullptr ? "" : handle->tuning_name.c_str();
}

int lohan_optim_set_tuning(lohan_optim* handle, const char* tuning) {
  if (handle == nullptr || tuning == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "null handle or tuning");
  }
  absl::StatusOr<lohan::KernelTuning> parsed = lohan::ParseTuning(tuning);
  if (!parsed.ok()) return Fail(parsed.status());
  handle->SetTuning(*parsed);
  return 0;
}

int lohan_optim_calibrate(lohan_optim* handle, size_t working_set_bytes,
                          int rounds) {
  if (handle == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "null handle");
  }
  lohan::CalibrationOptions options;
  options.working_set_bytes = working_set_bytes;
  if (rounds != 0) options.rounds = rounds;
  absl::StatusOr<lohan::Calibration> calibration = lohan::CalibrateAdam(
      handle->pool.get(), lohan::CalibrationIsas(handle->forced_isa), options);
  if (!calibration.ok()) return Fail(calibration.status());
  if (absl::Status made = handle->UseIsa(calibration->isa); !made.ok()) {
    return Fail(made);
  }
  handle->SetTuning(calibration->tuning);
  return 0;
}

int lohan_optim_adam_step(lohan_optim* handle, size_t n, float* weight,
                          void* exp_avg, void* exp_avg_sq, void* max_exp_avg_sq,
                          int moment_dtype, int64_t* step, const void* grad,
                          int grad_dtype, float inv_scale, void* out,
                          int out_dtype, double lr, double beta1, double beta2,
                          double eps, double weight_decay, int decoupled,
                          int amsgrad, double* grad_sum_squares,
                          int* grad_nonfinite) {
  if (handle == nullptr || step == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "null handle or step");
  }
  lohan::AdamOptions options;
  options.lr = lr;
  options.beta1 = beta1;
  options.beta2 = beta2;
  options.eps = eps;
  options.weight_decay = weight_decay;
  options.decoupled_weight_decay = decoupled != 0;
  options.amsgrad = amsgrad != 0;
  lohan::AdamTensor tensor;
  tensor.size = n;
  tensor.weight = weight;
  tensor.exp_avg = exp_avg;
  tensor.exp_avg_sq = exp_avg_sq;
  tensor.max_exp_avg_sq = max_exp_avg_sq;
  tensor.moment_dtype = ToDType(moment_dtype);
  tensor.step = *step;
  absl::StatusOr<lohan::StepStats> stats = handle->adam->Step(
      options, tensor,
      lohan::GradientView{grad, ToDType(grad_dtype), inv_scale},
      lohan::HalfOutput{out, ToDType(out_dtype)});
  if (!stats.ok()) return Fail(stats.status());
  *step = tensor.step;
  Report(*stats, grad_sum_squares, grad_nonfinite);
  return 0;
}

int lohan_optim_sgd_step(lohan_optim* handle, size_t n, float* weight,
                         float* momentum_buffer, int64_t* step,
                         const void* grad, int grad_dtype, float inv_scale,
                         void* out, int out_dtype, double lr, double momentum,
                         double dampening, double weight_decay, int nesterov,
                         double* grad_sum_squares, int* grad_nonfinite) {
  if (handle == nullptr || step == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "null handle or step");
  }
  lohan::SgdOptions options;
  options.lr = lr;
  options.momentum = momentum;
  options.dampening = dampening;
  options.weight_decay = weight_decay;
  options.nesterov = nesterov != 0;
  lohan::SgdTensor tensor;
  tensor.size = n;
  tensor.weight = weight;
  tensor.momentum_buffer = momentum_buffer;
  tensor.step = *step;
  absl::StatusOr<lohan::StepStats> stats = handle->sgd->Step(
      options, tensor,
      lohan::GradientView{grad, ToDType(grad_dtype), inv_scale},
      lohan::HalfOutput{out, ToDType(out_dtype)});
  if (!stats.ok()) return Fail(stats.status());
  *step = tensor.step;
  Report(*stats, grad_sum_squares, grad_nonfinite);
  return 0;
}

}  // extern "C"
