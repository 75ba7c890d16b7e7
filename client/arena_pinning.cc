#include "client/arena_pinning.h"

#include "absl/strings/str_cat.h"

namespace lohan {

ArenaPinning::~ArenaPinning() {
  if (registered_) (void)cuda::UnregisterHost(plane_.arena(), device_);
}

absl::Status ArenaPinning::Register(int device, absl::string_view what) {
  if (registered_) {
    if (device != cuda::kUnspecifiedDevice &&
        device_ != cuda::kUnspecifiedDevice && device != device_) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the arena is already registered on CUDA device ", device_,
          ", not ", device));
    }
    return absl::OkStatus();
  }
  absl::Status registered =
      cuda::RegisterHost(plane_.arena(), plane_.arena_bytes(), device);
  if (registered.ok()) {
    registered_ = true;
    device_ = device;
  }
  return registered;
}

bool ArenaPinning::AwaitCallbacks(absl::Duration patience) const {
  const absl::Time deadline = absl::Now() + patience;
  while (callbacks_left() > 0) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace lohan
