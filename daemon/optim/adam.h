#ifndef LOHAN_DAEMON_OPTIM_ADAM_H_
#define LOHAN_DAEMON_OPTIM_ADAM_H_

// Adam / AdamW (torch.optim semantics) over fp32 master weights, one tensor
// at a time, in one pass over memory: reads the gradient, weight and
// moments; writes the weight, the moments and (optionally) a 16-bit copy of
// the weight; returns the gradient's sum of squares and an inf/NaN flag.

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "daemon/optim/isa.h"
#include "daemon/optim/optim_types.h"
#include "daemon/optim/tuning.h"
#include "daemon/optim/worker_pool.h"
#include "layout/adam_options.h"

namespace lohan {
namespace optim_internal {
struct KernelTable;
}  // namespace optim_internal

// One tensor's optimizer state. Every buffer is borrowed: the caller owns
// it, it holds `size` elements, and nothing else touches it during Step().
struct AdamTensor {
  std::size_t size = 0;
  float* weight = nullptr;     // fp32 master weights, updated in place
  void* exp_avg = nullptr;     // first moment, in moment_dtype
  void* exp_avg_sq = nullptr;  // second moment, in moment_dtype
  // Running max of exp_avg_sq, in moment_dtype. Needed iff amsgrad.
  void* max_exp_avg_sq = nullptr;
  // kFloat32, or kBFloat16 to halve the moments' memory and I/O (rounded to
  // nearest even after each step; costs accuracy, see
  // docs/benchmarks-optim.md).
  DType moment_dtype = DType::kFloat32;
  // Steps applied so far (torch's state["step"]). Step() increments it
  // before computing the bias corrections; a fresh tensor starts at 0.
  int64_t step = 0;
};

// Applies Adam/AdamW steps with one SIMD path and a worker pool. Cheap to
// copy; holds only borrowed pointers.
class AdamUpdater {
 public:
  // `pool` may be null (the calling thread does all the work); otherwise it
  // must outlive the updater. `isa` forces a path; nullopt means
  // $LOHAN_OPTIM_ISA or the best one (see ResolveIsa). FailedPrecondition
  // when the CPU lacks the path, InvalidArgument for a bad variable value.
  static absl::StatusOr<AdamUpdater> Create(WorkerPool* pool,
                                            std::optional<Isa> isa);

  // The same updater moving memory as `tuning` says (results unchanged).
  // Create() starts with KernelTuning{}; the daemon passes its calibrated
  // choice (calibration.h).
  AdamUpdater WithTuning(const KernelTuning& tuning) const {
    AdamUpdater copy = *this;
    copy.tuning_ = tuning;
    return copy;
  }
  const KernelTuning& tuning() const { return tuning_; }

  Isa isa() const { return isa_; }
  // The same kernels with no pool: every call runs on the caller's thread
  // (for work that must not queue behind the pool's loops). Same results.
  AdamUpdater OnCallingThread() const {
    AdamUpdater copy = *this;
    copy.pool_ = nullptr;
    return copy;
  }
  // The kernel variant in use, e.g. "avx512+bf16".
  const char* kernel_name() const;

  // One step of one tensor. On success tensor.step has been incremented and
  // the buffers updated (also when stats.grad_nonfinite is set: the caller
  // decides whether to keep that version). On error (InvalidArgument: null
  // buffer, bad option, dtype not allowed, step overflow) nothing is touched.
  // Results are bit-identical whatever the pool's thread count.
  absl::StatusOr<StepStats> Step(const AdamOptions& options, AdamTensor& tensor,
                                 const GradientView& grad,
                                 const HalfOutput& out = HalfOutput{}) const;

  // The sum of squares of `size` gradient elements, each times
  // grad.inv_scale: bit for bit the grad_sum_squares that Step returns for
  // the same gradient (the same chunks, lanes and order, on every ISA), with
  // no state read or written, so a caller can know the global norm before
  // it decides to update. inf/NaN if an element is. InvalidArgument as Step
  // for the gradient.
  absl::StatusOr<double> GradSumSquares(const GradientView& grad,
                                        std::size_t size) const;

 private:
  AdamUpdater(WorkerPool* pool, Isa isa,
              const optim_internal::KernelTable* kernels)
      : pool_(pool), isa_(isa), kernels_(kernels) {}

  WorkerPool* pool_;
  Isa isa_;
  const optim_internal::KernelTable* kernels_;
  KernelTuning tuning_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_OPTIM_ADAM_H_
