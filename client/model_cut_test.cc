// CutModel on descriptions written as a plugin sends them (protobuf JSON):
// the layers, the groups' element ranges, a rank's shards, and each
// refusal. (tests/python and plugins/libtorch train through it.)
#include "client/model_cut.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/model_cut.pb.h"
#include "spec/model_spec_checks.h"

namespace lohan {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A description whose spec has nothing but a dtype (every other setting's
// default passes).
v1::ModelDescription WithSettings() {
  v1::ModelDescription model;
  model.mutable_spec()->set_dtype(v1::DTYPE_BF16);
  return model;
}

// A small GPT: tokens (tied to the head) and positions before the blocks,
// two blocks of a 4x4 weight and a bias each, a norm after them; a scale
// shared by both blocks; block 2 frozen.
constexpr char kModel[] = R"json(
  "blocks": 3,
  "parameters": [
    {"name": "tok.weight", "aliases": ["head.weight"], "shape": [10, 4]},
    {"name": "pos.weight", "shape": [8, 4]},
    {"name": "blocks.0.fc.weight", "shape": [4, 4], "blocks": [0]},
    {"name": "blocks.0.fc.bias", "shape": [4], "blocks": [0]},
    {"name": "shared.scale", "shape": [1], "blocks": [0, 1],
     "after_blocks": true},
    {"name": "blocks.1.fc.weight", "shape": [4, 4], "blocks": [1]},
    {"name": "blocks.1.fc.bias", "shape": [4], "blocks": [1]},
    {"name": "ln_f.weight", "shape": [4], "after_blocks": true},
    {"name": "ln_f.bias", "shape": [4], "after_blocks": true}
  ],
  "untrained": ["blocks.2.fc.weight"],
  "spec": {"dtype": "DTYPE_BF16", "adam": {"lr": 0.01, "weight_decay": 0.1},
           "layer_elements": [99], "commit_interval": 4}
)json";

absl::StatusOr<v1::ModelCut> Cut(const std::string& extra = "") {
  v1::ModelDescription model;
  const std::string json = absl::StrCat("{", kModel, extra, "}");
  absl::Status parsed = FromJson(json.c_str(), "ModelDescription", &model);
  if (!parsed.ok()) return parsed;
  return CutModel(model);
}

std::vector<std::string> Ranges(const v1::ParamGroup& group) {
  std::vector<std::string> ranges;
  for (const v1::ElementRange& range : group.ranges()) {
    ranges.push_back(
        absl::StrCat(range.layer(), ":", range.begin(), "-", range.end()));
  }
  return ranges;
}

TEST(CutModel, RestLayersFirstThenOneLayerPerBlock) {
  absl::StatusOr<v1::ModelCut> cut = Cut();
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_EQ(cut->layers_size(), 4);  // block 2 has nothing trained
  const v1::CutLayer& before = cut->layers(0);
  EXPECT_EQ(before.block(), -1);
  EXPECT_THAT(before.parameters(), ElementsAre(0, 1));
  EXPECT_THAT(before.offsets(), ElementsAre(0, 40));
  EXPECT_EQ(before.elements(), 72u);
  // The scale both blocks share goes to a rest layer, here the one after.
  const v1::CutLayer& after = cut->layers(1);
  EXPECT_EQ(after.block(), -1);
  EXPECT_THAT(after.parameters(), ElementsAre(4, 7, 8));
  EXPECT_THAT(after.offsets(), ElementsAre(0, 1, 5));
  EXPECT_EQ(cut->layers(2).block(), 0);
  EXPECT_THAT(cut->layers(2).parameters(), ElementsAre(2, 3));
  EXPECT_EQ(cut->layers(3).block(), 1);
  EXPECT_EQ(cut->layers(3).elements(), 20u);
  // The spec is the description's with the layers filled in.
  EXPECT_THAT(cut->spec().layer_elements(), ElementsAre(72, 9, 20, 20));
  ASSERT_EQ(cut->spec().layer_places_size(), 4);
  EXPECT_EQ(cut->spec().layer_places(1).block(), -1);
  EXPECT_EQ(cut->spec().layer_places(3).block(), 1);
  EXPECT_EQ(cut->spec().layer_places(3).unit(), 0u);
  EXPECT_EQ(cut->spec().dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(cut->spec().commit_interval(), 4u);
  EXPECT_EQ(cut->spec().param_groups_size(), 0);
}

TEST(CutModel, GroupsBecomeMergedElementRangesAndGroupsWinOverTheRule) {
  absl::StatusOr<v1::ModelCut> cut = Cut(R"json(,
    "no_weight_decay_1d": true,
    "no_weight_decay": ["pos.weight"],
    "param_groups": [
      {"params": ["blocks.1.fc.weight", "blocks.1.fc.bias"], "lr": 0.001},
      {"params": ["head.weight", "ln_f.bias"], "lr": 0.03,
       "weight_decay": 0.3}
    ])json");
  ASSERT_TRUE(cut.ok()) << cut.status();
  const v1::ModelSpec& spec = cut->spec();
  ASSERT_EQ(spec.param_groups_size(), 3);
  const v1::ParamGroup& exempt = spec.param_groups(0);
  EXPECT_EQ(exempt.name(), "no_weight_decay");
  EXPECT_EQ(exempt.lr_scale(), 1.0);
  EXPECT_EQ(exempt.weight_decay(), 0.0);
  // pos.weight by name; the 1-d ones but for the grouped bias and ln_f.bias;
  // the scale and ln_f.weight adjacent in layer 1: one range.
  EXPECT_THAT(Ranges(exempt), ElementsAre("0:40-72", "1:0-5", "2:16-20"));
  EXPECT_EQ(spec.param_groups(1).name(), "param_groups[0]");
  EXPECT_DOUBLE_EQ(spec.param_groups(1).lr_scale(), 0.1);
  EXPECT_EQ(spec.param_groups(1).weight_decay(), 0.1);  // the job's
  EXPECT_THAT(Ranges(spec.param_groups(1)), ElementsAre("3:0-20"));
  // By an alias (the tied head is tok.weight).
  EXPECT_DOUBLE_EQ(spec.param_groups(2).lr_scale(), 3.0);
  EXPECT_EQ(spec.param_groups(2).weight_decay(), 0.3);
  EXPECT_THAT(Ranges(spec.param_groups(2)), ElementsAre("0:0-40", "1:5-9"));
}

TEST(CutModel, ARanksShardsHoldItsPartOfEveryRange) {
  absl::StatusOr<v1::ModelCut> cut =
      Cut(R"json(, "world": 2, "rank": 1, "no_weight_decay_1d": true)json");
  ASSERT_TRUE(cut.ok()) << cut.status();
  // Shards of ceil(elements / 2); the layers keep their whole layout.
  EXPECT_THAT(cut->spec().layer_elements(), ElementsAre(36, 5, 10, 10));
  EXPECT_EQ(cut->layers(1).elements(), 9u);
  // Layer 1's [0, 9) from rank 1's shard [5, 10): [0, 4); block 0's bias
  // [16, 20) is [6, 10) of its shard [10, 20).
  EXPECT_THAT(Ranges(cut->spec().param_groups(0)),
              ElementsAre("1:0-4", "2:6-10", "3:6-10"));
}

TEST(CutModel, BadDescriptionsAreRefusedNamingWhatIsWrong) {
  auto refusal = [](const std::string& extra) {
    absl::StatusOr<v1::ModelCut> cut = Cut(extra);
    EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(cut.status().message());
  };
  EXPECT_EQ(refusal(R"(, "param_groups": [{"params": ["ln_f.weight"]},
                                          {"params": ["blocks.9.w"]}])"),
            "param_groups[1] names \"blocks.9.w\", which the model does not "
            "have (see its named_parameters())");
  EXPECT_EQ(
      refusal(R"(, "param_groups": [{"params": ["blocks.2.fc.weight"]}])"),
      "param_groups[0] names \"blocks.2.fc.weight\", a parameter the "
      "engine does not train (requires_grad is false)");
  EXPECT_EQ(refusal(R"(, "param_groups": [{"params": ["tok.weight"]},
                                          {"params": ["head.weight"]}])"),
            "param_groups[0] and param_groups[1] both hold tok.weight; a "
            "parameter may be in one group only");
  EXPECT_THAT(refusal(R"(, "param_groups": [{"params": [], "lr": -1}])"),
              HasSubstr("must be finite and >= 0"));
  EXPECT_THAT(refusal(R"(, "no_weight_decay": ["ln_f.wieght"])"),
              HasSubstr("no_weight_decay names \"ln_f.wieght\", which the "
                        "model does not have"));
  // An untrained parameter among the exemptions is nothing to exempt.
  EXPECT_TRUE(Cut(R"(, "no_weight_decay": ["blocks.2.fc.weight"])").ok());

  // The descriptions below have a spec whose settings pass: what each
  // refusal names is the description's.
  v1::ModelDescription empty = WithSettings();
  EXPECT_THAT(CutModel(empty).status().message(),
              HasSubstr("no trainable parameters"));
  v1::ModelDescription zero_lr = WithSettings();
  zero_lr.add_parameters()->set_name("w");
  zero_lr.add_param_groups()->set_lr(0.5);
  EXPECT_THAT(CutModel(zero_lr).status().message(),
              HasSubstr("the job's lr is 0"));
  v1::ModelDescription huge_unit = WithSettings();
  v1::DescribedParameter& in_unit = *huge_unit.add_parameters();
  in_unit.set_name("blocks.0.w");
  in_unit.add_blocks(0);
  in_unit.set_unit(4097);
  huge_unit.set_blocks(1);
  EXPECT_THAT(CutModel(huge_unit).status().message(),
              HasSubstr("blocks.0.w is in unit 4097 of its block"));
  v1::ModelDescription outside = WithSettings();
  outside.add_parameters()->add_blocks(1);
  outside.set_blocks(1);
  EXPECT_THAT(CutModel(outside).status().message(),
              HasSubstr("in block 1 of 1"));
}

// The spec's settings are checked first, by the rules lohand runs
// (spec/model_spec_checks.h), the refusal carrying the field; the spec the
// cut makes passes CheckModelSpec whole.
TEST(CutModel, SpecsAreCheckedAsLohandChecksThem) {
  v1::ModelDescription model = WithSettings();
  model.add_parameters()->add_shape(4);
  ASSERT_TRUE(CutModel(model).ok());
  model.mutable_spec()->mutable_adam()->set_eps(-1);
  const absl::Status refused = CutModel(model).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RefusedField(refused), "adam.eps");
  model.mutable_spec()->clear_adam();
  model.mutable_spec()->clear_dtype();
  EXPECT_EQ(RefusedField(CutModel(model).status()), "dtype");
  model.mutable_spec()->set_dtype(v1::DTYPE_FP32);
  model.mutable_parameters(0)->set_shape(0, uint64_t{1} << 41);
  EXPECT_EQ(RefusedField(CutModel(model).status()), "layer_elements[0]");
}

// Units: per block its own layer (the parameters in unit 0), then one layer
// per unit in unit order; an empty unit leaves no layer, and a unit given
// to a parameter outside a block changes nothing.
TEST(CutModel, BlocksSplitIntoTheirUnitsInUnitOrder) {
  v1::ModelDescription model = WithSettings();
  model.set_blocks(2);
  auto add = [&](const std::string& name, int64_t elements, int block,
                 uint32_t unit) {
    v1::DescribedParameter& parameter = *model.add_parameters();
    parameter.set_name(name);
    parameter.add_shape(elements);
    if (block >= 0) parameter.add_blocks(block);
    parameter.set_unit(unit);
  };
  add("embed", 8, -1, 3);
  add("blocks.0.mlp.w", 6, 0, 2);
  add("blocks.0.norm", 2, 0, 0);
  add("blocks.0.attn.w", 4, 0, 1);
  add("blocks.0.attn.b", 1, 0, 1);
  add("blocks.1.mlp.w", 6, 1, 3);  // units 0-2 of block 1 are empty
  absl::StatusOr<v1::ModelCut> cut = CutModel(model);
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_EQ(cut->layers_size(), 5);
  EXPECT_EQ(cut->layers(0).block(), -1);
  EXPECT_THAT(cut->layers(0).parameters(), ElementsAre(0));
  std::vector<std::string> layers;
  for (int l = 1; l < cut->layers_size(); ++l) {
    const v1::CutLayer& layer = cut->layers(l);
    layers.push_back(absl::StrCat(layer.block(), "/", layer.unit(), ":",
                                  absl::StrJoin(layer.parameters(), ","), "@",
                                  absl::StrJoin(layer.offsets(), ",")));
  }
  EXPECT_THAT(layers,
              ElementsAre("0/0:2@0", "0/1:3,4@0,4", "0/2:1@0", "1/3:5@0"));
  EXPECT_THAT(cut->spec().layer_elements(), ElementsAre(8, 2, 5, 6, 6));
  // The spec says where each layer lies, as the layers do: lohand's
  // planner reads the weight unit from it.
  std::vector<std::string> places;
  for (const v1::LayerPlace& place : cut->spec().layer_places()) {
    places.push_back(absl::StrCat(place.block(), "/", place.unit()));
  }
  EXPECT_THAT(places, ElementsAre("-1/0", "0/0", "0/1", "0/2", "1/3"));
}

}  // namespace
}  // namespace lohan
