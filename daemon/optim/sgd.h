#ifndef LOHAN_DAEMON_OPTIM_SGD_H_
#define LOHAN_DAEMON_OPTIM_SGD_H_

// SGD with momentum (torch.optim.SGD semantics) over fp32 master weights, in
// one pass, with the same gradient inputs, 16-bit output and statistics as
// AdamUpdater.

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "daemon/optim/isa.h"
#include "daemon/optim/optim_types.h"
#include "daemon/optim/tuning.h"
#include "daemon/optim/worker_pool.h"

namespace lohan {
namespace optim_internal {
struct KernelTable;
}  // namespace optim_internal

// Per step:
//   g += wd*w                                   (if weight_decay != 0)
//   buf = first step ? g : momentum*buf + (1-dampening)*g   (if momentum != 0)
//   g = nesterov ? g + momentum*buf : buf
//   w -= lr*g
struct SgdOptions {
  double lr = 1e-3;           // >= 0
  double momentum = 0.0;      // >= 0
  double dampening = 0.0;     // [0, 1]
  double weight_decay = 0.0;  // >= 0
  bool nesterov = false;      // REQUIRES momentum > 0 and dampening == 0
};

// Borrowed buffers of `size` elements, as for AdamTensor.
struct SgdTensor {
  std::size_t size = 0;
  float* weight = nullptr;
  float* momentum_buffer = nullptr;  // needed iff momentum != 0
  int64_t step = 0;  // steps applied so far; 0 means the buffer is unset
};

class SgdUpdater {
 public:
  // As AdamUpdater::Create.
  static absl::StatusOr<SgdUpdater> Create(WorkerPool* pool,
                                           std::optional<Isa> isa);

  // The same updater moving memory as `tuning` says (results unchanged).
  // Create() starts with KernelTuning{}; the daemon passes its calibrated
  // choice (calibration.h).
  SgdUpdater WithTuning(const KernelTuning& tuning) const {
    SgdUpdater copy = *this;
    copy.tuning_ = tuning;
    return copy;
  }
  const KernelTuning& tuning() const { return tuning_; }

  Isa isa() const { return isa_; }
  // The kernel variant in use, e.g. "avx512+bf16".
  const char* kernel_name() const;

  // One step of one tensor; increments tensor.step. Errors and guarantees
  // as AdamUpdater::Step.
  absl::StatusOr<StepStats> Step(const SgdOptions& options, SgdTensor& tensor,
                                 const GradientView& grad,
                                 const HalfOutput& out = HalfOutput{}) const;

 private:
  SgdUpdater(WorkerPool* pool, Isa isa,
             const optim_internal::KernelTable* kernels)
      : pool_(pool), isa_(isa), kernels_(kernels) {}

  WorkerPool* pool_;
  Isa isa_;
  const optim_internal::KernelTable* kernels_;
  KernelTuning tuning_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_OPTIM_SGD_H_
