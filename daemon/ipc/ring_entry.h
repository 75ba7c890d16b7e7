#ifndef LOHAN_DAEMON_IPC_RING_ENTRY_H_
#define LOHAN_DAEMON_IPC_RING_ENTRY_H_

// The wire layout of data-plane ring entries, shared by lohand and
// liblohan_client. Every entry is exactly 64 bytes (one cache line) of
// fixed-width little-endian fields, no implicit padding. Both sides run on
// the same host, so the layout is used in place on little-endian machines
// (enforced below); a big-endian port would need byte swapping here.
//
// Two rings per job: submissions (client -> daemon) carry SubmissionEntry,
// completions (daemon -> client) carry CompletionEntry with the same
// request_id. Everything in a submission is untrusted: the daemon checks it
// with EntryValidator before acting on it.
//
// Version the layout with kRingEntryVersion; reserved bytes must be zero
// (so they can gain a meaning later).

#include <bit>
#include <cstddef>
#include <cstdint>

namespace lohan {

static_assert(std::endian::native == std::endian::little,
              "ring entries are little-endian and used in place");

inline constexpr uint32_t kRingEntryVersion = 1;
inline constexpr uint32_t kRingEntryBytes = 64;

// Submission operations. Fields used by each (all others must be zero):
//   kRegisterLayout  dtype, layer = number of layers, slot_offset/length =
//                    a kControl slot holding `layer` little-endian uint64
//                    per-layer byte sizes. Once, before the first iteration.
//   kGradReady       layer, slot_offset/length (a kGradient slot holding the
//                    layer's gradient, length == the layer's bytes), dtype.
//   kFetchParams     layer, slot_offset/length (a kWeight slot to fill with
//                    the layer's weights, length == the layer's bytes).
//   kActPut          activation_id, slot_offset/length (kActivation slot):
//                    take this activation (swap out).
//   kActGet          activation_id, slot_offset/length: bring it back into
//                    this slot (length == the length it was put with).
//   kActFree         activation_id: forget it.
//   kIterBegin       iteration (previous iteration + 1), grad_scale, lr.
//   kIterEnd         iteration (the one begun). Its completion carries the
//                    global gradient norm (a double's bits) in `detail` and
//                    kIterEnd* bits in `flags`.
//   kInitWeights     layer, slot_offset/length = the staging slot holding the
//                    layer's initial fp32 weights (length = elements x 4).
//                    Outside iterations, once per layer of a new job.
//   kReadWeights     layer, slot_offset/length = the staging slot: receives
//                    the layer's committed fp32 master weights.
// (kInitWeights and kReadWeights are checked by the daemon's job session,
// which owns the staging slot, not by EntryValidator.)
enum class RingOp : uint16_t {
  kInvalid = 0,
  kRegisterLayout = 1,
  kGradReady = 2,
  kFetchParams = 3,
  kActPut = 4,
  kActGet = 5,
  kActFree = 6,
  kIterBegin = 7,
  kIterEnd = 8,
  kInitWeights = 9,
  kReadWeights = 10,
};

// CompletionEntry::flags of a kIterEnd completion.
inline constexpr uint32_t kIterEndClipped = 1u << 0;
inline constexpr uint32_t kIterEndSkipped = 1u << 1;
inline constexpr uint32_t kIterEndNonfinite = 1u << 2;

// Element types of tensors in the arena.
enum class RingDtype : uint16_t {
  kNone = 0,
  kFp16 = 1,
  kBf16 = 2,
  kFp32 = 3,
};

struct SubmissionEntry {
  uint16_t op;           // RingOp
  uint16_t dtype;        // RingDtype
  uint32_t layer;        // layer index, or layer count for kRegisterLayout
  uint64_t request_id;   // echoed in the completion; chosen by the client
  uint64_t slot_offset;  // byte offset into the job's arena
  uint64_t length;       // bytes
  uint64_t activation_id;
  uint64_t iteration;
  // kIterBegin only: every gradient of the iteration is multiplied by this
  // (1/loss_scale for fp16 loss scaling); 0 means 1.
  float grad_scale;
  uint8_t reserved[4];  // must be zero
  // kIterBegin only: the learning rate of this iteration (a schedule's
  // value); 0 means the one the model was registered with.
  double lr;
};
static_assert(sizeof(SubmissionEntry) == kRingEntryBytes);
static_assert(offsetof(SubmissionEntry, op) == 0);
static_assert(offsetof(SubmissionEntry, dtype) == 2);
static_assert(offsetof(SubmissionEntry, layer) == 4);
static_assert(offsetof(SubmissionEntry, request_id) == 8);
static_assert(offsetof(SubmissionEntry, slot_offset) == 16);
static_assert(offsetof(SubmissionEntry, length) == 24);
static_assert(offsetof(SubmissionEntry, activation_id) == 32);
static_assert(offsetof(SubmissionEntry, iteration) == 40);
static_assert(offsetof(SubmissionEntry, grad_scale) == 48);
static_assert(offsetof(SubmissionEntry, reserved) == 52);
static_assert(offsetof(SubmissionEntry, lr) == 56);

struct CompletionEntry {
  uint64_t request_id;   // of the submission this completes
  uint32_t status_code;  // absl::StatusCode (canonical, = gRPC codes); 0 = OK
  uint32_t flags;        // op-specific (kIterEnd*), else zero
  uint64_t detail;       // op-specific: e.g. bytes moved, or which rule failed
  uint8_t reserved[40];  // zero
};
static_assert(sizeof(CompletionEntry) == kRingEntryBytes);
static_assert(offsetof(CompletionEntry, request_id) == 0);
static_assert(offsetof(CompletionEntry, status_code) == 8);
static_assert(offsetof(CompletionEntry, detail) == 16);

}  // namespace lohan

#endif  // LOHAN_DAEMON_IPC_RING_ENTRY_H_
