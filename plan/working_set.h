#ifndef LOHAN_PLAN_WORKING_SET_H_
#define LOHAN_PLAN_WORKING_SET_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "plan/model_counts.h"

namespace lohan {

// The device's working set besides the saved tensors it keeps: what is
// always there (two blocks' 16-bit weights, one computing and the next on
// its way, or with weights a sublayer at a time two sublayers' and two
// blocks' own (norms); the head's weights and gradients, handed over with
// their layer, at the end of backward when tied), then the larger of two
// phases that never overlap: a block's backward (its gradients, or one
// sublayer's and the block's own, its saved tensors, recomputed ones
// included, the gradient coming into it, and the largest gradient
// backward makes while they all exist: one the size of its largest saved
// tensor) and the loss (its logits, or one chunk's with the head's fp32
// gradient accumulator; the head's input and its gradient).
struct DeviceWorkingSet {
  uint64_t always = 0, block_backward = 0, loss = 0;
  uint64_t bytes() const { return always + std::max(block_backward, loss); }
};
// With `unit` kSublayer a block's backward holds the tensors kept between
// its sublayers and one sublayer's at a time. REQUIRES:
// ValidateCounts(counts).ok() (PlanFromCounts' check); neither unit kAuto;
// `params` kSublayer only with `unit` kSublayer and sublayer_parameters.
DeviceWorkingSet WorkingSetOf(const ModelCounts& counts, RecomputeUnit unit,
                              ParamUnit params = ParamUnit::kBlock);

// With weights a sublayer at a time: a block's parameters whose weights
// cross the host-to-device link a third time in a step (the block's
// recompute, then the sublayer's own): every sublayer's but the last's,
// which keeps its weights from the one into the other.
uint64_t ParametersCrossingAgain(const ModelCounts& counts);

// How a recomputed block's backward runs and the unit its weights stream
// at.
struct Units {
  RecomputeUnit recompute = RecomputeUnit::kBlock;
  ParamUnit params = ParamUnit::kBlock;
};

// The units for `counts`: as they say, kAuto the first of (block, block),
// (sublayer, block) and (sublayer, sublayer) they allow whose working set
// fits `device_bytes`, else the last they allow (whose shortfall the plan
// then reports). INVALID_ARGUMENT for weights a sublayer at a time with a
// whole block's backward or without sublayer_parameters. REQUIRES:
// ValidateCounts(counts).ok().
absl::StatusOr<Units> ChooseUnits(const ModelCounts& counts,
                                  uint64_t device_bytes);

}  // namespace lohan

#endif  // LOHAN_PLAN_WORKING_SET_H_
