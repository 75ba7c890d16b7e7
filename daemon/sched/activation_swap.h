#ifndef LOHAN_DAEMON_SCHED_ACTIVATION_SWAP_H_
#define LOHAN_DAEMON_SCHED_ACTIVATION_SWAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/store/tensor_store.h"

namespace lohan {

// A job's activations swapped to the SSDs (the plugin's ACT_PUT, ACT_GET,
// ACT_FREE): their transfers, scheduled like every other of the daemon's
// SSD transfers by the store's IoGate (daemon/sched's FairSsdGate): a put
// takes its job's fair turn among the jobs; a get, which the device waits
// for, goes ahead of its own job's other waiting transfers (the states'
// reads), never ahead of another job's turn.
//
// Activations live no longer than the session that swapped them: each is a
// pending version, never committed, so a put costs no fdatasync and no
// catalog record, and a crash loses them as it loses the session that
// could read them back. Thread-safe as the store is (each id's calls in
// order: the caller's).
class ActivationSwap {
 public:
  // REQUIRES: `store` outlives this.
  ActivationSwap(TensorStore* store, std::string job)
      : store_(store), job_(std::move(job)) {}

  // Writes `bytes` as activation `id` (new: an id held already is
  // ALREADY_EXISTS). On failure nothing of it is held.
  absl::Status Put(uint64_t id, absl::Span<const uint8_t> bytes);
  // Reads activation `id` into `bytes` (its size exactly).
  absl::Status Get(uint64_t id, absl::Span<uint8_t> bytes);
  // Frees activation `id`; returns the bytes it held.
  absl::StatusOr<uint64_t> Free(uint64_t id);
  // Frees every activation of the job (a session that ended, or one that
  // died and left them).
  void FreeAll();
  // What the job holds: each activation's id and bytes (a session that
  // takes over those its job's last one kept).
  struct Held {
    uint64_t id = 0;
    uint64_t bytes = 0;
  };
  std::vector<Held> ListHeld() const;

 private:
  static std::string NameOf(uint64_t id);

  TensorStore* const store_;
  const std::string job_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_ACTIVATION_SWAP_H_
