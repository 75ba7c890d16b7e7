#include "daemon/optim/adam.h"

#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/optim/chunked_run.h"
#include "daemon/optim/kernels.h"
#include "daemon/optim/step_checks.h"

namespace lohan {
namespace {

using optim_internal::CheckRange;

constexpr double kInf = std::numeric_limits<double>::infinity();

absl::Status CheckOptions(const AdamOptions& o) {
  absl::Status s = CheckRange("adam: lr", o.lr, 0.0, kInf, false);
  if (s.ok()) s = CheckRange("adam: beta1", o.beta1, 0.0, 1.0, false);
  if (s.ok()) s = CheckRange("adam: beta2", o.beta2, 0.0, 1.0, false);
  if (s.ok()) s = CheckRange("adam: eps", o.eps, 0.0, kInf, false);
  if (s.ok()) {
    s = CheckRange("adam: weight_decay", o.weight_decay, 0.0, kInf, false);
  }
  return s;
}

absl::Status CheckTensor(const AdamTensor& t, bool amsgrad) {
  if (t.moment_dtype != DType::kFloat32 && t.moment_dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("adam: moment dtype must be float32 or bfloat16, got ",
                     DTypeName(t.moment_dtype)));
  }
  if (t.step < 0 || t.step == std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("adam: step counter out of range: ", t.step));
  }
  if (t.size == 0) return absl::OkStatus();
  if (t.weight == nullptr || t.exp_avg == nullptr || t.exp_avg_sq == nullptr) {
    return absl::InvalidArgumentError("adam: null weight or moment buffer");
  }
  if (amsgrad && t.max_exp_avg_sq == nullptr) {
    return absl::InvalidArgumentError(
        "adam: amsgrad needs a max_exp_avg_sq buffer");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AdamUpdater> AdamUpdater::Create(WorkerPool* pool,
                                                std::optional<Isa> isa) {
  absl::StatusOr<Isa> resolved = ResolveIsa(isa);
  if (!resolved.ok()) return resolved.status();
  return AdamUpdater(pool, *resolved, &optim_internal::KernelsFor(*resolved));
}

const char* AdamUpdater::kernel_name() const { return kernels_->name; }

absl::StatusOr<StepStats> AdamUpdater::Step(const AdamOptions& options,
                                            AdamTensor& tensor,
                                            const GradientView& grad,
                                            const HalfOutput& out) const {
  absl::Status s = CheckOptions(options);
  if (s.ok()) s = CheckTensor(tensor, options.amsgrad);
  if (s.ok()) s = optim_internal::CheckGradient(grad, tensor.size);
  if (s.ok()) s = optim_internal::CheckHalfOutput(out);
  if (!s.ok()) return s;

  // Per-tensor scalars, in double, as torch computes them.
  tensor.step += 1;
  const double t = static_cast<double>(tensor.step);
  const double bias_correction1 =
      options.bias_correction ? 1.0 - std::pow(options.beta1, t) : 1.0;
  const double bias_correction2 =
      options.bias_correction ? 1.0 - std::pow(options.beta2, t) : 1.0;
  const double step_size = options.lr / bias_correction1;
  const bool decoupled = options.decoupled_weight_decay;

  optim_internal::AdamChunkArgs args;
  args.inv_scale = grad.inv_scale;
  args.beta1 = static_cast<float>(options.beta1);
  args.one_minus_beta1 = static_cast<float>(1.0 - options.beta1);
  args.beta2 = static_cast<float>(options.beta2);
  args.one_minus_beta2 = static_cast<float>(1.0 - options.beta2);
  args.decay = static_cast<float>(
      decoupled ? 1.0 - options.lr * options.weight_decay : 1.0);
  args.use_l2 = !decoupled && options.weight_decay != 0.0;
  args.l2 = static_cast<float>(options.weight_decay);
  args.neg_step_size = static_cast<float>(-step_size);
  args.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  args.eps = static_cast<float>(options.eps);
  args.amsgrad = options.amsgrad;
  args.prefetch_elements = tuning_.prefetch_elements;
  args.stream_out = tuning_.stream_half_copy;

  const optim_internal::AdamChunkFn kernel =
      kernels_->adam[static_cast<int>(grad.dtype)]
                    [tensor.moment_dtype == DType::kBFloat16 ? 1 : 0]
                    [optim_internal::OutKindIndex(out)];
  const std::size_t moment_size = DTypeSize(tensor.moment_dtype);
  const std::size_t grad_size = DTypeSize(grad.dtype);

  const double sum_squares = optim_internal::RunChunked(
      pool_, tensor.size, tuning_.chunks_per_task,
      [&](std::size_t begin, std::size_t count) {
        optim_internal::AdamChunkArgs a = args;
        a.n = count;
        a.weight = tensor.weight + begin;
        a.exp_avg = static_cast<char*>(tensor.exp_avg) + begin * moment_size;
        a.exp_avg_sq =
            static_cast<char*>(tensor.exp_avg_sq) + begin * moment_size;
        if (options.amsgrad) {
          a.max_exp_avg_sq =
              static_cast<char*>(tensor.max_exp_avg_sq) + begin * moment_size;
        }
        a.grad = static_cast<const char*>(grad.data) + begin * grad_size;
        if (out.data != nullptr) {
          a.out = static_cast<char*>(out.data) + begin * 2;
        }
        return kernel(a);
      });
  return StepStats{sum_squares, !std::isfinite(sum_squares)};
}

absl::StatusOr<double> AdamUpdater::GradSumSquares(const GradientView& grad,
                                                   std::size_t size) const {
  if (absl::Status s = optim_internal::CheckGradient(grad, size); !s.ok()) {
    return s;
  }
  const optim_internal::SumSquaresFn kernel =
      kernels_->sum_squares[static_cast<int>(grad.dtype)];
  const std::size_t grad_size = DTypeSize(grad.dtype);
  return optim_internal::RunChunked(
      pool_, size, tuning_.chunks_per_task,
      [&](std::size_t begin, std::size_t count) {
        return kernel(static_cast<const char*>(grad.data) + begin * grad_size,
                      count, grad.inv_scale, tuning_.prefetch_elements);
      });
}

}  // namespace lohan
