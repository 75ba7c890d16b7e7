#include "plan/model_counts.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

ModelShape Preset(const char* name) { return *PresetShape(name); }

// Parameter counts as the reference implementations have them.
TEST(ModelCounts, ParametersMatchTheReferenceModels) {
  // GPT-2 small (transformers' GPT2LMHeadModel, tied head): 124,439,808.
  ModelShape gpt2{.name = "gpt2",
                  .family = ModelShape::Family::kGpt,
                  .layers = 12,
                  .hidden = 768,
                  .heads = 12,
                  .kv_heads = 12,
                  .ffn = 3072,
                  .vocab = 50257,
                  .max_positions = 1024};
  EXPECT_EQ(CountModel(gpt2, 1, 1).parameters, 124439808u);
  EXPECT_EQ(CountModel(gpt2, 1, 1).block_parameters, 7087872u);
  // What the planner needs beside the blocks: the tied head (vocab x
  // hidden) on the device, and the embeddings (tokens and positions),
  // whose update comes last.
  EXPECT_EQ(CountModel(gpt2, 1, 1).layers, 12u);
  EXPECT_EQ(CountModel(gpt2, 1, 1).head_parameters, 50257u * 768);
  EXPECT_EQ(CountModel(gpt2, 1, 1).first_layer_parameters,
            (50257u + 1024) * 768);
  // The largest single parameter (what save_pretrained holds one of): the
  // token embedding, larger than Llama 2 70B's MLP matrices (8192 x
  // 28672); an MLP matrix in a model of a small vocabulary.
  EXPECT_EQ(CountModel(gpt2, 1, 1).largest_parameter, 50257u * 768);
  EXPECT_EQ(CountModel(Preset("llama-70b"), 1, 1).largest_parameter,
            32000u * 8192);
  ModelShape small_vocab = gpt2;
  small_vocab.vocab = 1000;
  EXPECT_EQ(CountModel(small_vocab, 1, 1).largest_parameter, 768u * 3072);
  // Llama 2 7B and 70B (grouped-query attention): 6,738,415,616 and
  // 68,976,648,192.
  EXPECT_EQ(CountModel(Preset("llama-7b"), 1, 1).parameters, 6738415616u);
  EXPECT_EQ(CountModel(Preset("llama-70b"), 1, 1).parameters, 68976648192u);
  // GPT-3's 13B and 175B, as the paper rounds them.
  const double p13 = CountModel(Preset("gpt-13b"), 1, 1).parameters;
  EXPECT_GT(p13, 12.5e9);
  EXPECT_LT(p13, 13.2e9);
  const double p175 = CountModel(Preset("gpt-175b"), 1, 1).parameters;
  EXPECT_GT(p175, 174e9);
  EXPECT_LT(p175, 176e9);
}

// The daemon's layers as the plugin cuts a model (tests/python/
// test_plan.py checks them against lohan/blocks.py on transformers'
// models): embeddings, the rest after the blocks, then the blocks.
TEST(ModelCounts, LayersAreThePluginsCut) {
  ModelShape gpt2{.name = "gpt2",
                  .family = ModelShape::Family::kGpt,
                  .layers = 2,
                  .hidden = 64,
                  .heads = 4,
                  .kv_heads = 4,
                  .ffn = 256,
                  .vocab = 1000,
                  .max_positions = 128};
  const ModelCounts g = CountModel(gpt2, 1, 1);
  EXPECT_EQ(g.layer_elements,
            (std::vector<uint64_t>{1128 * 64, 2 * 64, 49984, 49984}));
  // OPT's final LayerNorm comes before its layers: with the embeddings.
  ModelShape opt = gpt2;
  opt.position_offset = 2;
  opt.final_norm_before_blocks = true;
  EXPECT_EQ(CountModel(opt, 1, 1).layer_elements,
            (std::vector<uint64_t>{1130 * 64 + 2 * 64, 49984, 49984}));
  // Llama: the final RMSNorm and the untied head after the blocks; tied,
  // the norm alone.
  ModelShape llama = *PresetShape("llama-7b");
  llama.layers = 2;
  ModelCounts l = CountModel(llama, 1, 1);
  const uint64_t embedding = llama.vocab * llama.hidden;
  EXPECT_EQ(l.layer_elements,
            (std::vector<uint64_t>{embedding, llama.hidden + embedding,
                                   l.block_parameters, l.block_parameters}));
  llama.tied_embeddings = true;
  l = CountModel(llama, 1, 1);
  EXPECT_EQ(l.layer_elements[1], llama.hidden);
  // Whatever the model, they add up to its parameters; counts without
  // them (a client's) get the same cut from their parts.
  for (const std::string& name : PresetNames()) {
    ModelCounts c = CountModel(Preset(name.c_str()), 1, 1);
    uint64_t sum = 0;
    for (uint64_t n : c.layer_elements) sum += n;
    EXPECT_EQ(sum, c.parameters) << name;
    const std::vector<uint64_t> cut = c.layer_elements;
    c.layer_elements.clear();
    EXPECT_EQ(LayerElements(c), cut) << name;
  }
}

// Without dropout, a GPT block saves 32 s b h + 2 a s^2 b bytes in 16 bits
// (Korthikanti et al.'s 34 s b h + 5 a s^2 b, less the dropout masks and
// outputs).
TEST(ModelCounts, AGptBlockSavesWhatTheLiteratureCounts) {
  const ModelShape shape = Preset("gpt-13b");
  const uint64_t b = 4, s = 1024, h = shape.hidden, a = shape.heads;
  const ModelCounts counts = CountModel(shape, b, s, Attention::kEager);
  EXPECT_EQ(counts.block_activation_bytes, 32 * s * b * h + 2 * a * s * s * b);
  // Fused attention keeps no scores: its output and log-sum-exp instead.
  const ModelCounts fused = CountModel(shape, b, s, Attention::kFused);
  EXPECT_EQ(fused.block_activation_bytes, 32 * s * b * h + 4 * a * s * b);
  EXPECT_EQ(fused.block_forward_flops, counts.block_forward_flops);
  EXPECT_EQ(counts.block_tensors.front().name, "input");
  EXPECT_TRUE(counts.block_tensors.front().inter_block);
  EXPECT_EQ(counts.block_tensors.front().bytes, 2 * s * b * h);
  // The loss in chunks by default: at most 256 MiB of fp32 logits a
  // chunk, a multiple of 8 tokens.
  EXPECT_EQ(counts.loss_chunk_tokens, 1328u);
  EXPECT_EQ(counts.hidden_bytes, 2 * b * s * h);
}

// The loss over every token's logits (12 bytes each at its peak, in
// backward) or a chunk's, with the head's fp32 gradient accumulator and one
// more head product in backward.
TEST(ModelCounts, TheLossHoldsTheFullLogitsOrOneChunk) {
  const ModelShape shape = Preset("gpt-13b");
  const uint64_t b = 64, s = 1024, v = shape.vocab, h = shape.hidden;
  const ModelCounts full =
      CountModel(shape, b, s, Attention::kFused, LossChunks{false, 0});
  EXPECT_EQ(full.loss_chunk_tokens, 0u);
  EXPECT_EQ(full.logits_bytes, b * s * v * 12);
  EXPECT_EQ(full.loss_recompute_flops, 0);
  const ModelCounts chunked =
      CountModel(shape, b, s, Attention::kFused, LossChunks{true, 512});
  EXPECT_EQ(chunked.loss_chunk_tokens, 512u);
  // Backward's accumulator (4 v h) and the chunk's fp32 softmax with its
  // 16-bit copy pass forward's 10 bytes a logit here; with smaller chunks
  // the 16-bit copy and the weight gradient's 64 MiB product slice do.
  EXPECT_EQ(chunked.logits_bytes, 4 * v * h + 512 * v * 6);
  EXPECT_EQ(CountModel(shape, b, s, Attention::kFused, LossChunks{true, 64})
                .logits_bytes,
            4 * v * h + 64 * v * 2 + (64 << 20));
  const ModelCounts big_chunks =
      CountModel(shape, b, s, Attention::kFused, LossChunks{true, 16384});
  EXPECT_EQ(big_chunks.logits_bytes, 16384 * v * 10);
  EXPECT_DOUBLE_EQ(chunked.loss_recompute_flops,
                   2.0 * b * s * h * static_cast<double>(v));
  EXPECT_EQ(chunked.forward_flops, full.forward_flops);
  // A chunk is at most the batch's tokens; one chunk needs no
  // accumulator.
  const ModelCounts one =
      CountModel(shape, 1, 16, Attention::kFused, LossChunks{true, 512});
  EXPECT_EQ(one.loss_chunk_tokens, 16u);
  EXPECT_EQ(one.logits_bytes, 16 * v * 10);
  // By default a short batch under a large head is one chunk, when that
  // holds less than chunks with the accumulator: 13B at batch 1 (1,024
  // tokens, fewer than the default chunk), and Llama-3-405B's head
  // (128,256 x 16,384) at 2 x 1,024 tokens; at batch 64 chunks.
  EXPECT_EQ(CountModel(shape, 1, 1024).loss_chunk_tokens, 1024u);
  EXPECT_EQ(CountModel(shape, 64, 1024).loss_chunk_tokens, 1328u);
  const uint64_t v3 = 128256, h3 = 16384;
  EXPECT_EQ(LossChunkTokensFor(2048, v3, v3 * h3), 2048u);
  EXPECT_EQ(ChunkedLossBytes(2048, 2048, v3, v3 * h3), 2048 * v3 * 10);
  EXPECT_LT(ChunkedLossBytes(2048, 2048, v3, v3 * h3),
            ChunkedLossBytes(520, 2048, v3, v3 * h3));
  EXPECT_EQ(LossChunkTokensFor(65536, v3, v3 * h3), 520u);
  // The default chunk: 256 MiB of fp32 logits rounded down to a multiple
  // of 8 tokens (1,335 and 523 before rounding), at least 8.
  EXPECT_EQ(DefaultLossChunkTokens(50257), 1328u);
  EXPECT_EQ(DefaultLossChunkTokens(128256), 520u);
  EXPECT_EQ(DefaultLossChunkTokens(8192), 8192u);
  EXPECT_LE(DefaultLossChunkTokens(50257) * 50257 * 4,
            kDefaultLossChunkLogitBytes);
  EXPECT_EQ(DefaultLossChunkTokens(uint64_t{1} << 40), 8u);
}

// Forward FLOPs: 24 b s h^2 (the block's matrices) + 4 b s^2 h
// (attention), plus elementwise work under 1%.
TEST(ModelCounts, ForwardFlopsAreTheMatrixProductsAndAttention) {
  const ModelShape shape = Preset("gpt-13b");
  const double b = 8, s = 1024, h = shape.hidden;
  const ModelCounts counts = CountModel(shape, 8, 1024);
  const double products = 24 * b * s * h * h + 4 * b * s * s * h;
  EXPECT_GT(counts.block_forward_flops, products);
  EXPECT_LT(counts.block_forward_flops, 1.01 * products);
  // The head on top: 2 b s h V.
  EXPECT_NEAR(
      counts.forward_flops,
      shape.layers * counts.block_forward_flops + 2 * b * s * h * shape.vocab,
      1);
  // Recomputing every saved tensor costs the block's forward but its last
  // product (whose output is the next block's input, kept).
  double recompute = 0;
  for (const SavedTensor& tensor : counts.block_tensors) {
    recompute += tensor.recompute_flops;
  }
  EXPECT_NEAR(recompute, counts.block_forward_flops - 2 * b * s * h * 4 * h,
              1e3);
}

}  // namespace
}  // namespace lohan
