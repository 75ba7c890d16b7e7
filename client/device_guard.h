#ifndef LOHAN_CLIENT_DEVICE_GUARD_H_
#define LOHAN_CLIENT_DEVICE_GUARD_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Which GPU the calling thread's CUDA calls go to, moved to the job's device
// for the length of a scope and put back afterwards without creating a
// context anywhere else. The bookkeeping is plain C++ over a DeviceProbe, so
// it is unit-tested with a fake probe on machines without a GPU
// (device_guard_test.cc); cuda_copy.cc holds the real probe.
namespace lohan::cuda {

// What the guard needs from CUDA. Implementations must not create a context
// except where Set says so.
class DeviceProbe {
 public:
  virtual ~DeviceProbe() = default;
  // The device whose context is current on the calling thread, or
  // kNoCurrentContext when none is (a thread that never used CUDA, or one
  // a guard Cleared: the runtime would call it device 0, or whatever it
  // last set, but nothing is bound). Creates no context.
  static constexpr int kNoCurrentContext = -1;
  virtual absl::StatusOr<int> Current() = 0;
  // Whether `device`'s primary context is active, i.e. some earlier call
  // (torch's or ours) created it (cuDevicePrimaryCtxGetState). Creates no
  // context.
  virtual absl::StatusOr<bool> HasContext(int device) = 0;
  // Makes `device` current on the calling thread (its primary context
  // retained and set current, as the runtime's cudaSetDevice does: creates
  // its primary context when it has none).
  virtual absl::Status Set(int device) = 0;
  // Leaves the calling thread with no current context (cuCtxSetCurrent
  // (NULL)), as it was before any CUDA call on it. Creates no context.
  virtual absl::Status Clear() = 0;
};

// While it lives (after Enter succeeded), `device` is current on this
// thread; afterwards the previous device again:
// - already current: nothing is switched and nothing is restored;
// - another device that had a context: Set back to it;
// - no context current on the thread (it never used CUDA, so its "current
//   device" was only the runtime's default, 0), or another device whose
//   primary context is not active: the thread is Cleared, never Set to it,
//   so no context is created on that device.
// Nests: an inner guard restores what the outer one made current. Not
// copyable or movable; one thread.
class DeviceGuard {
 public:
  explicit DeviceGuard(DeviceProbe& probe) : probe_(probe) {}
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard();

  // Makes `device` (>= 0) current. On an error nothing was switched. At
  // most once per guard.
  absl::Status Enter(int device);

 private:
  enum class Restore { kNothing, kSetPrevious, kClear };

  DeviceProbe& probe_;
  int previous_ = -1;
  Restore restore_ = Restore::kNothing;
};

}  // namespace lohan::cuda

#endif  // LOHAN_CLIENT_DEVICE_GUARD_H_
