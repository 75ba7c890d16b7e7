#ifndef LOHAN_WIRE_RING_ENTRY_H_
#define LOHAN_WIRE_RING_ENTRY_H_

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

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace lohan {

static_assert(std::endian::native == std::endian::little,
              "ring entries are little-endian and used in place");

inline constexpr uint32_t kRingEntryVersion = 1;
inline constexpr uint32_t kRingEntryBytes = 64;

// Submission operations. Fields used by each (all others must be zero):
//   kReservedRegisterLayout
//                    not a client op: refused (INVALID_ARGUMENT) whatever
//                    its fields. The daemon takes the job's layout (dtype,
//                    per-layer bytes) from RegisterModel's ModelSpec; the
//                    value 1 stays reserved so no other op takes it.
//   kGradReady       layer, slot_offset/length (a kGradient slot holding the
//                    layer's gradient, length == the layer's bytes), dtype.
//                    Streamed layout (fewer gradient slots than layers, see
//                    ModelSpec.grad_slots): slot_offset must be exactly one
//                    of the K slots; the daemon stores the gradient on its
//                    SSDs before it completes the request, so the
//                    completion means the slot may be reused. Resident: the
//                    layer's own slot, untouched by the client until
//                    kIterEnd completes.
//   kFetchParams     layer, slot_offset/length (a kWeight slot to fill with
//                    the layer's weights, length == the layer's bytes).
//                    Inside an iteration or between iterations (then the
//                    committed weights, e.g. for the next forward).
//                    Streamed layout (ModelSpec.weight_slots): exactly one
//                    of the K weight slots; the daemon reads the layer's
//                    committed 16-bit copy from its SSDs into it.
//   kActPut          activation_id, slot_offset/length (kActivation slot):
//                    take this activation (swap out).
//   kActGet          activation_id, slot_offset/length: bring it back into
//                    this slot (length == the length it was put with).
//   kActFree         activation_id: forget it.
//   kIterBegin       iteration (previous iteration + 1), grad_scale, lr,
//                    iter_flags (kIterBeginLrGiven: `lr` is this
//                    iteration's rate even when 0, the first step of a
//                    warmup; without it 0 means the registered rate).
//   kIterEnd         iteration (the one begun), iter_flags
//                    (kIterEndSumSquaresGiven: `global_sum_squares` is set).
//                    global_sum_squares (data-parallel ranks whose jobs each
//                    hold one shard of every layer): the sum over every
//                    rank's gradients of g*grad_scale squared, as the daemon
//                    counts them (ChunkSumSquares); every rank passes the
//                    same value; the daemon decides clipping and skipping on
//                    it, not on its own gradients' sum, and reports sqrt of
//                    it as the global norm; its own sum is used only as a
//                    lower bound to defer updates early (ClipSchedule).
//                    inf/NaN are allowed (a skip with skip_nonfinite);
//                    negative (-0.0 too) is INVALID_ARGUMENT. Without the
//                    flag it must be zero (the job's own sum decides). Its
//                    completion carries the global gradient norm (a double's
//                    bits) in `detail` and kIterEnd* bits in `flags`; its
//                    `arena_asked`, when not zero, is lohand asking the job
//                    to move its data plane (see CompletionEntry).
//   kIterAbort       iteration (the one begun): ends it with nothing
//                    committed (every update of it rolled back, the step
//                    not advanced), e.g. when the client's backward failed
//                    half-way. The next ITER_BEGIN carries iteration + 1.
//   kIterCommitted   no fields (all zero): waits until the last iteration
//                    has committed (with ModelSpec.overlap_updates its last
//                    updates run after kIterEnd completed) and completes
//                    with the committed iterations in `detail`; ABORTED if
//                    those updates failed. Between iterations only. A
//                    data-parallel rank's job (JobSpec.run) keeps the
//                    states its last commit replaced until its next
//                    kIterBegin, which frees them: each rank sends
//                    kIterCommitted and learns that every rank committed
//                    before it sends kIterBegin, so that a rank whose peers
//                    stopped short can go back to the iteration all of them
//                    committed (ModelSpec.revert_last_commit). With
//                    kIterCommittedRelease (after that agreement) it frees
//                    them at once, as the next kIterBegin would (a run
//                    closing: an idle job keeps one version of its states).
//   kInitWeights     layer, slot_offset/length = the staging slot holding the
//                    layer's initial fp32 weights (length = elements x 4).
//                    Outside iterations, once per layer of a new job.
//   kReadWeights     layer, slot_offset/length = the staging slot: receives
//                    the layer's committed fp32 master weights.
//   kReadState       layer, slot_offset/length = the staging slot (length =
//                    elements x 4), activation_id = the part (RingStatePart
//                    below): receives the layer's committed Adam moment as
//                    fp32 (widened from bf16 when the job keeps bf16
//                    moments). Outside iterations, on a layer with states;
//                    kMaxExpAvgSq only for AMSGrad jobs.
//   kInitState       the same fields: replaces the layer's committed moment
//                    `part` with the staging slot's fp32 values (rounded to
//                    nearest even when the job keeps bf16 moments), all of
//                    the layer's chunks committed at once; weights, their
//                    16-bit copies and the other moments stay as they are.
//                    Outside iterations, after kInitWeights (a checkpoint
//                    restored into a new job, see ModelSpec
//                    initial_iteration).
// (The staging ops kInitWeights, kReadWeights, kReadState and kInitState are
// checked by the daemon's job session, which owns the staging slot, with
// CheckStagingEntry for their fields, not by EntryValidator::Accept.)
enum class RingOp : uint16_t {
  kInvalid = 0,
  kReservedRegisterLayout = 1,
  kGradReady = 2,
  kFetchParams = 3,
  kActPut = 4,
  kActGet = 5,
  kActFree = 6,
  kIterBegin = 7,
  kIterEnd = 8,
  kInitWeights = 9,
  kReadWeights = 10,
  kReadState = 11,
  kInitState = 12,
  kIterAbort = 13,
  kIterCommitted = 14,
};

// kReadState / kInitState's activation_id: which Adam moment (torch's
// optimizer state names).
enum class RingStatePart : uint64_t {
  kExpAvg = 1,
  kExpAvgSq = 2,
  kMaxExpAvgSq = 3,  // AMSGrad only
};

// SubmissionEntry::iter_flags, each op's own bits (distinct, so that one
// op's bit on another is refused). Of a kIterBegin:
inline constexpr uint8_t kIterBeginLrGiven = 1u << 0;
// Of a kIterEnd: the entry's global_sum_squares decides the outcome.
inline constexpr uint8_t kIterEndSumSquaresGiven = 1u << 1;
// Of a kIterCommitted: every rank has committed too (the caller's
// agreement): free the states the last commit kept now (a run closing).
inline constexpr uint8_t kIterCommittedRelease = 1u << 2;

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
  uint32_t layer;        // layer index
  uint64_t request_id;   // echoed in the completion; chosen by the client
  uint64_t slot_offset;  // byte offset into the job's arena
  uint64_t length;       // bytes
  uint64_t activation_id;
  uint64_t iteration;
  // kIterBegin only: every gradient of the iteration is multiplied by this
  // (1/loss_scale for fp16 loss scaling); 0 means 1.
  float grad_scale;
  uint8_t iter_flags;   // kIterBeginLrGiven / kIterEndSumSquaresGiven
  uint8_t reserved[3];  // must be zero
  union {
    // kIterBegin: the learning rate of this iteration (a schedule's
    // value); with kIterBeginLrGiven clear, 0 means the one the model was
    // registered with.
    double lr;
    // kIterEnd with kIterEndSumSquaresGiven: every rank's gradients' sum of
    // squares (see the op table above).
    double global_sum_squares;
  };
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
static_assert(offsetof(SubmissionEntry, iter_flags) == 52);
static_assert(offsetof(SubmissionEntry, reserved) == 53);
static_assert(offsetof(SubmissionEntry, lr) == 56);
static_assert(offsetof(SubmissionEntry, global_sum_squares) == 56);

struct CompletionEntry {
  uint64_t request_id;   // of the submission this completes
  uint32_t status_code;  // absl::StatusCode (canonical, = gRPC codes); 0 = OK
  uint32_t flags;        // op-specific (kIterEnd*), else zero
  uint64_t detail;       // op-specific: e.g. bytes moved, or which rule failed
  // A kIterEnd completion only (else zero): not zero, lohand asks the job
  // to move to a data plane whose arena it grants as this many bytes:
  // fewer than now to give way to another user's share of the host pool
  // (a shrink; the job's layout then streams through shared buffers), more
  // when the pool has room again (a grow). The client closes its plane
  // between iterations and opens it again, registering the model anew. A
  // shrink not followed within [quotas] reclaim escalation's wait is a
  // close (wire/plane_notice.h, kGaveWay); a grow not followed costs
  // nothing.
  uint64_t arena_asked;
  uint8_t reserved[32];  // zero
};
static_assert(sizeof(CompletionEntry) == kRingEntryBytes);
static_assert(offsetof(CompletionEntry, request_id) == 0);
static_assert(offsetof(CompletionEntry, status_code) == 8);
static_assert(offsetof(CompletionEntry, detail) == 16);
static_assert(offsetof(CompletionEntry, arena_asked) == 24);

// The error text area (RegisterModelResponse.error_text_offset/bytes): the
// daemon's words for failed requests, so that a client with many requests
// in flight gets each one's own text. The area is an array of records of
// kErrorTextRecordBytes; a failed completion carries its error sequence
// number s (1, 2, ...) in `detail`, and its text is in record
// (s - 1) % (area bytes / kErrorTextRecordBytes): a little-endian u64
// sequence number, then the NUL-terminated message (truncated to fit).
// The daemon stores 0 in the sequence before rewriting a record and s after
// (release), so a reader that sees s both before and after copying the
// message has an untorn copy; a different number means more failures than
// records happened before the client read this one (the text is lost, the
// status code is not). A single record covering the whole area (record 0,
// every failure) is the layout of daemons before records existed.
inline constexpr uint64_t kErrorTextRecordBytes = 512;
inline constexpr uint64_t kErrorTextRecords = 64;

// The writer's side of the above (the daemon's): failure `sequence`'s
// `message` into the error text area at `area`, `area_bytes` long.
// REQUIRES: `area` 8-byte aligned, area_bytes > sizeof(uint64_t), sequence
// >= 1.
inline void WriteErrorText(uint8_t* area, uint64_t area_bytes,
                           uint64_t sequence, std::string_view message) {
  const uint64_t records = area_bytes / kErrorTextRecordBytes;
  uint8_t* record =
      records <= 1 ? area
                   : area + (sequence - 1) % records * kErrorTextRecordBytes;
  const uint64_t record_bytes =
      records <= 1 ? area_bytes : kErrorTextRecordBytes;
  std::atomic_ref<uint64_t> published(*reinterpret_cast<uint64_t*>(record));
  published.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const size_t length =
      std::min<size_t>(record_bytes - sizeof(uint64_t) - 1, message.size());
  std::memcpy(record + sizeof(uint64_t), message.data(), length);
  record[sizeof(uint64_t) + length] = 0;
  published.store(sequence, std::memory_order_release);
}

}  // namespace lohan

#endif  // LOHAN_WIRE_RING_ENTRY_H_
