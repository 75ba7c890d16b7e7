// The torch-free parts of the libtorch plugin: option checks, the
// ModelSpec JSON and reading GetStatus's arenas.
#include <cmath>
#include <stdexcept>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/libtorch/job_session.h"
#include "plugins/libtorch/lohan_error.h"
#include "plugins/libtorch/model_spec_json.h"
#include "plugins/libtorch/options.h"

namespace lohan::torch_plugin {
namespace {

using ::testing::HasSubstr;

std::string Refusal(const Options& options) {
  try {
    ValidateOptions(options);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "accepted";
}

TEST(ValidateOptions, NamesTheWrongOption) {
  Options options;
  EXPECT_EQ(Refusal(options), "accepted");
  // The values of the job's settings: liblohan_client's check (lohand's
  // rules), named by the option.
  Options lr = options;
  lr.lr = -1;
  EXPECT_EQ(Refusal(lr),
            "lohan Options: lr: ModelSpec adam.lr must be finite and >= 0; "
            "got -1");
  Options beta = options;
  beta.beta2 = 1.0;
  EXPECT_EQ(Refusal(beta),
            "lohan Options: beta2: ModelSpec adam.beta2 must be in [0, 1); "
            "got 1");
  Options eps = options;
  eps.eps = -1e-8;
  EXPECT_THAT(Refusal(eps), HasSubstr("lohan Options: eps: ModelSpec "
                                      "adam.eps must be finite and >= 0"));
  eps.eps = 0;  // as torch::optim::AdamW takes it
  EXPECT_EQ(Refusal(eps), "accepted");
  Options norm = options;
  norm.max_grad_norm = INFINITY;
  EXPECT_THAT(Refusal(norm), HasSubstr("lohan Options: max_grad_norm: "));
  Options dtype = options;
  dtype.dtype = "fp16";
  EXPECT_THAT(Refusal(dtype), HasSubstr("dtype=\"fp16\" is not supported"));
  Options buffers = options;
  buffers.buffers = "swapped";
  EXPECT_THAT(Refusal(buffers), HasSubstr("buffers=\"swapped\": use"));
  Options activations = options;
  activations.activations = "offload";
  EXPECT_THAT(Refusal(activations),
              HasSubstr("activations=\"offload\": use \"keep\" or "
                        "\"recompute\""));
  Options interval = options;
  interval.commit_interval = 1000001;
  EXPECT_THAT(Refusal(interval),
              HasSubstr("commit_interval: ModelSpec commit_interval must be "
                        "at most 1000000"));
  for (double bad : {-1.0, 1e9, std::nan("")}) {
    Options every = options;
    every.durable_every_seconds = bad;
    EXPECT_THAT(Refusal(every),
                HasSubstr("durable_every_seconds: ModelSpec "
                          "durable_every_seconds must be from 0"));
  }
  Options both = options;
  both.durable_every_seconds = 60;
  both.commit_interval = 4;
  EXPECT_THAT(Refusal(both), HasSubstr("by steps or by time, not both"));
}

TEST(ValidateOptions, RefusesBadParamGroupsAndExemptions) {
  Options options;
  options.lr = 1e-3;
  options.param_groups = {{{"head.weight"}, 2e-3, 0.0}};
  EXPECT_EQ(Refusal(options), "accepted");
  Options empty = options;
  empty.param_groups.push_back({});
  EXPECT_EQ(Refusal(empty),
            "lohan Options: param_groups[1] names no parameters");
  // A group's lr and weight decay: the model cut's (engine_test's
  // BadParamGroupsAreRefusedBeforeAJobIsCreated).
  Options both = options;
  both.no_weight_decay_1d = true;
  both.no_weight_decay_names = {"head.bias"};
  EXPECT_THAT(Refusal(both), HasSubstr("no_weight_decay_1d and "
                                       "no_weight_decay_names exclude each "
                                       "other"));
}

TEST(ModelSpecBuilder, CarriesEveryFieldThroughTheLibrary) {
  ModelSpecBuilder builder;
  builder.set_layer_elements({10, 20});
  lohan_model_spec& spec = builder.spec();
  spec.dtype = LOHAN_DTYPE_BF16;
  spec.lr = 0.1;
  spec.weight_decay = 0.01;
  spec.max_grad_norm = 1.5;
  spec.grad_slots = spec.weight_slots = 1;
  spec.arena_fit_most = 1;
  spec.commit_interval = 8;
  const std::string json = builder.Json();
  EXPECT_THAT(json, HasSubstr("\"commit_interval\":8"));
  EXPECT_THAT(json, HasSubstr("\"layer_elements\":[\"10\",\"20\"]"));
  EXPECT_THAT(json, HasSubstr("\"dtype\":\"DTYPE_BF16\""));
  EXPECT_THAT(json, HasSubstr("\"lr\":0.1"));
  EXPECT_THAT(json, HasSubstr("\"max_grad_norm\":1.5"));
  EXPECT_THAT(json, HasSubstr("\"decoupled_weight_decay\":true"));
  EXPECT_THAT(json, HasSubstr("\"skip_nonfinite\":true"));
  EXPECT_THAT(json, HasSubstr("\"weight_decay\":0.01"));
  EXPECT_THAT(json, HasSubstr("\"grad_slots\":1"));
  EXPECT_THAT(json, HasSubstr("\"arena_fit\":\"ARENA_FIT_MOST\""));
  EXPECT_EQ(OpenJobRequestJson("j", "{}", true),
            "{\"spec\":{\"name\":\"j\",\"model\":{}},\"resume\":true}");
  // A spec the library refuses says why.
  builder.set_layer_elements({});
  spec.struct_size = 4;
  EXPECT_THROW(builder.Json(), LohanError);
}

TEST(JsonNumber, SpellsWhatJsonHasNoNumberForAsProtobufDoes) {
  EXPECT_EQ(JsonNumber(0.1), "0.10000000000000001");
  EXPECT_EQ(JsonNumber(INFINITY), "\"Infinity\"");
  EXPECT_EQ(JsonNumber(-INFINITY), "\"-Infinity\"");
  EXPECT_EQ(JsonNumber(std::nan("")), "\"NaN\"");
}

// Options' settings reach the spec through SetSpecSettings, the plugin's
// one mapping.
TEST(SetSpecSettings, MapsTheOptions) {
  Options options;
  options.bias_correction = false;
  options.commit_interval = 3;
  options.eps = 0.0;
  ModelSpecBuilder builder;
  builder.set_layer_elements({10});
  SetSpecSettings(options, builder.spec());
  const std::string json = builder.Json();
  EXPECT_THAT(json, HasSubstr("\"no_bias_correction\":true"));
  EXPECT_THAT(json, HasSubstr("\"commit_interval\":3"));
  EXPECT_THAT(json, HasSubstr("\"dtype\":\"DTYPE_FP32\""));
  options.bias_correction = true;
  SetSpecSettings(options, builder.spec());
  EXPECT_THAT(builder.Json(), HasSubstr("\"no_bias_correction\":false"));
}

}  // namespace
}  // namespace lohan::torch_plugin
