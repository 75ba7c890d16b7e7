#include "daemon/optim/step_checks.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace lohan::optim_internal {

absl::Status CheckGradient(const GradientView& grad, std::size_t size) {
  if (DTypeSize(grad.dtype) == 0) {
    return absl::InvalidArgumentError("gradient: unknown dtype");
  }
  if (size > 0 && grad.data == nullptr) {
    return absl::InvalidArgumentError("gradient: null data");
  }
  if (!std::isfinite(grad.inv_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient: inv_scale must be finite, got ", grad.inv_scale));
  }
  return absl::OkStatus();
}

absl::Status CheckHalfOutput(const HalfOutput& out) {
  if (out.data != nullptr && out.dtype != DType::kBFloat16 &&
      out.dtype != DType::kFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("16-bit output: dtype must be bfloat16 or float16, got ",
                     DTypeName(out.dtype)));
  }
  return absl::OkStatus();
}

absl::Status CheckRange(absl::string_view name, double value, double low,
                        double high, bool high_inclusive) {
  const bool ok = std::isfinite(value) && value >= low &&
                  (high_inclusive ? value <= high : value < high);
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be in [", low, ", ", high,
                     high_inclusive ? "]" : ")", ", got ", value));
  }
  return absl::OkStatus();
}

}  // namespace lohan::optim_internal
