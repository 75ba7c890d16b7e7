#include "plan/model_shape.h"

#include <cmath>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace lohan {
namespace {

using Family = ModelShape::Family;

ModelShape Gpt(const char* name, uint64_t layers, uint64_t hidden,
               uint64_t heads) {
  return ModelShape{.name = name,
                    .family = Family::kGpt,
                    .layers = layers,
                    .hidden = hidden,
                    .heads = heads,
                    .kv_heads = heads,
                    .ffn = 4 * hidden,
                    .vocab = 50257,
                    .max_positions = 2048};
}

ModelShape Llama(const char* name, uint64_t layers, uint64_t hidden,
                 uint64_t heads, uint64_t kv_heads, uint64_t ffn) {
  return ModelShape{.name = name,
                    .family = Family::kLlama,
                    .layers = layers,
                    .hidden = hidden,
                    .heads = heads,
                    .kv_heads = kv_heads,
                    .ffn = ffn,
                    .vocab = 32000,
                    .max_positions = 0,
                    .tied_embeddings = false};
}

// The GPT shapes of the GPT-3 and OPT papers (1.3B: OPT's 32 heads of 64)
// and of the LoHan paper's 70B; Llama 2's 7B and 70B.
const std::vector<ModelShape>& Presets() {
  static const auto* presets = new std::vector<ModelShape>{
      Gpt("gpt-1.3b", 24, 2048, 32),
      Gpt("gpt-13b", 40, 5120, 40),
      Gpt("gpt-30b", 48, 7168, 56),
      Gpt("gpt-70b", 80, 8192, 64),
      Gpt("gpt-175b", 96, 12288, 96),
      Llama("llama-7b", 32, 4096, 32, 32, 11008),
      Llama("llama-70b", 80, 8192, 64, 8, 28672),
  };
  return *presets;
}

// A whole, positive number under `key` (the first of `keys` present).
absl::StatusOr<std::optional<uint64_t>> Count(
    const google::protobuf::Struct& config,
    const std::vector<const char*>& keys) {
  for (const char* key : keys) {
    auto found = config.fields().find(key);
    if (found == config.fields().end() ||
        found->second.kind_case() == google::protobuf::Value::kNullValue) {
      continue;
    }
    const google::protobuf::Value& value = found->second;
    if (value.kind_case() != google::protobuf::Value::kNumberValue ||
        value.number_value() < 1 || value.number_value() > 1e9 ||
        value.number_value() != std::floor(value.number_value())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: \"", key, "\" must be a whole number from 1 to 10^9"));
    }
    return std::optional<uint64_t>(static_cast<uint64_t>(value.number_value()));
  }
  return std::optional<uint64_t>();
}

absl::StatusOr<uint64_t> Required(const google::protobuf::Struct& config,
                                  const std::vector<const char*>& keys) {
  absl::StatusOr<std::optional<uint64_t>> value = Count(config, keys);
  if (!value.ok()) return value.status();
  if (!value->has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json has none of ", absl::StrJoin(keys, ", "),
                     " (a decoder-only transformer's config is needed)"));
  }
  return **value;
}

}  // namespace

absl::Status ValidateShape(const ModelShape& shape) {
  // Bounds well past any model (and lohand's 65,536 layers), so that every
  // count stays exact in 64 bits and the search stays short.
  struct Bound {
    const char* field;
    uint64_t value, most;
  };
  for (const Bound& bound : {Bound{"layers", shape.layers, 1 << 16},
                             Bound{"hidden", shape.hidden, 1 << 20},
                             Bound{"heads", shape.heads, 1 << 16},
                             Bound{"kv_heads", shape.kv_heads, 1 << 16},
                             Bound{"ffn", shape.ffn, 1 << 22},
                             Bound{"vocab", shape.vocab, 1 << 24}}) {
    if (bound.value == 0 || bound.value > bound.most) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", shape.name, ": ", bound.field, " must be from 1 to ",
          bound.most, ", got ", bound.value));
    }
  }
  if (shape.max_positions > (uint64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", shape.name, ": max_positions must be at most ",
                     uint64_t{1} << 24, ", got ", shape.max_positions));
  }
  if (shape.hidden % shape.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", shape.name, ": ", shape.heads,
                     " heads do not divide hidden size ", shape.hidden));
  }
  if (shape.heads % shape.kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", shape.name, ": ", shape.kv_heads,
                     " key/value heads do not divide ", shape.heads, " heads"));
  }
  return absl::OkStatus();
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const ModelShape& shape : Presets()) names.push_back(shape.name);
  return names;
}

absl::StatusOr<ModelShape> PresetShape(absl::string_view name) {
  for (const ModelShape& shape : Presets()) {
    if (shape.name == name) return shape;
  }
  return absl::NotFoundError(
      absl::StrCat("no preset model '", name,
                   "'; presets: ", absl::StrJoin(PresetNames(), ", ")));
}

absl::StatusOr<ModelShape> ShapeFromHfConfig(absl::string_view json,
                                             absl::string_view name) {
  google::protobuf::Struct config;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(std::string(json), &config);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json is not a JSON object: ", std::string(parsed.message())));
  }
  std::string model_type;
  if (auto found = config.fields().find("model_type");
      found != config.fields().end()) {
    model_type = found->second.string_value();
  }
  ModelShape shape;
  shape.name = std::string(name);
  shape.family =
      model_type == "llama" || model_type == "mistral" || model_type == "qwen2"
          ? Family::kLlama
          : Family::kGpt;
  absl::StatusOr<uint64_t> layers =
      Required(config, {"num_hidden_layers", "n_layer", "num_layers"});
  absl::StatusOr<uint64_t> hidden =
      Required(config, {"hidden_size", "n_embd", "d_model"});
  absl::StatusOr<uint64_t> heads =
      Required(config, {"num_attention_heads", "n_head"});
  absl::StatusOr<uint64_t> vocab = Required(config, {"vocab_size"});
  for (const absl::StatusOr<uint64_t>* value :
       {&layers, &hidden, &heads, &vocab}) {
    if (!value->ok()) return value->status();
  }
  shape.layers = *layers;
  shape.hidden = *hidden;
  shape.heads = *heads;
  shape.vocab = *vocab;
  absl::StatusOr<std::optional<uint64_t>> kv =
      Count(config, {"num_key_value_heads"});
  absl::StatusOr<std::optional<uint64_t>> ffn =
      Count(config, {"intermediate_size", "n_inner", "ffn_dim"});
  absl::StatusOr<std::optional<uint64_t>> positions =
      Count(config, {"max_position_embeddings", "n_positions"});
  for (const auto* value : {&kv, &ffn, &positions}) {
    if (!value->ok()) return value->status();
  }
  shape.kv_heads = kv->value_or(shape.heads);
  shape.ffn = ffn->value_or(4 * shape.hidden);
  shape.max_positions =
      shape.family == Family::kGpt ? positions->value_or(2048) : 0;
  // OPT's learned positions have 2 rows more (its offset).
  shape.position_offset = model_type == "opt" ? 2 : 0;
  shape.final_norm_before_blocks = model_type == "opt";
  shape.tied_embeddings = shape.family == Family::kGpt;
  if (auto tied = config.fields().find("tie_word_embeddings");
      tied != config.fields().end()) {
    if (tied->second.kind_case() != google::protobuf::Value::kBoolValue) {
      return absl::InvalidArgumentError(
          "config.json: \"tie_word_embeddings\" must be true or false");
    }
    shape.tied_embeddings = tied->second.bool_value();
  }
  if (auto projection = config.fields().find("word_embed_proj_dim");
      projection != config.fields().end() &&
      projection->second.number_value() != static_cast<double>(*hidden)) {
    return absl::InvalidArgumentError(
        "config.json: word_embed_proj_dim other than hidden_size (OPT-350m's "
        "projections) is not modelled");
  }
  if (absl::Status valid = ValidateShape(shape); !valid.ok()) return valid;
  return shape;
}

}  // namespace lohan
