#ifndef LOHAN_CLIENT_ARENA_PINNING_H_
#define LOHAN_CLIENT_ARENA_PINNING_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/cuda_copy.h"
#include "client/data_plane.h"

namespace lohan {

// A data plane's arena pinned for CUDA (cuda::RegisterHost), and the CUDA
// copy callbacks still to run against it (ModelChannel counts them in
// callbacks_pending()). The destructor unpins it on the device it was
// pinned on; before that, AwaitCallbacks must have returned true, since
// every such callback still touches the plane and the arena.
//
// Thread-compatible: Register and the destructor from one thread at a
// time; callbacks_pending() is the atomic the callbacks decrement.
class ArenaPinning {
 public:
  explicit ArenaPinning(DataPlane& plane) : plane_(plane) {}
  ArenaPinning(const ArenaPinning&) = delete;
  ArenaPinning& operator=(const ArenaPinning&) = delete;
  ~ArenaPinning();

  // Pins the arena on `device` (a CUDA device index, or
  // cuda::kUnspecifiedDevice: the thread's current one). Once pinned, OK
  // again for the same or an unspecified device; INVALID_ARGUMENT, its text
  // starting with `what`, for another one. Otherwise RegisterHost's error.
  absl::Status Register(int device, absl::string_view what);

  std::atomic<int64_t>& callbacks_pending() { return callbacks_pending_; }

  // Waits until no callback is still to run, up to `patience`: false when
  // some still are (the plane must then stay mapped, and this object
  // alive, rather than be freed under them).
  bool AwaitCallbacks(absl::Duration patience) const;
  int64_t callbacks_left() const {
    return callbacks_pending_.load(std::memory_order_acquire);
  }

 private:
  DataPlane& plane_;
  bool registered_ = false;
  // The device it was registered on (kUnspecifiedDevice: the thread's
  // current one); unregistered there too.
  int device_ = cuda::kUnspecifiedDevice;
  // Plain atomic, polled: a callback's decrement is its very last touch.
  std::atomic<int64_t> callbacks_pending_{0};
};

}  // namespace lohan

#endif  // LOHAN_CLIENT_ARENA_PINNING_H_
