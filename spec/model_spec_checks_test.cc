#include "spec/model_spec_checks.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

v1::ModelSpec Good() {
  v1::ModelSpec spec;
  spec.add_layer_elements(100);
  spec.set_dtype(v1::DTYPE_BF16);
  spec.mutable_adam()->set_lr(1e-3);
  spec.mutable_adam()->set_beta1(0.9);
  spec.mutable_adam()->set_beta2(0.999);
  spec.mutable_adam()->set_eps(1e-8);
  return spec;
}

struct Case {
  const char* what;
  std::function<void(v1::ModelSpec&)> mutate;
  const char* message;
  const char* field;  // RefusedField's
};

TEST(CheckModelSpec, AcceptsAGoodSpec) {
  EXPECT_TRUE(CheckModelSpec(Good()).ok());
}

TEST(CheckModelSpec, AcceptsNamedGroupsAndFitting) {
  v1::ModelSpec spec = Good();
  spec.add_param_groups()->set_name("no_weight_decay");
  spec.set_arena_fit(v1::ARENA_FIT_MOST);
  spec.set_grad_slots(4);
  spec.set_weight_slots(4);
  EXPECT_TRUE(CheckModelSpec(spec).ok());
}

TEST(CheckModelSpec, AcceptsLayerPlacesOnePerLayerOrNone) {
  v1::ModelSpec spec = Good();
  spec.add_layer_elements(50);
  spec.add_layer_elements(50);
  spec.add_layer_places()->set_block(-1);
  v1::LayerPlace& own = *spec.add_layer_places();
  own.set_block(0);
  v1::LayerPlace& unit = *spec.add_layer_places();
  unit.set_block(0);
  unit.set_unit(1);
  EXPECT_TRUE(CheckModelSpec(spec).ok());
}

// The model part alone: its settings are the caller's, judged before.
TEST(CheckModelShape, JudgesTheShapeNotTheSettings) {
  v1::ModelSpec spec = Good();
  spec.mutable_adam()->set_eps(-1);
  EXPECT_FALSE(CheckModelSpec(spec).ok());
  EXPECT_TRUE(CheckModelShape(spec).ok());
  spec.add_layer_elements(0);
  const absl::Status refused = CheckModelShape(spec);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_EQ(RefusedField(refused), "layer_elements[1]") << refused;
  spec.clear_layer_elements();
  spec.add_layer_elements(10);
  spec.add_param_groups()->set_name(std::string("bad\n"));
  EXPECT_EQ(RefusedField(CheckModelShape(spec)), "param_groups[0].name");
}

TEST(CheckModelSpec, RefusesEachBadFieldByName) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const Case cases[] = {
      {"no layers", [](auto& s) { s.clear_layer_elements(); },
       "a model has 1 to 65536 layers, got 0", "layer_elements"},
      {"too many layers",
       [](auto& s) {
         for (int i = 0; i < 70000; ++i) s.add_layer_elements(1);
       },
       "got 70001", "layer_elements"},
      {"empty layer", [](auto& s) { s.add_layer_elements(0); },
       "layer_elements[1] must be 1 to", "layer_elements[1]"},
      {"huge layer", [](auto& s) { s.add_layer_elements(uint64_t{1} << 41); },
       "layer_elements[1]", "layer_elements[1]"},
      {"dtype", [](auto& s) { s.set_dtype(v1::DTYPE_UNSPECIFIED); },
       "ModelSpec dtype DTYPE_UNSPECIFIED is not supported", "dtype"},
      {"unknown dtype", [](auto& s) { s.set_dtype(static_cast<v1::DType>(9)); },
       "ModelSpec dtype 9 is not supported", "dtype"},
      {"nan lr", [nan](auto& s) { s.mutable_adam()->set_lr(nan); },
       "adam.lr must be finite", "adam.lr"},
      {"negative lr", [](auto& s) { s.mutable_adam()->set_lr(-1); }, "adam.lr",
       "adam.lr"},
      {"beta1 1", [](auto& s) { s.mutable_adam()->set_beta1(1.0); },
       "adam.beta1 must be in [0, 1)", "adam.beta1"},
      {"beta2 nan", [nan](auto& s) { s.mutable_adam()->set_beta2(nan); },
       "adam.beta2", "adam.beta2"},
      {"eps inf", [inf](auto& s) { s.mutable_adam()->set_eps(inf); },
       "adam.eps", "adam.eps"},
      {"decay", [](auto& s) { s.mutable_adam()->set_weight_decay(-0.1); },
       "adam.weight_decay", "adam.weight_decay"},
      {"norm", [](auto& s) { s.set_max_grad_norm(-1); }, "max_grad_norm",
       "max_grad_norm"},
      {"schedule",
       [](auto& s) { s.set_clip_schedule(static_cast<v1::ClipSchedule>(7)); },
       "clip_schedule 7", "clip_schedule"},
      {"iteration", [](auto& s) { s.set_initial_iteration(uint64_t{1} << 50); },
       "initial_iteration must be at most", "initial_iteration"},
      {"commit interval", [](auto& s) { s.set_commit_interval(1000001); },
       "commit_interval must be at most 1000000", "commit_interval"},
      {"interval with redo-all",
       [](auto& s) {
         s.set_commit_interval(2);
         s.set_clip_schedule(v1::CLIP_SCHEDULE_REDO_ALL);
       },
       "commit_interval above 1 needs clip_schedule deferred",
       "commit_interval"},
      {"durable every, negative",
       [](auto& s) { s.set_durable_every_seconds(-1); },
       "durable_every_seconds must be from 0", "durable_every_seconds"},
      {"durable every, NaN",
       [](auto& s) { s.set_durable_every_seconds(std::nan("")); },
       "durable_every_seconds must be from 0", "durable_every_seconds"},
      {"durable every, absurd",
       [](auto& s) { s.set_durable_every_seconds(1e9); },
       "durable_every_seconds must be from 0", "durable_every_seconds"},
      {"both durability forms",
       [](auto& s) {
         s.set_durable_every_seconds(60);
         s.set_commit_interval(4);
       },
       "by steps or by time, not both", "durable_every_seconds"},
      {"durable every with redo-all",
       [](auto& s) {
         s.set_durable_every_seconds(60);
         s.set_clip_schedule(v1::CLIP_SCHEDULE_REDO_ALL);
       },
       "durable_every_seconds needs clip_schedule deferred",
       "durable_every_seconds"},
      {"activation area",
       [](auto& s) { s.set_activation_bytes(uint64_t{1} << 49); },
       "activation_bytes must be at most", "activation_bytes"},
      {"group name", [](auto& s) { s.add_param_groups()->set_name("bias\n"); },
       "param_groups[0].name must be at most 64 printable",
       "param_groups[0].name"},
      {"long group name",
       [](auto& s) { s.add_param_groups()->set_name(std::string(65, 'a')); },
       "param_groups[0].name", "param_groups[0].name"},
      {"arena fit",
       [](auto& s) { s.set_arena_fit(static_cast<v1::ArenaFit>(5)); },
       "arena_fit 5 is not 0 (as given) or 1", "arena_fit"},
      {"fit with unequal buffers",
       [](auto& s) {
         s.set_arena_fit(v1::ARENA_FIT_MOST);
         s.set_grad_slots(2);
         s.set_weight_slots(3);
       },
       "grad_slots 2 and weight_slots 3", "arena_fit"},
      {"places not one per layer",
       [](auto& s) {
         s.add_layer_elements(7);
         s.add_layer_places()->set_block(-1);
       },
       "layer_places has 1 entries for 2 layers", "layer_places"},
      {"place before the blocks",
       [](auto& s) { s.add_layer_places()->set_block(-2); },
       "layer_places[0].block must be -1 (no block) to 65535, got -2",
       "layer_places[0].block"},
      {"place past the blocks",
       [](auto& s) { s.add_layer_places()->set_block(65536); },
       "layer_places[0].block", "layer_places[0].block"},
      {"unit outside the blocks",
       [](auto& s) {
         v1::LayerPlace& place = *s.add_layer_places();
         place.set_block(-1);
         place.set_unit(1);
       },
       "layer_places[0].unit must be at most 4096, and 0 outside the blocks",
       "layer_places[0].unit"},
      {"huge unit", [](auto& s) { s.add_layer_places()->set_unit(4097); },
       "layer_places[0].unit", "layer_places[0].unit"},
  };
  for (const Case& c : cases) {
    v1::ModelSpec spec = Good();
    c.mutate(spec);
    const absl::Status status = CheckModelSpec(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message)) << c.what;
    EXPECT_EQ(RefusedField(status), c.field) << c.what;
  }
}

TEST(CheckSpecSettings, ChecksTheSettingsWithoutAModel) {
  v1::ModelSpec settings = Good();
  settings.clear_layer_elements();
  EXPECT_TRUE(CheckSpecSettings(settings).ok());
  EXPECT_FALSE(CheckModelSpec(settings).ok());  // a model has layers
  settings.mutable_adam()->set_eps(-1);
  const absl::Status refused = CheckSpecSettings(settings);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RefusedField(refused), "adam.eps");
  EXPECT_EQ(RefusedField(absl::InvalidArgumentError("no field")), "");
}

TEST(CheckSpecSettings, AcceptsEpsZeroAsTorchDoes) {
  v1::ModelSpec spec = Good();
  spec.mutable_adam()->set_eps(0.0);
  EXPECT_TRUE(CheckModelSpec(spec).ok());
}

}  // namespace
}  // namespace lohan
