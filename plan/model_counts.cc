#include "plan/model_counts.h"

#include <algorithm>

namespace lohan {
namespace {

// Elementwise costs per element (FLOPs): a LayerNorm (mean, variance,
// scale, shift) or an RMSNorm, GELU's tanh form, SiLU times the up
// projection, rotary embedding, softmax (max, exp, sum, divide).
constexpr double kLayerNormFlops = 8;
constexpr double kRmsNormFlops = 4;
constexpr double kGeluFlops = 8;
constexpr double kSwiGluFlops = 6;
constexpr double kRotaryFlops = 6;
constexpr double kSoftmaxFlops = 5;

constexpr uint64_t kActivationBytes = 2;  // 16-bit activations

// A block's attention (Q, K, V and the output projection, with biases in
// GPT) and its MLP (two matrices with biases in GPT; gate, up and down
// without in Llama).
uint64_t AttentionParameters(const ModelShape& s) {
  const uint64_t h = s.hidden, kv = s.kv_width();
  const bool gpt = s.family == ModelShape::Family::kGpt;
  return h * (h + 2 * kv) + h * h + (gpt ? (h + 2 * kv) + h : 0);
}
uint64_t MlpParameters(const ModelShape& s) {
  const uint64_t h = s.hidden, f = s.ffn;
  return s.family == ModelShape::Family::kGpt ? 2 * h * f + f + h : 3 * h * f;
}

// The sublayers and two norms (LayerNorm: scale and shift; RMSNorm:
// scale).
uint64_t BlockParameters(const ModelShape& s) {
  const uint64_t norms =
      s.family == ModelShape::Family::kGpt ? 4 * s.hidden : 2 * s.hidden;
  return AttentionParameters(s) + MlpParameters(s) + norms;
}

// The largest matrix: the token embedding (and an untied head), the
// position table, an MLP matrix, or attention's (GPT-2's Q, K and V in one
// matrix; Llama's Q and output projection).
uint64_t LargestParameter(const ModelShape& s) {
  const uint64_t h = s.hidden;
  const uint64_t attention =
      s.family == ModelShape::Family::kGpt ? h * (h + 2 * s.kv_width()) : h * h;
  return std::max({s.vocab * h, (s.max_positions + s.position_offset) * h,
                   h * s.ffn, attention});
}

uint64_t EmbeddingParameters(const ModelShape& s) {
  const uint64_t tokens = s.vocab * s.hidden;
  const uint64_t head = s.tied_embeddings ? 0 : s.vocab * s.hidden;
  if (s.family == ModelShape::Family::kGpt) {
    // Tokens and positions; the final LayerNorm.
    return tokens + head + (s.max_positions + s.position_offset) * s.hidden +
           2 * s.hidden;
  }
  // Tokens, the final RMSNorm.
  return tokens + head + s.hidden;
}

}  // namespace

std::vector<uint64_t> LayerElements(const ModelCounts& c) {
  if (!c.layer_elements.empty()) return c.layer_elements;
  std::vector<uint64_t> layers = {c.first_layer_parameters};
  const uint64_t rest =
      c.parameters - c.layers * c.block_parameters - c.first_layer_parameters;
  if (rest > 0) layers.push_back(rest);
  layers.insert(layers.end(), c.layers, c.block_parameters);
  return layers;
}

const char* RecomputeUnitName(RecomputeUnit unit) {
  switch (unit) {
    case RecomputeUnit::kBlock:
      return "block";
    case RecomputeUnit::kSublayer:
      return "sublayer";
    case RecomputeUnit::kAuto:
      return "auto";
  }
  return "?";
}

const char* ParamUnitName(ParamUnit unit) {
  switch (unit) {
    case ParamUnit::kBlock:
      return "block";
    case ParamUnit::kSublayer:
      return "sublayer";
    case ParamUnit::kAuto:
      return "auto";
  }
  return "?";
}

uint64_t DefaultLossChunkTokens(uint64_t vocab) {
  const uint64_t tokens =
      kDefaultLossChunkLogitBytes / (4 * std::max<uint64_t>(1, vocab));
  return std::max(kLossChunkRowMultiple,
                  tokens / kLossChunkRowMultiple * kLossChunkRowMultiple);
}

uint64_t ChunkedLossBytes(uint64_t chunk, uint64_t tokens, uint64_t vocab,
                          uint64_t head_parameters) {
  // Forward: a chunk's 16-bit logits, their fp32 copy and the log-softmax.
  const uint64_t logits = chunk * vocab;
  if (chunk >= tokens) return logits * (2 + 4 + 4);
  // Several chunks: backward also holds the head's fp32 weight-gradient
  // accumulator and a chunk's fp32 softmax with its 16-bit copy, or that
  // copy and a slice of the weight gradient's 16-bit product.
  const uint64_t slice =
      std::min(2 * head_parameters, kLossWeightGradSliceBytes);
  return std::max(
      logits * (2 + 4 + 4),
      4 * head_parameters + std::max(logits * (4 + 2), logits * 2 + slice));
}

uint64_t LossChunkTokensFor(uint64_t tokens, uint64_t vocab,
                            uint64_t head_parameters) {
  const uint64_t chunk = DefaultLossChunkTokens(vocab);
  if (tokens <= chunk) return tokens;
  return ChunkedLossBytes(tokens, tokens, vocab, head_parameters) <=
                 ChunkedLossBytes(chunk, tokens, vocab, head_parameters)
             ? tokens
             : chunk;
}

ModelCounts CountModel(const ModelShape& s, uint64_t batch, uint64_t seq,
                       Attention attention, LossChunks loss) {
  ModelCounts counts;
  const double tokens = static_cast<double>(batch * seq);
  const double h = static_cast<double>(s.hidden);
  const double f = static_cast<double>(s.ffn);
  const double kv = static_cast<double>(s.kv_width());
  const double heads = static_cast<double>(s.heads);
  const double sq = static_cast<double>(seq);
  const bool gpt = s.family == ModelShape::Family::kGpt;
  counts.layers = s.layers;
  counts.block_parameters = BlockParameters(s);
  counts.sublayer_parameters = {AttentionParameters(s), MlpParameters(s)};
  counts.parameters =
      s.layers * counts.block_parameters + EmbeddingParameters(s);
  counts.largest_layer_parameters =
      std::max(s.vocab * s.hidden, counts.block_parameters);
  counts.largest_parameter = LargestParameter(s);
  counts.head_parameters = s.vocab * s.hidden;
  counts.first_layer_parameters =
      s.vocab * s.hidden + (s.max_positions + s.position_offset) * s.hidden;
  // The final norm: scale and shift (LayerNorm) or scale (RMSNorm).
  const uint64_t final_norm = gpt ? 2 * s.hidden : s.hidden;
  const uint64_t untied_head = s.tied_embeddings ? 0 : s.vocab * s.hidden;
  const uint64_t before = counts.first_layer_parameters +
                          (s.final_norm_before_blocks ? final_norm : 0);
  const uint64_t after =
      untied_head + (s.final_norm_before_blocks ? 0 : final_norm);
  counts.layer_elements = {before};
  if (after > 0) counts.layer_elements.push_back(after);
  counts.layer_elements.insert(counts.layer_elements.end(), s.layers,
                               counts.block_parameters);

  const double norm = gpt ? kLayerNormFlops : kRmsNormFlops;
  // Per token unless noted; attention's two products are per sequence
  // position pair (b x s x s), softmax per head and pair.
  const double qkv = 2 * h * (h + 2 * kv) + (gpt ? 0 : kRotaryFlops * (h + kv));
  const double pairs = static_cast<double>(batch) * sq * sq;
  const double scores = 2 * pairs * h + kSoftmaxFlops * pairs * heads;
  const double context = 2 * pairs * h;
  const double projection = 2 * h * h;
  const double up = gpt ? 2 * h * f : 4 * h * f;  // fc1, or gate and up
  const double act = gpt ? kGeluFlops * f : kSwiGluFlops * f;
  const double down = 2 * f * h;
  // A norm's output; Hugging Face's RMSNorm (Llama) runs in fp32 as
  // separate operators and keeps its input's fp32 copy and the normalized
  // 16-bit tensor too (LayerNorm is one operator keeping its input, which
  // is the block's input or the residual stream, counted there, and two
  // per-token statistics). SwiGLU keeps silu(gate) and its product with
  // up beside gate and up.
  const uint64_t norm_bytes =
      static_cast<uint64_t>(tokens * h) * (gpt ? 2 : 2 + 2 + 4);
  const auto bytes = [&](double elements) {
    return static_cast<uint64_t>(elements) * kActivationBytes;
  };
  counts.block_tensors = {
      {"input", bytes(tokens * h), 0, true},
      {"ln1", norm_bytes, norm * h * tokens, false},
      {"qkv", bytes(tokens * (h + 2 * kv)), qkv * tokens, false, 1}};
  if (attention == Attention::kEager) {
    counts.block_tensors.push_back(
        {"scores", bytes(pairs * heads), scores, false, 1});
    counts.block_tensors.push_back(
        {"context", bytes(tokens * h), context, false, 1});
  } else {
    // The output and an fp32 log-sum-exp per head and position; making
    // them again is the whole attention forward.
    counts.block_tensors.push_back(
        {"context",
         bytes(tokens * h) + static_cast<uint64_t>(tokens * heads) * 4,
         scores + context, false, 1});
  }
  // The sublayers' inputs (ln1, ln2) and the residual stream (attn_out,
  // the second norm's input) are kept between them.
  counts.block_tensors.insert(
      counts.block_tensors.end(),
      {{"attn_out", bytes(tokens * h), projection * tokens, false},
       {"ln2", norm_bytes, norm * h * tokens, false},
       {"mlp_up", bytes(tokens * (gpt ? f : 2 * f)), up * tokens, false, 2},
       {"mlp_act", bytes(tokens * (gpt ? f : 2 * f)), act * tokens, false, 2}});
  counts.block_forward_flops = down * tokens;
  for (const SavedTensor& tensor : counts.block_tensors) {
    counts.block_activation_bytes += tensor.bytes;
    counts.block_forward_flops += tensor.recompute_flops;
  }
  const double head = 2 * tokens * h * static_cast<double>(s.vocab);
  counts.forward_flops =
      static_cast<double>(s.layers) * counts.block_forward_flops + head;
  counts.hidden_bytes = kActivationBytes * batch * seq * s.hidden;
  if (!loss.chunked) {
    // The model's own loss peaks in backward: the log-softmax kept, the
    // gradient the loss hands it and the one it makes, fp32 each.
    counts.logits_bytes = batch * seq * s.vocab * 3 * 4;
    return counts;
  }
  const uint64_t tokens_in_batch = batch * seq;
  counts.loss_chunk_tokens =
      loss.tokens > 0
          ? std::min(tokens_in_batch, loss.tokens)
          : LossChunkTokensFor(tokens_in_batch, s.vocab, s.vocab * s.hidden);
  counts.logits_bytes =
      ChunkedLossBytes(counts.loss_chunk_tokens, tokens_in_batch, s.vocab,
                       counts.head_parameters);
  counts.loss_recompute_flops = head;
  return counts;
}

}  // namespace lohan
