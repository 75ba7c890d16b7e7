#ifndef LOHAN_CLIENT_ARENA_PINNING_H_
#define LOHAN_CLIENT_ARENA_PINNING_H_

#include <atomic>
#include <cstdint>
#include <optional>

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
// A move to another arena (share_move.h) keeps this object (the channel
// counts its callbacks here): Detach unpins and lets go of the old plane,
// Attach takes the new one. In between, and for good when the new plane
// could not be opened, there is no plane: Register fails with
// FAILED_PRECONDITION saying so.
//
// Thread-compatible: Register, Detach, Attach and the destructor from one
// thread at a time; callbacks_pending() is the atomic the callbacks
// decrement.
class ArenaPinning {
 public:
  explicit ArenaPinning(DataPlane& plane) : plane_(&plane) {}
  ArenaPinning(const ArenaPinning&) = delete;
  ArenaPinning& operator=(const ArenaPinning&) = delete;
  ~ArenaPinning();

  // Pins the arena on `device` (a CUDA device index, or
  // cuda::kUnspecifiedDevice: the thread's current one). Once pinned, OK
  // again for the same or an unspecified device; INVALID_ARGUMENT, its text
  // starting with `what`, for another one. FAILED_PRECONDITION without a
  // plane. Otherwise RegisterHost's error.
  absl::Status Register(int device, absl::string_view what);

  // The device the arena is pinned on (cuda::kUnspecifiedDevice: the
  // thread's current one at the time); none when it is not pinned.
  std::optional<int> pinned_device() const;

  // Unpins the arena, if pinned, and lets go of the plane, which may then
  // close. REQUIRES: AwaitCallbacks returned true since the last copy was
  // started.
  void Detach();
  // Takes `plane` (a new one, unpinned). REQUIRES: Detach was called.
  void Attach(DataPlane& plane);

  std::atomic<int64_t>& callbacks_pending() { return callbacks_pending_; }

  // Waits until no callback is still to run, up to `patience`: false when
  // some still are (the plane must then stay mapped, and this object
  // alive, rather than be freed under them).
  bool AwaitCallbacks(absl::Duration patience) const;
  int64_t callbacks_left() const {
    return callbacks_pending_.load(std::memory_order_acquire);
  }

 private:
  DataPlane* plane_;  // null between Detach and Attach
  bool registered_ = false;
  // The device it was registered on (kUnspecifiedDevice: the thread's
  // current one); unregistered there too.
  int device_ = cuda::kUnspecifiedDevice;
  // Plain atomic, polled: a callback's decrement is its very last touch.
  std::atomic<int64_t> callbacks_pending_{0};
};

}  // namespace lohan

#endif  // LOHAN_CLIENT_ARENA_PINNING_H_
