#ifndef LOHAN_PLUGINS_LIBTORCH_LINEAR_TANH_H_
#define LOHAN_PLUGINS_LIBTORCH_LINEAR_TANH_H_

// A model whose forward and backward are the same ops in libtorch and in
// PyTorch (tests/python/test_libtorch_checkpoint.py defines its twin):
// blocks.<i> = Linear(dim, dim) followed by tanh, then head = Linear(dim,
// out), and a mean squared error against a target. Both plugins cut it
// into the same layers (head, then one per block) and name its parameters
// alike, so their checkpoints are interchangeable; on the same torch
// build its losses and gradients are the same bits in both.
#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

#include "plugins/libtorch/engine.h"

namespace lohan::torch_plugin::linear_tanh {

struct Config {
  int64_t dim = 16;
  int64_t blocks = 3;
  int64_t out = 4;
  int64_t batch = 8;
};

class ModelImpl : public torch::nn::Module {
 public:
  explicit ModelImpl(const Config& config)
      : blocks_(register_module("blocks", torch::nn::ModuleList())),
        head_(register_module("head",
                              torch::nn::Linear(config.dim, config.out))) {
    for (int64_t i = 0; i < config.blocks; ++i) {
      blocks_->push_back(torch::nn::Linear(config.dim, config.dim));
    }
  }

  // Block i on x: tanh(blocks[i](x)).
  torch::Tensor block(size_t i, const torch::Tensor& x) {
    return torch::tanh(blocks_[i]->as<torch::nn::Linear>()->forward(x));
  }

  // With an engine, each block runs through engine->run_block (its
  // activation policy).
  torch::Tensor forward(torch::Tensor x, Engine* engine = nullptr) {
    for (size_t i = 0; i < blocks_->size(); ++i) {
      if (engine == nullptr) {
        x = block(i, x);
      } else {
        x = engine->run_block(
            i, [this, i](const torch::Tensor& in) { return block(i, in); }, x);
      }
    }
    return head_(x);
  }

  std::vector<std::shared_ptr<torch::nn::Module>> block_list() const {
    return blocks_->children();
  }

 private:
  torch::nn::ModuleList blocks_;
  torch::nn::Linear head_;
};
TORCH_MODULE(Model);

inline Model MakeModel(const Config& config, uint64_t seed) {
  torch::manual_seed(seed);
  return Model(config);
}

// Step `step`'s (inputs, targets), from arithmetic only (no generator).
inline std::pair<torch::Tensor, torch::Tensor> MakeBatch(const Config& config,
                                                         int64_t step) {
  torch::Tensor x =
      torch::sin(torch::arange(config.batch * config.dim, torch::kFloat32)
                         .reshape({config.batch, config.dim}) *
                     0.37 +
                 static_cast<double>(step));
  torch::Tensor y =
      torch::cos(torch::arange(config.batch * config.out, torch::kFloat32)
                         .reshape({config.batch, config.out}) *
                     0.11 +
                 static_cast<double>(step));
  return {x, y};
}

inline torch::Tensor Loss(const torch::Tensor& out, const torch::Tensor& y) {
  return (out - y).pow(2).mean();
}

}  // namespace lohan::torch_plugin::linear_tanh

#endif  // LOHAN_PLUGINS_LIBTORCH_LINEAR_TANH_H_
