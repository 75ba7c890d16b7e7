#include "daemon/optim/sgd.h"

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

absl::Status CheckOptions(const SgdOptions& o) {
  absl::Status s = CheckRange("sgd: lr", o.lr, 0.0, kInf, false);
  if (s.ok()) s = CheckRange("sgd: momentum", o.momentum, 0.0, kInf, false);
  if (s.ok()) s = CheckRange("sgd: dampening", o.dampening, 0.0, 1.0, true);
  if (s.ok()) {
    s = CheckRange("sgd: weight_decay", o.weight_decay, 0.0, kInf, false);
  }
  if (s.ok() && o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
    s = absl::InvalidArgumentError(
        "sgd: nesterov needs momentum > 0 and dampening == 0");
  }
  return s;
}

}  // namespace

absl::StatusOr<SgdUpdater> SgdUpdater::Create(WorkerPool* pool,
                                              std::optional<Isa> isa) {
  absl::StatusOr<Isa> resolved = ResolveIsa(isa);
  if (!resolved.ok()) return resolved.status();
  return SgdUpdater(pool, *resolved, &optim_internal::KernelsFor(*resolved));
}

const char* SgdUpdater::kernel_name() const { return kernels_->name; }

absl::StatusOr<StepStats> SgdUpdater::Step(const SgdOptions& options,
                                           SgdTensor& tensor,
                                           const GradientView& grad,
                                           const HalfOutput& out) const {
  absl::Status s = CheckOptions(options);
  if (s.ok()) s = optim_internal::CheckGradient(grad, tensor.size);
  if (s.ok()) s = optim_internal::CheckHalfOutput(out);
  const bool use_momentum = options.momentum != 0.0;
  if (s.ok() &&
      (tensor.step < 0 || tensor.step == std::numeric_limits<int64_t>::max())) {
    s = absl::InvalidArgumentError(
        absl::StrCat("sgd: step counter out of range: ", tensor.step));
  }
  if (s.ok() && tensor.size > 0 &&
      (tensor.weight == nullptr ||
       (use_momentum && tensor.momentum_buffer == nullptr))) {
    s = absl::InvalidArgumentError("sgd: null weight or momentum buffer");
  }
  if (!s.ok()) return s;

  optim_internal::SgdChunkArgs args;
  args.inv_scale = grad.inv_scale;
  args.use_l2 = options.weight_decay != 0.0;
  args.l2 = static_cast<float>(options.weight_decay);
  args.use_momentum = use_momentum;
  args.momentum = static_cast<float>(options.momentum);
  args.one_minus_dampening = static_cast<float>(1.0 - options.dampening);
  args.neg_lr = static_cast<float>(-options.lr);
  args.first_step = tensor.step == 0;
  args.nesterov = options.nesterov;
  args.prefetch_elements = tuning_.prefetch_elements;
  args.stream_out = tuning_.stream_half_copy;
  tensor.step += 1;

  const optim_internal::SgdChunkFn kernel =
      kernels_->sgd[static_cast<int>(grad.dtype)]
                   [optim_internal::OutKindIndex(out)];
  const std::size_t grad_size = DTypeSize(grad.dtype);
  const double sum_squares = optim_internal::RunChunked(
      pool_, tensor.size, tuning_.chunks_per_task,
      [&](std::size_t begin, std::size_t count) {
        optim_internal::SgdChunkArgs a = args;
        a.n = count;
        a.weight = tensor.weight + begin;
        if (use_momentum) a.momentum_buffer = tensor.momentum_buffer + begin;
        a.grad = static_cast<const char*>(grad.data) + begin * grad_size;
        if (out.data != nullptr) {
          a.out = static_cast<char*>(out.data) + begin * 2;
        }
        return kernel(a);
      });
  return StepStats{sum_squares, !std::isfinite(sum_squares)};
}

}  // namespace lohan
