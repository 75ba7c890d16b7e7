#ifndef LOHAN_PLAN_MODEL_SHAPE_H_
#define LOHAN_PLAN_MODEL_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lohan {

// The shape of a decoder-only transformer, as much as the planner needs:
// enough to count its parameters, its FLOPs and the tensors autograd saves
// in each block.
struct ModelShape {
  enum class Family {
    // GPT-2/GPT-3/OPT: LayerNorm with bias, biased projections, a GELU MLP
    // of two matrices, learned positions, the head tied to the embedding.
    kGpt,
    // Llama: RMSNorm, no biases, rotary positions, a gated SiLU MLP of
    // three matrices, grouped-query attention, an untied head.
    kLlama,
  };
  std::string name;
  Family family = Family::kGpt;
  uint64_t layers = 0;
  uint64_t hidden = 0;
  uint64_t heads = 0;
  uint64_t kv_heads = 0;  // = heads unless grouped-query attention
  uint64_t ffn = 0;       // the MLP's inner width
  uint64_t vocab = 0;
  uint64_t max_positions = 0;  // learned positions (kGpt); 0 for kLlama
  // Rows of the position table beyond max_positions (OPT keeps 2).
  uint64_t position_offset = 0;
  // The head shares the token embedding's matrix (GPT-2, OPT; Llama's is
  // its own unless its config ties them).
  bool tied_embeddings = true;
  // The final norm is registered before the blocks (OPT's decoder): the
  // plugin, which cuts a model in module order, trains it in one layer
  // with the embeddings (see ModelCounts::layer_elements).
  bool final_norm_before_blocks = false;

  uint64_t head_dim() const { return hidden / heads; }
  // Width of K (and of V): kv_heads x head_dim.
  uint64_t kv_width() const { return kv_heads * head_dim(); }
};

// INVALID_ARGUMENT naming the field when a size is zero or out of range,
// or heads do not divide hidden, or kv_heads do not divide heads.
absl::Status ValidateShape(const ModelShape& shape);

// The presets `lohanctl plan --model` knows by name.
std::vector<std::string> PresetNames();
// NOT_FOUND listing the presets for an unknown name.
absl::StatusOr<ModelShape> PresetShape(absl::string_view name);

// A Hugging Face config.json (GPT-2, OPT, GPT-NeoX-less: the keys of
// GPT2Config, OPTConfig or LlamaConfig and look-alikes): INVALID_ARGUMENT
// naming what is missing or malformed.
absl::StatusOr<ModelShape> ShapeFromHfConfig(absl::string_view json,
                                             absl::string_view name);

}  // namespace lohan

#endif  // LOHAN_PLAN_MODEL_SHAPE_H_
