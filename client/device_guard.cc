#include "client/device_guard.h"

#include "absl/strings/str_cat.h"

namespace lohan::cuda {

DeviceGuard::~DeviceGuard() {
  switch (restore_) {
    case Restore::kNothing:
      break;
    case Restore::kSetPrevious:
      (void)probe_.Set(previous_);
      break;
    case Restore::kClear:
      (void)probe_.Clear();
      break;
  }
}

absl::Status DeviceGuard::Enter(int device) {
  if (device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device index ", device, " is negative"));
  }
  if (restore_ != Restore::kNothing) {
    return absl::FailedPreconditionError("DeviceGuard entered twice");
  }
  absl::StatusOr<int> current = probe_.Current();
  if (!current.ok()) return current.status();
  if (*current == device) return absl::OkStatus();
  // Asked before switching: once `device` is current, whether the previous
  // one had a context says nothing about this thread any more.
  bool had_context = false;
  if (*current != DeviceProbe::kNoCurrentContext) {
    absl::StatusOr<bool> has = probe_.HasContext(*current);
    if (!has.ok()) return has.status();
    had_context = *has;
  }
  if (absl::Status set = probe_.Set(device); !set.ok()) return set;
  previous_ = *current;
  restore_ = had_context ? Restore::kSetPrevious : Restore::kClear;
  return absl::OkStatus();
}

}  // namespace lohan::cuda
