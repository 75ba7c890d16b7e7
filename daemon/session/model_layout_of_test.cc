#include "daemon/session/model_layout_of.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/model_spec_checks.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

v1::ModelSpec Spec(v1::DType dtype) {
  v1::ModelSpec spec;
  spec.add_layer_elements(100);
  spec.add_layer_elements(50);
  spec.set_dtype(dtype);
  v1::AdamSpec* adam = spec.mutable_adam();
  adam->set_lr(1e-3);
  adam->set_beta1(0.8);
  adam->set_beta2(0.99);
  adam->set_eps(1e-6);
  adam->set_weight_decay(0.1);
  adam->set_decoupled_weight_decay(true);
  adam->set_amsgrad(true);
  adam->set_bf16_moments(true);
  return spec;
}

void AddGroup(v1::ModelSpec& spec, const std::string& name, double lr_scale,
              double weight_decay, uint32_t layer, uint64_t begin,
              uint64_t end) {
  v1::ParamGroup* group = spec.add_param_groups();
  group->set_name(name);
  group->set_lr_scale(lr_scale);
  group->set_weight_decay(weight_decay);
  v1::ElementRange* range = group->add_ranges();
  range->set_layer(layer);
  range->set_begin(begin);
  range->set_end(end);
}

TEST(ModelLayoutOf, TakesEveryFieldOfTheSpec) {
  v1::ModelSpec spec = Spec(v1::DTYPE_FP16);
  spec.set_chunk_elements(64);
  ASSERT_TRUE(CheckModelSpec(spec).ok());
  absl::StatusOr<ModelLayout> layout = ModelLayoutOf(spec);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->layer_elements, (std::vector<uint64_t>{100, 50}));
  EXPECT_EQ(layout->chunk_elements, 64u);
  EXPECT_EQ(layout->grad_dtype, DType::kFloat16);
  EXPECT_EQ(layout->weight16_dtype, DType::kFloat16);
  EXPECT_EQ(layout->moment_dtype, DType::kBFloat16);
  EXPECT_DOUBLE_EQ(layout->adam.lr, 1e-3);
  EXPECT_DOUBLE_EQ(layout->adam.beta1, 0.8);
  EXPECT_DOUBLE_EQ(layout->adam.beta2, 0.99);
  EXPECT_DOUBLE_EQ(layout->adam.eps, 1e-6);
  EXPECT_DOUBLE_EQ(layout->adam.weight_decay, 0.1);
  EXPECT_TRUE(layout->adam.decoupled_weight_decay);
  EXPECT_TRUE(layout->adam.amsgrad);
  EXPECT_TRUE(layout->groups.empty());
}

TEST(ModelLayoutOf, Fp32KeepsNoSixteenBitCopyAndTheDefaultChunk) {
  v1::ModelSpec spec = Spec(v1::DTYPE_FP32);
  spec.mutable_adam()->set_bf16_moments(false);
  absl::StatusOr<ModelLayout> layout = ModelLayoutOf(spec);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->grad_dtype, DType::kFloat32);
  EXPECT_EQ(layout->weight16_dtype, DType::kBFloat16);
  EXPECT_EQ(layout->moment_dtype, DType::kFloat32);
  EXPECT_EQ(layout->chunk_elements, kDefaultChunkElements);
}

TEST(ModelLayoutOf, GroupsKeepTheirNamesAndValues) {
  v1::ModelSpec spec = Spec(v1::DTYPE_BF16);
  AddGroup(spec, "no_weight_decay", 1.0, 0.0, 0, 0, 10);
  AddGroup(spec, "", 0.5, 0.2, 1, 0, 50);
  absl::StatusOr<ModelLayout> layout = ModelLayoutOf(spec);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->groups.size(), 2u);
  EXPECT_EQ(layout->groups[0].name, "no_weight_decay");
  EXPECT_DOUBLE_EQ(layout->groups[0].weight_decay, 0.0);
  EXPECT_EQ(layout->groups[1].name, "param_groups[1]");
  EXPECT_DOUBLE_EQ(layout->groups[1].lr_scale, 0.5);
  EXPECT_DOUBLE_EQ(layout->groups[1].weight_decay, 0.2);
}

TEST(ModelLayoutOf, RefusalsNameTheGroups) {
  v1::ModelSpec overlapping = Spec(v1::DTYPE_BF16);
  AddGroup(overlapping, "no_weight_decay", 1.0, 0.0, 0, 0, 10);
  AddGroup(overlapping, "", 2.0, 0.0, 0, 5, 15);
  absl::Status status = ModelLayoutOf(overlapping).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("param_groups[1] range [5, 15) of layer 0 overlaps "
                        "[0, 10) (no_weight_decay)"));
  v1::ModelSpec outside = Spec(v1::DTYPE_BF16);
  AddGroup(outside, "bias", 1.0, 0.0, 2, 0, 1);
  EXPECT_THAT(ModelLayoutOf(outside).status().message(),
              HasSubstr("bias range 0 (layer 2, [0, 1)): the model has 2 "
                        "layers"));
}

}  // namespace
}  // namespace lohan
