#include "plan/model_shape.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

TEST(ModelShape, EveryPresetIsValid) {
  ASSERT_GE(PresetNames().size(), 7u);
  for (const std::string& name : PresetNames()) {
    absl::StatusOr<ModelShape> shape = PresetShape(name);
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_TRUE(ValidateShape(*shape).ok()) << name;
  }
  absl::StatusOr<ModelShape> missing = PresetShape("gpt-9000b");
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(missing.status().message(), HasSubstr("gpt-175b"));
}

TEST(ModelShape, ReadsAGpt2Config) {
  // GPT-2 small's config.json, as transformers writes it (abridged).
  absl::StatusOr<ModelShape> shape = ShapeFromHfConfig(R"({
      "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
      "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": null,
      "n_layer": 12, "n_positions": 1024, "vocab_size": 50257,
      "layer_norm_epsilon": 1e-05})",
                                                       "gpt2");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->family, ModelShape::Family::kGpt);
  EXPECT_EQ(shape->layers, 12u);
  EXPECT_EQ(shape->hidden, 768u);
  EXPECT_EQ(shape->heads, 12u);
  EXPECT_EQ(shape->kv_heads, 12u);
  EXPECT_EQ(shape->ffn, 4u * 768);
  EXPECT_EQ(shape->max_positions, 1024u);
}

TEST(ModelShape, ReadsALlamaConfigWithGroupedQueryAttention) {
  absl::StatusOr<ModelShape> shape = ShapeFromHfConfig(R"({
      "model_type": "llama", "hidden_size": 8192,
      "intermediate_size": 28672, "num_attention_heads": 64,
      "num_hidden_layers": 80, "num_key_value_heads": 8,
      "vocab_size": 32000, "max_position_embeddings": 4096})",
                                                       "llama-2-70b");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->family, ModelShape::Family::kLlama);
  EXPECT_EQ(shape->kv_width(), 1024u);
  EXPECT_EQ(shape->ffn, 28672u);
  EXPECT_EQ(shape->max_positions, 0u);  // rotary
}

TEST(ModelShape, TiedHeadsAndOptsPositionOffsetComeFromTheConfig) {
  absl::StatusOr<ModelShape> llama = ShapeFromHfConfig(R"({
      "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
      "num_hidden_layers": 2, "vocab_size": 100,
      "tie_word_embeddings": true})",
                                                       "tied");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_TRUE(llama->tied_embeddings);
  absl::StatusOr<ModelShape> opt = ShapeFromHfConfig(R"({
      "model_type": "opt", "hidden_size": 64, "num_attention_heads": 4,
      "num_hidden_layers": 2, "vocab_size": 100, "ffn_dim": 256,
      "max_position_embeddings": 64, "word_embed_proj_dim": 64})",
                                                     "opt");
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ(opt->position_offset, 2u);
  EXPECT_EQ(opt->ffn, 256u);
  EXPECT_TRUE(opt->tied_embeddings);
  EXPECT_FALSE(PresetShape("llama-7b")->tied_embeddings);
}

TEST(ModelShape, BadConfigsSayWhatIsWrong) {
  struct Case {
    const char* json;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"not json", "not a JSON object"},
           {R"({"n_embd": 768, "n_head": 12, "vocab_size": 5})",
            "num_hidden_layers, n_layer"},
           {R"({"n_layer": 2.5, "n_embd": 768, "n_head": 12,
                "vocab_size": 5})",
            "\"n_layer\" must be a whole number"},
           {R"({"n_layer": "12", "n_embd": 768, "n_head": 12,
                "vocab_size": 5})",
            "\"n_layer\" must be a whole number"},
           {R"({"n_layer": 100000, "n_embd": 768, "n_head": 12,
                "vocab_size": 5})",
            "layers must be from 1 to 65536, got 100000"},
           {R"({"n_layer": 2, "n_embd": 768, "n_head": 12,
                "vocab_size": 1000000000})",
            "vocab must be from 1 to 16777216"},
           {R"({"n_layer": 2, "n_embd": 768, "n_head": 10,
                "vocab_size": 5})",
            "10 heads do not divide hidden size 768"},
           {R"({"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 5,
                "tie_word_embeddings": "yes"})",
            "\"tie_word_embeddings\" must be true or false"},
           {R"({"model_type": "opt", "num_hidden_layers": 2,
                "hidden_size": 64, "num_attention_heads": 4,
                "word_embed_proj_dim": 32, "vocab_size": 5})",
            "word_embed_proj_dim other than hidden_size"},
           {R"({"model_type": "llama", "num_hidden_layers": 2,
                "hidden_size": 64, "num_attention_heads": 8,
                "num_key_value_heads": 3, "vocab_size": 5})",
            "3 key/value heads do not divide 8 heads"},
       }) {
    absl::StatusOr<ModelShape> shape = ShapeFromHfConfig(c.json, "bad");
    EXPECT_TRUE(absl::IsInvalidArgument(shape.status())) << c.json;
    EXPECT_THAT(shape.status().message(), HasSubstr(c.says)) << c.json;
  }
}

}  // namespace
}  // namespace lohan
