#ifndef LOHAN_PLUGINS_LIBTORCH_RECOMPUTE_H_
#define LOHAN_PLUGINS_LIBTORCH_RECOMPUTE_H_

#include <torch/types.h>

#include <functional>
#include <vector>

namespace lohan::torch_plugin {

// forward(input) with its intermediates not kept: forward runs without
// grad, only `input` is saved, and backward runs forward again with grad
// and back-propagates through it (torch::autograd::backward), so the
// gradients of `params` (the block's trained parameters) accumulate, and
// their tensor hooks fire, as they would without recomputing; the input's
// gradient is the node's. `params` are the node's inputs too, so the
// output requires grad when the input does not; the node gives them no
// gradient (their hooks then see an undefined one, which Engine ignores).
// forward must be deterministic (no dropout) for the gradients to be those of
// the first run.
torch::Tensor RunRecomputed(
    const std::function<torch::Tensor(const torch::Tensor&)>& forward,
    const torch::Tensor& input, const std::vector<torch::Tensor>& params);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_RECOMPUTE_H_
