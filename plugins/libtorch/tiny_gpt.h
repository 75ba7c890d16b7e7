#ifndef LOHAN_PLUGINS_LIBTORCH_TINY_GPT_H_
#define LOHAN_PLUGINS_LIBTORCH_TINY_GPT_H_

// A small GPT-like model on generated data, for engine_test and
// example_gpt: token and position embeddings, pre-norm blocks of causal
// single-head attention and a GELU MLP, a final LayerNorm and a head.

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <utility>

namespace lohan::torch_plugin::tiny_gpt {

struct Config {
  int64_t vocab = 64;
  int64_t context = 16;
  int64_t dim = 32;
  int64_t hidden = 64;
  int64_t blocks = 3;
  int64_t batch = 4;
};

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t dim, int64_t hidden)
      : norm1_(register_module(
            "norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        // No bias on the keys' projection: softmax cancels it, so its
        // gradient is rounding noise that Adam would amplify.
        qkv_(register_module(
            "qkv", torch::nn::Linear(
                       torch::nn::LinearOptions(dim, 3 * dim).bias(false)))),
        proj_(register_module("proj", torch::nn::Linear(dim, dim))),
        norm2_(register_module(
            "norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        up_(register_module("up", torch::nn::Linear(dim, hidden))),
        down_(register_module("down", torch::nn::Linear(hidden, dim))) {}

  // x: [batch, time, dim].
  torch::Tensor forward(torch::Tensor x) {
    const int64_t time = x.size(1);
    auto parts = qkv_(norm1_(x)).chunk(3, -1);
    torch::Tensor scores = torch::matmul(parts[0], parts[1].transpose(-2, -1)) /
                           std::sqrt(static_cast<double>(x.size(2)));
    torch::Tensor future =
        torch::ones({time, time}, torch::kBool).triu(1).to(x.device());
    scores = scores.masked_fill(future, -INFINITY).softmax(-1);
    x = x + proj_(torch::matmul(scores, parts[2]));
    return x + down_(torch::gelu(up_(norm2_(x))));
  }

 private:
  torch::nn::LayerNorm norm1_;
  torch::nn::Linear qkv_;
  torch::nn::Linear proj_;
  torch::nn::LayerNorm norm2_;
  torch::nn::Linear up_;
  torch::nn::Linear down_;
};
TORCH_MODULE(Block);

class ModelImpl : public torch::nn::Module {
 public:
  explicit ModelImpl(const Config& config)
      : tokens_(register_module(
            "tokens", torch::nn::Embedding(config.vocab, config.dim))),
        positions_(register_module(
            "positions", torch::nn::Embedding(config.context, config.dim))),
        blocks_(register_module("blocks", torch::nn::ModuleList())),
        norm_(register_module(
            "norm",
            torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.dim})))),
        head_(register_module("head",
                              torch::nn::Linear(config.dim, config.vocab))) {
    for (int64_t i = 0; i < config.blocks; ++i) {
      blocks_->push_back(Block(config.dim, config.hidden));
    }
  }

  // tokens: [batch, time] -> logits [batch, time, vocab].
  torch::Tensor forward(torch::Tensor tokens) {
    torch::Tensor where = torch::arange(tokens.size(1), tokens.options());
    torch::Tensor x = tokens_(tokens) + positions_(where);
    for (const auto& block : *blocks_) x = block->as<Block>()->forward(x);
    return head_(norm_(x));
  }

  // The blocks, for Engine.
  std::vector<std::shared_ptr<torch::nn::Module>> block_list() const {
    return blocks_->children();
  }

 private:
  torch::nn::Embedding tokens_;
  torch::nn::Embedding positions_;
  torch::nn::ModuleList blocks_;
  torch::nn::LayerNorm norm_;
  torch::nn::Linear head_;
};
TORCH_MODULE(Model);

// The same weights for the same seed.
inline Model MakeModel(const Config& config, uint64_t seed) {
  torch::manual_seed(seed);
  return Model(config);
}

// Step `step`'s batch: random tokens whose next token is (token * 5 + 3) mod
// vocab, so there is something to learn. (inputs, targets), [batch, time].
inline std::pair<torch::Tensor, torch::Tensor> MakeBatch(const Config& config,
                                                         int64_t step) {
  torch::manual_seed(1000 + step);
  torch::Tensor tokens = torch::randint(
      config.vocab, {config.batch, config.context}, torch::kLong);
  return {tokens, (tokens * 5 + 3).remainder(config.vocab)};
}

inline torch::Tensor Loss(const torch::Tensor& logits,
                          const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32),
      targets.reshape({-1}));
}

}  // namespace lohan::torch_plugin::tiny_gpt

#endif  // LOHAN_PLUGINS_LIBTORCH_TINY_GPT_H_
