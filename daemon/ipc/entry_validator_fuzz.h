#ifndef LOHAN_DAEMON_IPC_ENTRY_VALIDATOR_FUZZ_H_
#define LOHAN_DAEMON_IPC_ENTRY_VALIDATOR_FUZZ_H_

// The fixed world entry_validator_fuzz.cc checks entries against, shared with
// the deterministic driver (entry_validator_fuzz_test.cc) so it can aim at
// valid states. Input format of LLVMFuzzerTestOneInput:
//   byte 0   bit 0: the validator gets the standard layout (kLayerBytes,
//                   bf16); otherwise the next 32 bytes are its kLayers
//                   layer sizes (any values: the invariants hold for any
//                   layout the daemon gives it)
//            bit 1: at most 4 live activations
//            bits 2-3: Options::next_iteration
//            bit 4: streamed layout: kGradOffsets are the job's gradient
//                   slots and kWeightOffset its weight slot
//   then     64-byte SubmissionEntry images, each fed to Accept in order
//            (a trailing partial entry is ignored).

#include <cstddef>
#include <cstdint>

#include "wire/ring_entry.h"

namespace lohan::fuzz {

inline constexpr uint64_t kArenaBytes = 16 * 4096;
inline constexpr uint64_t kControlOffset = 0;              // 4096 bytes
inline constexpr uint64_t kGradOffsets[] = {4096, 12288};  // 8192 bytes each
inline constexpr uint64_t kWeightOffset = 20480;           // 8192 bytes
inline constexpr uint64_t kActOffsets[] = {28672, 32768};  // 4096 bytes each
inline constexpr uint32_t kLayers = 4;
inline constexpr uint64_t kLayerBytes[kLayers] = {4096, 8192, 100, 4096};

// Entries accepted so far, by RingOp value (0..14), over all inputs: ops
// 2..8, 13 and 14 by EntryValidator::Accept, the staging ops 9..12 by
// CheckStagingEntry; never 0 nor 1 (kReservedRegisterLayout).
inline constexpr size_t kAcceptedOps =
    static_cast<size_t>(RingOp::kIterCommitted) + 1;
const uint64_t* AcceptedByOp();
// GRAD_READY and FETCH_PARAMS entries accepted with a streamed layout.
uint64_t AcceptedStreamed();
// ITER_END entries accepted with kIterEndSumSquaresGiven.
uint64_t AcceptedSumSquares();

}  // namespace lohan::fuzz

#endif  // LOHAN_DAEMON_IPC_ENTRY_VALIDATOR_FUZZ_H_
