#ifndef LOHAN_DAEMON_IPC_ENTRY_VALIDATOR_H_
#define LOHAN_DAEMON_IPC_ENTRY_VALIDATOR_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "daemon/pool/slot_allocator.h"
#include "wire/ring_entry.h"

namespace lohan {

// A registered job's layout, as the daemon took it from the job's ModelSpec:
// its 16/32-bit dtype and the byte size of each layer's gradient (= its
// 16-bit weights) in that dtype.
struct JobLayout {
  RingDtype dtype = RingDtype::kNone;
  std::vector<uint64_t> layer_bytes;
};

// Checks untrusted submission entries of one job, in ring order, against
// - the entry format (known op, fields the op does not use are zero,
//   reserved bytes zero; kReservedRegisterLayout is refused as any op the
//   validator does not serve: the layout is the daemon's, given at
//   construction),
// - the job's layout (layer index, per-layer length, dtype),
// - the arena: [slot_offset, slot_offset + length) must lie in one live slot
//   of the right kind (SlotAllocator::CheckRange; overflow-safe); with a
//   streamed layout (Options::grad_slots / weight_slots) slot_offset must
//   be exactly one of the K slots of that kind,
// - the state machine, from the first entry on (the layout is known from
//   construction): kGradReady only between kIterBegin and kIterEnd
//   (kFetchParams also between iterations: the committed weights, for the next
//   forward); iterations numbered consecutively from Options::next_iteration; a
//   layer's gradient at most once per iteration; activation ids put before
//   get/free, not put twice, got back with the length they were put with.
// Accept() never crashes and never reads the arena, whatever the entry says
// (ranges are checked against the slots, not dereferenced). On OK the entry is
// accepted and the state advanced; on error the state is unchanged and the
// status says which rule failed (INVALID_ARGUMENT: malformed;
// FAILED_PRECONDITION: wrong state; NOT_FOUND/ALREADY_EXISTS: activation ids;
// RESOURCE_EXHAUSTED: too many live activations; codes from
// SlotAllocator::CheckRange for ranges).
//
// Not thread-safe: one validator per submission ring, used by the thread that
// drains that ring. The SlotAllocator may change concurrently (it is
// thread-safe); a slot freed after Accept is the daemon's business.
class EntryValidator {
 public:
  struct Options {
    uint64_t max_live_activations = 1u << 16;
    // The number the next kIterBegin must carry (a re-attached job resumes
    // where it stopped).
    uint64_t next_iteration = 0;
    // Streamed layouts: the offsets of the K gradient (weight) slots that
    // every layer shares, each as large as the largest layer. Non-empty:
    // kGradReady (kFetchParams) must name one of them exactly, so the
    // daemon can tell a slot from a slice of one. Empty (resident layout):
    // any range inside one live slot of the kind.
    std::vector<uint64_t> grad_slots;
    std::vector<uint64_t> weight_slots;
  };

  // `slots`: the job arena's allocator; `layout`: the job's, trusted (the
  // daemon's own, from a checked ModelSpec: every layer's bytes a positive
  // multiple of the dtype's). Entries naming a layer are checked against it
  // from the first one on.
  // REQUIRES: `slots` outlives the validator.
  EntryValidator(const SlotAllocator* slots, JobLayout layout, Options options);
  // With the default Options.
  EntryValidator(const SlotAllocator* slots, JobLayout layout);
  EntryValidator(const EntryValidator&) = delete;
  EntryValidator& operator=(const EntryValidator&) = delete;

  absl::Status Accept(const SubmissionEntry& entry);

  // Forgets activation `id` after an ACT_PUT this validator accepted but
  // the daemon could not carry out (the store refused it): as if an
  // ACT_FREE had been accepted, so a retried put is not ALREADY_EXISTS. No
  // effect for an id not held.
  void ForgetActivation(uint64_t id);
  // Holds activation `id` of `bytes` as if this validator had accepted its
  // ACT_PUT: one the job's previous data plane kept for it (a move).
  void AdoptActivation(uint64_t id, uint64_t bytes);

  const JobLayout& layout() const { return layout_; }
  bool in_iteration() const { return in_iteration_; }
  // The iteration in progress, or the one the next kIterBegin must carry.
  uint64_t iteration() const { return iteration_; }
  size_t live_activations() const { return activations_.size(); }

 private:
  absl::Status CheckLayer(const SubmissionEntry& entry, SlotKind kind);
  absl::Status CheckActivation(const SubmissionEntry& entry, RingOp op);
  absl::Status CheckIteration(const SubmissionEntry& entry, RingOp op);

  const SlotAllocator* const slots_;
  const JobLayout layout_;
  const Options options_;  // grad_slots and weight_slots sorted

  bool in_iteration_ = false;
  uint64_t iteration_;
  std::vector<bool> grad_seen_;  // per layer, this iteration
  absl::flat_hash_map<uint64_t, uint64_t> activations_;  // id -> length
};

// The format of the staging ops (kInitWeights, kReadWeights, kReadState,
// kInitState), which the job session serves itself because it owns the
// staging slot (it checks layer, slot_offset and length against that slot
// and the iteration state; EntryValidator::Accept refuses these ops): the
// reserved bytes and every field the op does not use are zero, and
// kReadState / kInitState name a part in activation_id (RingStatePart:
// 1..3; whether the job keeps kMaxExpAvgSq is the pipeline's to say).
// INVALID_ARGUMENT naming the op and the field otherwise, also for an op
// that is not a staging op. Stateless; never reads the arena.
absl::Status CheckStagingEntry(const SubmissionEntry& entry);

}  // namespace lohan

#endif  // LOHAN_DAEMON_IPC_ENTRY_VALIDATOR_H_
