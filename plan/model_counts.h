#ifndef LOHAN_PLAN_MODEL_COUNTS_H_
#define LOHAN_PLAN_MODEL_COUNTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "plan/model_shape.h"

namespace lohan {

// One tensor autograd saves in every block for backward, for one batch.
struct SavedTensor {
  std::string name;  // its class: "input", "ln1", "qkv", "scores", ...
  uint64_t bytes = 0;
  // FLOPs to make it again from what it was made of (its producing op):
  // what discarding it costs in backward.
  double recompute_flops = 0;
  // Never recomputed: always offloaded (or kept on the device). The block's
  // input is (the checkpoint everything else is recomputed from), and so is
  // a measured tensor backward cannot make again (MeasuredTensor's
  // always_offloaded: it depends on the input, a random operator or
  // something else not kept).
  bool inter_block = false;
  // The sublayer whose recompute makes it again when a block's backward
  // runs a sublayer at a time (1: attention, 2: the MLP); 0: between the
  // sublayers (their inputs, the residual stream), kept through the
  // block's backward. A client's measured tensors are all 0.
  uint32_t sublayer = 0;
  // FLOPs saved per byte offloaded: the paper's offloading benefit.
  double benefit() const {
    return bytes == 0 ? 0 : recompute_flops / static_cast<double>(bytes);
  }
};

// How a recomputed block's backward runs: whole (all it saves at once),
// a sublayer at a time (the plugin's recompute_unit="sublayer": each
// sublayer's saved tensors made again just before its backward), or
// whichever the device's memory allows, the block first (the planner
// decides; only MakePlan and LargestBatch take kAuto).
enum class RecomputeUnit { kBlock, kSublayer, kAuto };
const char* RecomputeUnitName(RecomputeUnit unit);

// Where a block's 16-bit weights stream in from and its gradients go out
// at once: the whole block, or a sublayer at a time (the plugin's
// param_unit="sublayer": each sublayer's weights on the device only while
// it runs, forward, the block's recompute and its own, and its gradients
// handed over when its backward is done; needs a sublayer-at-a-time
// backward), or whichever the device's memory allows, the block first.
enum class ParamUnit { kBlock, kSublayer, kAuto };
const char* ParamUnitName(ParamUnit unit);

// Exact counts for a model shape at a batch and sequence length, with
// 16-bit activations, weights and gradients and fp32 optimizer states
// (master weights and Adam's two moments), as lohan trains it.
struct ModelCounts {
  uint64_t layers = 0;  // the blocks
  uint64_t parameters = 0;
  uint64_t block_parameters = 0;          // one block's
  uint64_t largest_layer_parameters = 0;  // the embedding, usually
  // The largest single parameter's elements (the token embedding or an
  // MLP matrix): what save_pretrained holds one of at a time. 0 in counts
  // a client measured (the largest layer's stands in).
  uint64_t largest_parameter = 0;
  // Of a block's parameters, each sublayer's (attention, then the MLP, as
  // SavedTensor::sublayer numbers them from 1); the rest (the norms) is
  // the block's own. Empty in counts a client measured: then the weights
  // stream a block at a time.
  std::vector<uint64_t> sublayer_parameters;
  // The output head's weights, on the device beside the blocks' (vocab x
  // hidden, tied or not).
  uint64_t head_parameters = 0;
  // What forward uses first and backward's gradients reach last (the token
  // and position embeddings): the update nothing hides.
  uint64_t first_layer_parameters = 0;
  // The daemon's layers as the plugin cuts the model (lohan/blocks.py
  // plan_layers): the parameters outside the blocks registered before them
  // (the embeddings; OPT's final norm too), those registered after them
  // (the final norm, an untied head; no layer when there are none), then
  // one per block. Sums to `parameters`. Empty in counts a client measured;
  // then LayerElements derives it.
  std::vector<uint64_t> layer_elements;
  // Forward FLOPs of the whole model for the batch (matrix products and
  // attention; 2 per multiply-add), and of one block.
  double forward_flops = 0;
  double block_forward_flops = 0;
  // One block's saved tensors (every block alike), in the order the
  // forward makes them.
  std::vector<SavedTensor> block_tensors;
  uint64_t block_activation_bytes = 0;  // their sum
  // What the loss holds on the device at once besides the head's weights
  // and gradients and its input: for every token (the model's own loss)
  // 12 bytes a logit in backward (the fp32 log-softmax, the gradient the
  // loss hands it and the one it makes); or (the plugin's chunked loss,
  // lohan/chunked_loss.py) one chunk's 10 bytes a logit in forward (the
  // 16-bit product, its fp32 copy, the log-softmax), or in backward the
  // head's fp32 weight-gradient accumulator and a chunk's softmax.
  uint64_t logits_bytes = 0;
  // Tokens per chunk of the loss (lohan/chunked_loss.py); 0: the full
  // logits.
  uint64_t loss_chunk_tokens = 0;
  // FLOPs the chunked loss adds to backward: each chunk's logits made
  // again (the head's forward product once more).
  double loss_recompute_flops = 0;
  // A block's 16-bit output for the batch (b x s x hidden): what passes
  // between blocks, and its gradient in backward; the head's input.
  uint64_t hidden_bytes = 0;
  // How a recomputed block's backward runs, and the unit its weights
  // stream at (kAuto: the planner decides).
  RecomputeUnit recompute_unit = RecomputeUnit::kBlock;
  ParamUnit param_unit = ParamUnit::kBlock;

  // Model states by tier, as lohan keeps them: 16-bit weights (2 bytes a
  // parameter) and, on the SSDs, fp32 masters and moments (12 bytes).
  uint64_t weight16_bytes() const { return 2 * parameters; }
  uint64_t optimizer_state_bytes() const { return 12 * parameters; }
};

// How attention keeps what its backward needs.
enum class Attention {
  // One kernel (PyTorch's scaled_dot_product_attention with a flash or
  // memory-efficient backend, transformers' default "sdpa"): it saves its
  // output and the softmax's log-sum-exp, and its backward recomputes the
  // scores inside the kernel.
  kFused,
  // Separate products and softmax ("eager"): the softmax output, b x heads
  // x s x s, is saved.
  kEager,
};

// How the loss is computed: by default a chunk of tokens at a time, as
// the plugin's chunked loss does for Hugging Face causal LMs
// (lohan/chunked_loss.py); or over the full logits (the model's own).
struct LossChunks {
  bool chunked = true;
  uint64_t tokens = 0;  // 0: DefaultLossChunkTokens
};

// One chunk's fp32 logits are at most this many bytes by default.
constexpr uint64_t kDefaultLossChunkLogitBytes = uint64_t{256} << 20;
// The default chunk is a multiple of this many tokens, so that each row
// of the plugin's head products rounds as in the model's own product
// (chunked_loss.ROW_MULTIPLE).
constexpr uint64_t kLossChunkRowMultiple = 8;
// The chunked loss adds the head's weight gradient to its accumulator in
// 16-bit products of at most this many bytes.
constexpr uint64_t kLossWeightGradSliceBytes = uint64_t{64} << 20;

// The plugin's default chunk: the most tokens whose fp32 logits are at
// most kDefaultLossChunkLogitBytes, rounded down to a multiple of
// kLossChunkRowMultiple, at least kLossChunkRowMultiple (1,328 for GPT-2's
// vocabulary, 520 for Llama 3's).
uint64_t DefaultLossChunkTokens(uint64_t vocab);

// What the chunked loss holds at its peak besides the head's weights,
// gradients and input (lohan/chunked_loss.py), in chunks of `chunk` of
// `tokens`: one chunk's 10 bytes a logit in forward; with several chunks,
// in backward, the head's fp32 weight-gradient accumulator and a chunk's
// softmax. Counted for 16-bit logits.
uint64_t ChunkedLossBytes(uint64_t chunk, uint64_t tokens, uint64_t vocab,
                          uint64_t head_parameters);

// The plugin's chunk when none is given (chunked_loss.chunk_tokens_for):
// DefaultLossChunkTokens, or every token in one chunk when that holds no
// more (a short batch under a large head: one chunk needs no
// accumulator).
uint64_t LossChunkTokensFor(uint64_t tokens, uint64_t vocab,
                            uint64_t head_parameters);

// counts.layer_elements, or when it is empty the cut a GPT or Llama model
// has: first_layer_parameters, then what neither it nor the blocks hold
// (when > 0), then `layers` blocks of block_parameters. REQUIRES: the
// blocks and the first layer add up to at most `parameters`.
std::vector<uint64_t> LayerElements(const ModelCounts& counts);

// REQUIRES: ValidateShape(shape).ok(), batch >= 1, seq >= 1.
ModelCounts CountModel(const ModelShape& shape, uint64_t batch, uint64_t seq,
                       Attention attention = Attention::kFused,
                       LossChunks loss = {});

}  // namespace lohan

#endif  // LOHAN_PLAN_MODEL_COUNTS_H_
