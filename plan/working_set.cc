#include "plan/working_set.h"

#include <algorithm>
#include <functional>
#include <map>
#include <utility>
#include <vector>

namespace lohan {

DeviceWorkingSet WorkingSetOf(const ModelCounts& c, RecomputeUnit unit,
                              ParamUnit params) {
  DeviceWorkingSet set;
  // The parameters whose weights are there twice (the running unit's and
  // the next's) and whose gradients are there once.
  uint64_t weighed = 2 * c.block_parameters, graded = c.block_parameters;
  if (params == ParamUnit::kSublayer) {
    std::vector<uint64_t> units = c.sublayer_parameters;
    std::sort(units.begin(), units.end(), std::greater<uint64_t>());
    uint64_t own = c.block_parameters;
    for (uint64_t unit_parameters : units) own -= unit_parameters;
    weighed = 2 * own + units[0] + (units.size() > 1 ? units[1] : units[0]);
    graded = own + units[0];
  }
  set.always = 2 * weighed + 2 * 2 * c.head_parameters;
  uint64_t largest = 0, kept = 0;
  std::map<uint32_t, uint64_t> sublayers;
  for (const SavedTensor& tensor : c.block_tensors) {
    largest = std::max(largest, tensor.bytes);
    if (unit == RecomputeUnit::kSublayer && tensor.sublayer > 0) {
      sublayers[tensor.sublayer] += tensor.bytes;
    } else {
      kept += tensor.bytes;
    }
  }
  uint64_t one_sublayer = 0;
  for (const auto& [sublayer, bytes] : sublayers) {
    one_sublayer = std::max(one_sublayer, bytes);
  }
  set.block_backward =
      2 * graded + kept + one_sublayer + c.hidden_bytes + largest;
  set.loss = c.logits_bytes + 2 * c.hidden_bytes;
  return set;
}

uint64_t ParametersCrossingAgain(const ModelCounts& c) {
  uint64_t parameters = 0;
  for (size_t i = 0; i + 1 < c.sublayer_parameters.size(); ++i) {
    parameters += c.sublayer_parameters[i];
  }
  return parameters;
}

absl::StatusOr<Units> ChooseUnits(const ModelCounts& c, uint64_t device_bytes) {
  if (c.param_unit == ParamUnit::kSublayer) {
    if (c.recompute_unit == RecomputeUnit::kBlock) {
      return absl::InvalidArgumentError(
          "weights a sublayer at a time (param unit \"sublayer\") need a "
          "backward a sublayer at a time: recompute unit \"sublayer\" or "
          "\"auto\", not \"block\"");
    }
    if (c.sublayer_parameters.empty()) {
      return absl::InvalidArgumentError(
          "weights a sublayer at a time (param unit \"sublayer\") need the "
          "sublayers' parameters, which these counts do not give");
    }
  }
  std::vector<std::pair<RecomputeUnit, ParamUnit>> allowed;
  for (const auto& [recompute, params] :
       {std::pair{RecomputeUnit::kBlock, ParamUnit::kBlock},
        std::pair{RecomputeUnit::kSublayer, ParamUnit::kBlock},
        std::pair{RecomputeUnit::kSublayer, ParamUnit::kSublayer}}) {
    if ((c.recompute_unit == RecomputeUnit::kAuto ||
         c.recompute_unit == recompute) &&
        (c.param_unit == ParamUnit::kAuto || c.param_unit == params) &&
        (params == ParamUnit::kBlock || !c.sublayer_parameters.empty())) {
      allowed.emplace_back(recompute, params);
    }
  }
  for (const auto& [recompute, params] : allowed) {
    if (WorkingSetOf(c, recompute, params).bytes() <= device_bytes) {
      return Units{recompute, params};
    }
  }
  return Units{allowed.back().first, allowed.back().second};
}

}  // namespace lohan
