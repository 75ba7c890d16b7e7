#ifndef LOHAN_DAEMON_OPTIM_STEP_CHECKS_H_
#define LOHAN_DAEMON_OPTIM_STEP_CHECKS_H_

// Internal to daemon/optim: argument checks shared by the updaters.

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/optim/optim_types.h"

namespace lohan::optim_internal {

// OK when `grad` has a non-null buffer (if size > 0), a known dtype and a
// finite inv_scale.
absl::Status CheckGradient(const GradientView& grad, std::size_t size);

// OK when `out` is empty, or has a bf16/fp16 dtype.
absl::Status CheckHalfOutput(const HalfOutput& out);

// OK when `value` is finite and in [low, high] (or [low, high) if
// !high_inclusive).
absl::Status CheckRange(absl::string_view name, double value, double low,
                        double high, bool high_inclusive);

}  // namespace lohan::optim_internal

#endif  // LOHAN_DAEMON_OPTIM_STEP_CHECKS_H_
