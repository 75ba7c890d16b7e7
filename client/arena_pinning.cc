#include "client/arena_pinning.h"

#include "absl/strings/str_cat.h"
#include "client/plane_gone.h"

namespace lohan {

ArenaPinning::~ArenaPinning() { Detach(); }

absl::Status ArenaPinning::Register(int device, absl::string_view what) {
  if (plane_ == nullptr) return PlaneGoneError(what);
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
      cuda::RegisterHost(plane_->arena(), plane_->arena_bytes(), device);
  if (registered.ok()) {
    registered_ = true;
    device_ = device;
  }
  return registered;
}

std::optional<int> ArenaPinning::pinned_device() const {
  if (!registered_) return std::nullopt;
  return device_;
}

void ArenaPinning::Detach() {
  if (registered_) (void)cuda::UnregisterHost(plane_->arena(), device_);
  registered_ = false;
  device_ = cuda::kUnspecifiedDevice;
  plane_ = nullptr;
}

void ArenaPinning::Attach(DataPlane& plane) { plane_ = &plane; }

bool ArenaPinning::AwaitCallbacks(absl::Duration patience) const {
  const absl::Time deadline = absl::Now() + patience;
  while (callbacks_left() > 0) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace lohan
