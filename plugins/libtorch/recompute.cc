#include "plugins/libtorch/recompute.h"

#include <torch/autograd.h>

#include <memory>
#include <stdexcept>
#include <utility>

namespace lohan::torch_plugin {
namespace {

using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

// The forward a node runs again, kept in the node's saved data.
struct ForwardHolder : torch::CustomClassHolder {
  explicit ForwardHolder(Forward f) : forward(std::move(f)) {}
  Forward forward;
};

class RecomputeBlock : public torch::autograd::Function<RecomputeBlock> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& input,
                               c10::intrusive_ptr<ForwardHolder> holder,
                               torch::TensorList params) {
    // Inputs of the node (its output requires grad through them); their
    // gradients reach them through backward's accumulation, not the node.
    ctx->saved_data["params"] = static_cast<int64_t>(params.size());
    ctx->save_for_backward({input});
    ctx->saved_data["forward"] = c10::IValue::make_capsule(holder);
    torch::NoGradGuard no_grad;
    return holder->forward(input);
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_outputs) {
    const torch::Tensor saved = ctx->get_saved_variables()[0];
    auto holder = c10::static_intrusive_pointer_cast<ForwardHolder>(
        ctx->saved_data["forward"].toCapsule());
    torch::Tensor input = saved.detach();
    if (saved.requires_grad()) input.requires_grad_(true);
    torch::Tensor output;
    {
      torch::AutoGradMode grad(true);
      output = holder->forward(input);
    }
    if (output.requires_grad()) {
      torch::autograd::backward({output}, {grad_outputs[0]});
    }
    // One per forward argument: the input, the holder, each parameter.
    torch::autograd::variable_list grads(2 + ctx->saved_data["params"].toInt());
    if (saved.requires_grad()) grads[0] = input.grad();
    return grads;
  }
};

}  // namespace

torch::Tensor RunRecomputed(const Forward& forward, const torch::Tensor& input,
                            const std::vector<torch::Tensor>& params) {
  if (!torch::GradMode::is_enabled()) return forward(input);
  return RecomputeBlock::apply(input,
                               c10::make_intrusive<ForwardHolder>(forward),
                               torch::TensorList(params));
}

}  // namespace lohan::torch_plugin
