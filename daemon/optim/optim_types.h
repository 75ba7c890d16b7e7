#ifndef LOHAN_DAEMON_OPTIM_OPTIM_TYPES_H_
#define LOHAN_DAEMON_OPTIM_OPTIM_TYPES_H_

// Vocabulary shared by the optimizer updaters: element types, borrowed
// gradient and output views, and what one tensor's step reports back.

#include <cstddef>
#include <cstdint>

#include "layout/dtype.h"
#include "layout/dtype_traits.h"

namespace lohan {

// A gradient as the training process produced it. Borrowed: `data` must hold
// the tensor's element count of `dtype` and stay valid during the step.
// The optimizer uses grad = data[i] * inv_scale (fp16 loss scaling: pass
// 1/loss_scale; 1.0f leaves the gradient as it is).
struct GradientView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  float inv_scale = 1.0f;
};

// Where a step writes the 16-bit copy of the new weights. Borrowed. `data`
// null means no copy; otherwise `dtype` is kBFloat16 or kFloat16 and `data`
// holds the tensor's element count of it. Rounding: see half.h.
struct HalfOutput {
  void* data = nullptr;
  DType dtype = DType::kBFloat16;
};

// What one step of one tensor saw in its gradient.
struct StepStats {
  // Sum of squares of the unscaled gradient (data[i] * inv_scale), computed
  // in double per fixed-size chunk and combined in chunk order: the same bits
  // whatever the thread count (not across ISAs: lane order differs).
  double grad_sum_squares = 0.0;
  // True when any gradient element (after unscaling) is inf or NaN. The step
  // has still been applied: the caller discards that version of the states.
  bool grad_nonfinite = false;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_OPTIM_OPTIM_TYPES_H_
