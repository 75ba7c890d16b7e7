// Fuzz target for EntryValidator: feeds arbitrary submission entries and
// traps if an accepted entry ever points outside the arena, breaks the
// layout the validator was given, or is not a client op. Built as a libFuzzer
// binary by build_fuzzer.sh and, with a deterministic driver, as the cc_test
// entry_validator_fuzz_test.

#include "daemon/ipc/entry_validator_fuzz.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <vector>

#include "daemon/ipc/entry_validator.h"
#include "daemon/pool/slot_allocator.h"
#include "wire/ring_entry.h"

namespace lohan::fuzz {
namespace {

// By RingOp value, every op the ring knows (kIterCommitted is the last).
uint64_t accepted_by_op[kAcceptedOps] = {};
uint64_t accepted_streamed = 0;
uint64_t accepted_sum_squares = 0;

void Require(bool condition) {
  if (!condition) __builtin_trap();
}

// Allocates the slots at the offsets the header promises.
void CarveSlots(SlotAllocator& slots) {
  Require(slots.Allocate(4096, SlotKind::kControl)->offset == kControlOffset);
  Require(slots.Allocate(8192, SlotKind::kGradient)->offset == kGradOffsets[0]);
  Require(slots.Allocate(8192, SlotKind::kGradient)->offset == kGradOffsets[1]);
  Require(slots.Allocate(8192, SlotKind::kWeight)->offset == kWeightOffset);
  Require(slots.Allocate(4096, SlotKind::kActivation)->offset ==
          kActOffsets[0]);
  Require(slots.Allocate(4096, SlotKind::kActivation)->offset ==
          kActOffsets[1]);
}

}  // namespace

const uint64_t* AcceptedByOp() { return accepted_by_op; }

uint64_t AcceptedStreamed() { return accepted_streamed; }

uint64_t AcceptedSumSquares() { return accepted_sum_squares; }

}  // namespace lohan::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lohan;
  using namespace lohan::fuzz;
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  ++data;
  --size;

  JobLayout layout{.dtype = RingDtype::kBf16,
                   .layer_bytes = std::vector<uint64_t>(std::begin(kLayerBytes),
                                                        std::end(kLayerBytes))};
  if (!(flags & 1)) {
    const size_t table =
        size < sizeof(kLayerBytes) ? size : sizeof(kLayerBytes);
    std::memset(layout.layer_bytes.data(), 0, sizeof(kLayerBytes));
    std::memcpy(layout.layer_bytes.data(), data, table);
    data += table;
    size -= table;
  }

  SlotAllocator slots(kArenaBytes);
  CarveSlots(slots);
  EntryValidator::Options options;
  if (flags & 2) options.max_live_activations = 4;
  options.next_iteration = (flags >> 2) & 3;
  const bool streamed = (flags & 16) != 0;
  if (streamed) {
    options.grad_slots.assign(std::begin(kGradOffsets), std::end(kGradOffsets));
    options.weight_slots = {kWeightOffset};
  }
  EntryValidator validator(&slots, layout, options);

  for (; size >= sizeof(SubmissionEntry);
       data += sizeof(SubmissionEntry), size -= sizeof(SubmissionEntry)) {
    SubmissionEntry entry;
    std::memcpy(&entry, data, sizeof(entry));
    // The staging ops' format (the job session's check): only they pass,
    // and only with every unused field zero and a part where one is used.
    if (CheckStagingEntry(entry).ok()) {
      Require(entry.op >= 9 && entry.op <= 12);
      ++accepted_by_op[entry.op];
      Require(entry.dtype == 0 && entry.iteration == 0);
      Require(entry.grad_scale == 0.0f && !std::signbit(entry.grad_scale));
      Require(entry.lr == 0.0 && !std::signbit(entry.lr));
      Require(entry.iter_flags == 0);
      for (uint8_t byte : entry.reserved) Require(byte == 0);
      const RingOp op = static_cast<RingOp>(entry.op);
      if (op == RingOp::kReadState || op == RingOp::kInitState) {
        Require(entry.activation_id >= 1 && entry.activation_id <= 3);
      } else {
        Require(entry.activation_id == 0);
      }
    }
    if (!validator.Accept(entry).ok()) continue;

    // Invariants every accepted entry must satisfy.
    Require((entry.op >= 2 && entry.op <= 8) || entry.op == 13 ||
            entry.op == 14);
    ++accepted_by_op[entry.op];
    const RingOp op = static_cast<RingOp>(entry.op);
    const bool has_range = op == RingOp::kGradReady ||
                           op == RingOp::kFetchParams ||
                           op == RingOp::kActPut || op == RingOp::kActGet;
    if (has_range) {
      Require(entry.length > 0);
      Require(entry.slot_offset < kArenaBytes);
      Require(entry.length <= kArenaBytes - entry.slot_offset);
    }
    Require(validator.layout().layer_bytes == layout.layer_bytes);
    // The last double: kIterBegin's lr (not negative), kIterEnd's global
    // sum of squares only with its flag (never below zero, NaN allowed),
    // zero bits everywhere else; iter_flags only each op's own bit.
    uint64_t last_bits;
    std::memcpy(&last_bits, &entry.lr, sizeof(last_bits));
    if (op == RingOp::kIterBegin) {
      Require((entry.iter_flags & ~kIterBeginLrGiven) == 0);
      Require(!std::signbit(entry.lr));
    } else if (op == RingOp::kIterEnd &&
               entry.iter_flags == kIterEndSumSquaresGiven) {
      Require(std::isnan(entry.global_sum_squares) ||
              !std::signbit(entry.global_sum_squares));
      ++accepted_sum_squares;
    } else if (op == RingOp::kIterCommitted) {
      Require((entry.iter_flags & ~kIterCommittedRelease) == 0);
      Require(last_bits == 0 && !validator.in_iteration());
    } else {
      Require(entry.iter_flags == 0 && last_bits == 0);
    }
    if (op == RingOp::kGradReady) {
      Require(validator.in_iteration());
      Require(entry.dtype == static_cast<uint16_t>(layout.dtype));
    }
    if (op == RingOp::kGradReady || op == RingOp::kFetchParams) {
      Require(entry.layer < layout.layer_bytes.size());
      Require(entry.length == layout.layer_bytes[entry.layer]);
      if (streamed) {
        // Exactly a slot's start, never a slice of one.
        Require(op == RingOp::kGradReady
                    ? entry.slot_offset == kGradOffsets[0] ||
                          entry.slot_offset == kGradOffsets[1]
                    : entry.slot_offset == kWeightOffset);
        ++accepted_streamed;
      }
    }
    Require(validator.live_activations() <= options.max_live_activations);
  }
  return 0;
}
