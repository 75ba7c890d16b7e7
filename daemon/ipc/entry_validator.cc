#include "daemon/ipc/entry_validator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lohan {
namespace {

// Which fields each op may use; every other field must be zero.
enum Field : uint32_t {
  kDtype = 1,
  kLayer = 2,
  kSlot = 4,  // slot_offset and length
  kActivationId = 8,
  kIteration = 16,
  kGradScale = 32,
};

uint32_t FieldsOf(RingOp op) {
  switch (op) {
    case RingOp::kGradReady:
      return kDtype | kLayer | kSlot;
    case RingOp::kFetchParams:
      return kLayer | kSlot;
    case RingOp::kActPut:
    case RingOp::kActGet:
      return kActivationId | kSlot;
    case RingOp::kActFree:
      return kActivationId;
    case RingOp::kIterBegin:
      return kIteration | kGradScale;
    case RingOp::kIterEnd:
    case RingOp::kIterAbort:
      return kIteration;
    // No field: its one flag (IterFlagsOf) says what it asks.
    case RingOp::kIterCommitted:
      break;
    // The layout is the daemon's (the constructor's), never a client's.
    case RingOp::kReservedRegisterLayout:
    // Served by the job session (CheckStagingEntry), never accepted here.
    case RingOp::kInitWeights:
    case RingOp::kReadWeights:
    case RingOp::kReadState:
    case RingOp::kInitState:
    case RingOp::kInvalid:
      break;
  }
  return 0;
}

// The iter_flags bits each op may set.
uint8_t IterFlagsOf(RingOp op) {
  if (op == RingOp::kIterBegin) return kIterBeginLrGiven;
  if (op == RingOp::kIterEnd) return kIterEndSumSquaresGiven;
  if (op == RingOp::kIterCommitted) return kIterCommittedRelease;
  return 0;
}

// Whether the entry's last double (lr, or global_sum_squares) carries a
// value: kIterBegin's lr, or kIterEnd's sum when its flag says so.
bool UsesLastDouble(RingOp op, const SubmissionEntry& entry) {
  return op == RingOp::kIterBegin ||
         (op == RingOp::kIterEnd &&
          (entry.iter_flags & kIterEndSumSquaresGiven) != 0);
}

const char* OpName(RingOp op) {
  switch (op) {
    case RingOp::kReservedRegisterLayout:
      return "REGISTER_LAYOUT";
    case RingOp::kGradReady:
      return "GRAD_READY";
    case RingOp::kFetchParams:
      return "FETCH_PARAMS";
    case RingOp::kActPut:
      return "ACT_PUT";
    case RingOp::kActGet:
      return "ACT_GET";
    case RingOp::kActFree:
      return "ACT_FREE";
    case RingOp::kIterBegin:
      return "ITER_BEGIN";
    case RingOp::kIterEnd:
      return "ITER_END";
    case RingOp::kIterAbort:
      return "ITER_ABORT";
    case RingOp::kIterCommitted:
      return "ITER_COMMITTED";
    case RingOp::kInitWeights:
      return "INIT_WEIGHTS";
    case RingOp::kReadWeights:
      return "READ_WEIGHTS";
    case RingOp::kReadState:
      return "READ_STATE";
    case RingOp::kInitState:
      return "INIT_STATE";
    case RingOp::kInvalid:
      break;
  }
  return "INVALID";
}

bool IsStagingOp(RingOp op) {
  return op == RingOp::kInitWeights || op == RingOp::kReadWeights ||
         op == RingOp::kReadState || op == RingOp::kInitState;
}

EntryValidator::Options Sorted(EntryValidator::Options options) {
  std::sort(options.grad_slots.begin(), options.grad_slots.end());
  std::sort(options.weight_slots.begin(), options.weight_slots.end());
  return options;
}

// "4096, 12288" (the first few of them).
std::string ListOffsets(const std::vector<uint64_t>& offsets) {
  constexpr size_t kShown = 8;
  std::string list;
  for (size_t i = 0; i < offsets.size() && i < kShown; ++i) {
    absl::StrAppend(&list, i == 0 ? "" : ", ", offsets[i]);
  }
  if (offsets.size() > kShown) absl::StrAppend(&list, ", ...");
  return list;
}

absl::Status WithOp(RingOp op, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(OpName(op), ": ", status.message()));
}

}  // namespace

EntryValidator::EntryValidator(const SlotAllocator* slots, JobLayout layout,
                               Options options)
    : slots_(slots),
      layout_(std::move(layout)),
      options_(Sorted(std::move(options))),
      iteration_(options_.next_iteration),
      grad_seen_(layout_.layer_bytes.size(), false) {}

EntryValidator::EntryValidator(const SlotAllocator* slots, JobLayout layout)
    : EntryValidator(slots, std::move(layout), Options()) {}

absl::Status EntryValidator::Accept(const SubmissionEntry& entry) {
  for (uint8_t byte : entry.reserved) {
    if (byte != 0) {
      return absl::InvalidArgumentError("entry: reserved bytes are not zero");
    }
  }
  const RingOp op = static_cast<RingOp>(entry.op);
  const uint32_t fields = FieldsOf(op);
  if (fields == 0 && op != RingOp::kIterCommitted) {
    if (IsStagingOp(op)) {
      return absl::InvalidArgumentError(absl::StrCat(
          OpName(op), ": a staging op, served by the job session"));
    }
    if (op == RingOp::kReservedRegisterLayout) {
      return absl::InvalidArgumentError(absl::StrCat(
          OpName(op), " (op ", entry.op,
          ") is not a client op: the daemon takes the job's layout from "
          "its RegisterModel request"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("entry: unknown op ", entry.op));
  }
  // Bit patterns, so that -0.0 and NaN count as set too.
  uint64_t last_bits;
  std::memcpy(&last_bits, &entry.lr, sizeof(last_bits));
  const bool last_used = UsesLastDouble(op, entry);
  if ((!(fields & kDtype) && entry.dtype != 0) ||
      (!(fields & kLayer) && entry.layer != 0) ||
      (!(fields & kSlot) && (entry.slot_offset != 0 || entry.length != 0)) ||
      (!(fields & kActivationId) && entry.activation_id != 0) ||
      (!(fields & kIteration) && entry.iteration != 0) ||
      (!(fields & kGradScale) && entry.grad_scale != 0.0f) ||
      (entry.iter_flags & ~IterFlagsOf(op)) != 0 ||
      (!last_used && last_bits != 0) || std::signbit(entry.grad_scale) ||
      (op == RingOp::kIterBegin && std::signbit(entry.lr))) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpName(op),
        ": a field this op does not use is not zero (or a negative scale)"));
  }
  // inf and NaN (of either sign: an all-reduce of inf - inf) mean a
  // non-finite gradient somewhere; below zero no sum of squares goes.
  if (op == RingOp::kIterEnd && last_used &&
      std::signbit(entry.global_sum_squares) &&
      !std::isnan(entry.global_sum_squares)) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpName(op), ": global sum of squares ",
                     entry.global_sum_squares, " is negative"));
  }

  switch (op) {
    case RingOp::kGradReady:
      return WithOp(op, CheckLayer(entry, SlotKind::kGradient));
    case RingOp::kFetchParams:
      return WithOp(op, CheckLayer(entry, SlotKind::kWeight));
    case RingOp::kActPut:
    case RingOp::kActGet:
    case RingOp::kActFree:
      return WithOp(op, CheckActivation(entry, op));
    case RingOp::kIterBegin:
    case RingOp::kIterEnd:
    case RingOp::kIterAbort:
      return WithOp(op, CheckIteration(entry, op));
    case RingOp::kIterCommitted:
      if (in_iteration_) {
        return absl::FailedPreconditionError(absl::StrCat(
            OpName(op), ": iteration ", iteration_,
            " is in progress (it waits for the last commit, between "
            "iterations)"));
      }
      return absl::OkStatus();
    default:
      return absl::InternalError("unreachable");
  }
}

absl::Status EntryValidator::CheckLayer(const SubmissionEntry& entry,
                                        SlotKind kind) {
  // Weights may be fetched between iterations too (a forward, or an
  // evaluation, before the next ITER_BEGIN): they are the committed ones.
  if (kind == SlotKind::kGradient && !in_iteration_) {
    return absl::FailedPreconditionError("outside ITER_BEGIN..ITER_END");
  }
  if (entry.layer >= layout_.layer_bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", entry.layer, " of ", layout_.layer_bytes.size()));
  }
  if (kind == SlotKind::kGradient &&
      static_cast<RingDtype>(entry.dtype) != layout_.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", entry.dtype, ", the layout says ",
                     static_cast<int>(layout_.dtype)));
  }
  const uint64_t want = layout_.layer_bytes[entry.layer];
  if (entry.length != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", entry.layer, ": length ", entry.length, ", want ", want));
  }
  const std::vector<uint64_t>& streamed =
      kind == SlotKind::kGradient ? options_.grad_slots : options_.weight_slots;
  if (!streamed.empty() && !std::binary_search(streamed.begin(), streamed.end(),
                                               entry.slot_offset)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", entry.layer, ": slot_offset ", entry.slot_offset,
        " is not one of the job's ", streamed.size(), " ",
        kind == SlotKind::kGradient ? "gradient" : "weight",
        " slots (streamed layout: every layer uses one of the slots at "
        "offsets ",
        ListOffsets(streamed), ")"));
  }
  absl::Status range =
      slots_->CheckRange(entry.slot_offset, entry.length, kind);
  if (!range.ok()) return range;
  if (kind == SlotKind::kGradient) {
    if (grad_seen_[entry.layer]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer ", entry.layer, ": gradient already delivered in iteration ",
          iteration_));
    }
    grad_seen_[entry.layer] = true;
  }
  return absl::OkStatus();
}

void EntryValidator::ForgetActivation(uint64_t id) { activations_.erase(id); }

void EntryValidator::AdoptActivation(uint64_t id, uint64_t bytes) {
  activations_[id] = bytes;
}

absl::Status EntryValidator::CheckActivation(const SubmissionEntry& entry,
                                             RingOp op) {
  auto it = activations_.find(entry.activation_id);
  if (op == RingOp::kActFree) {
    if (it == activations_.end()) {
      return absl::NotFoundError(
          absl::StrCat("activation ", entry.activation_id, " is not held"));
    }
    activations_.erase(it);
    return absl::OkStatus();
  }
  if (op == RingOp::kActPut) {
    if (it != activations_.end()) {
      return absl::AlreadyExistsError(
          absl::StrCat("activation ", entry.activation_id, " already held"));
    }
    if (activations_.size() >= options_.max_live_activations) {
      return absl::ResourceExhaustedError(
          absl::StrCat(activations_.size(), " activations held already"));
    }
  } else {  // kActGet
    if (it == activations_.end()) {
      return absl::NotFoundError(
          absl::StrCat("activation ", entry.activation_id, " is not held"));
    }
    if (it->second != entry.length) {
      return absl::InvalidArgumentError(
          absl::StrCat("activation ", entry.activation_id, " has ", it->second,
                       " bytes, not ", entry.length));
    }
  }
  absl::Status range = slots_->CheckRange(entry.slot_offset, entry.length,
                                          SlotKind::kActivation);
  if (!range.ok()) return range;
  if (op == RingOp::kActPut) activations_[entry.activation_id] = entry.length;
  return absl::OkStatus();
}

absl::Status EntryValidator::CheckIteration(const SubmissionEntry& entry,
                                            RingOp op) {
  if (op == RingOp::kIterBegin) {
    if (in_iteration_) {
      return absl::FailedPreconditionError(
          absl::StrCat("iteration ", iteration_, " has not ended"));
    }
    if (entry.iteration != iteration_) {
      return absl::InvalidArgumentError(
          absl::StrCat("iteration ", entry.iteration, " does not follow; want ",
                       iteration_));
    }
    if (iteration_ == UINT64_MAX) {
      return absl::OutOfRangeError("iteration counter exhausted");
    }
    if (!std::isfinite(entry.grad_scale) || !std::isfinite(entry.lr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient scale ", entry.grad_scale, " or lr ", entry.lr,
                       " is not a finite number"));
    }
    in_iteration_ = true;
    grad_seen_.assign(grad_seen_.size(), false);
    return absl::OkStatus();
  }
  if (!in_iteration_) {
    return absl::FailedPreconditionError("no iteration in progress");
  }
  if (entry.iteration != iteration_) {
    return absl::InvalidArgumentError(
        absl::StrCat("ends iteration ", entry.iteration, " but ", iteration_,
                     " is in progress"));
  }
  in_iteration_ = false;
  ++iteration_;
  return absl::OkStatus();
}

absl::Status CheckStagingEntry(const SubmissionEntry& entry) {
  const RingOp op = static_cast<RingOp>(entry.op);
  if (!IsStagingOp(op)) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry: op ", entry.op, " is not a staging op"));
  }
  for (uint8_t byte : entry.reserved) {
    if (byte != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(OpName(op), ": reserved bytes are not zero"));
    }
  }
  // Bit patterns, so that -0.0 counts as set too.
  uint32_t scale_bits;
  uint64_t lr_bits;
  std::memcpy(&scale_bits, &entry.grad_scale, sizeof(scale_bits));
  std::memcpy(&lr_bits, &entry.lr, sizeof(lr_bits));
  if (entry.dtype != 0 || entry.iteration != 0 || scale_bits != 0 ||
      lr_bits != 0 || entry.iter_flags != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpName(op),
        ": a field this op does not use is not zero (it uses layer, "
        "slot_offset, length",
        op == RingOp::kReadState || op == RingOp::kInitState
            ? " and activation_id = the part)"
            : ")"));
  }
  if (op == RingOp::kReadState || op == RingOp::kInitState) {
    if (entry.activation_id < static_cast<uint64_t>(RingStatePart::kExpAvg) ||
        entry.activation_id >
            static_cast<uint64_t>(RingStatePart::kMaxExpAvgSq)) {
      return absl::InvalidArgumentError(absl::StrCat(
          OpName(op), ": part (activation_id) ", entry.activation_id,
          " is not 1 (exp_avg), 2 (exp_avg_sq) or 3 (max_exp_avg_sq)"));
    }
  } else if (entry.activation_id != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpName(op),
        ": a field this op does not use is not zero (activation_id ",
        entry.activation_id, ")"));
  }
  return absl::OkStatus();
}

}  // namespace lohan
