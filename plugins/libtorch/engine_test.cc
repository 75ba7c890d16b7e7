// lohan::torch_plugin::Engine against torch::optim::AdamW on a small
// GPT-like model, through a real lohand: the tolerances are the Python
// plugin's (docs/pytorch.md); and the options and blocks it refuses.
#include "plugins/libtorch/engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/libtorch/adamw_comparison.h"
#include "plugins/libtorch/layer_plan.h"
#include "plugins/libtorch/lohan_error.h"
#include "plugins/libtorch/model_spec_json.h"
#include "plugins/libtorch/test_daemon.h"
#include "plugins/libtorch/tiny_gpt.h"

namespace lohan::torch_plugin {
namespace {

using ::testing::HasSubstr;

class EngineTest : public ::testing::Test {
 protected:
  const std::string& socket() const { return daemon_.socket(); }

  TestDaemon daemon_;
  tiny_gpt::Config config_;
};

TEST_F(EngineTest, Fp32MatchesAdamWWithDecayAndClipping) {
  const Options options = TrainingOptions(socket(), "fp32");
  const Training want = TrainWithAdamW(config_, options);
  const Training got = TrainWithLohan(config_, options);
  const double losses = MaxRelativeDifference(got.losses, want.losses);
  const double norms = MaxRelativeDifference(got.norms, want.norms);
  const double weights = MaxWeightDifference(got, want);
  std::cout << "fp32, " << kSteps << " steps: loss " << want.losses.front()
            << " -> " << want.losses.back() << "; max relative difference "
            << "losses " << losses << ", global norms " << norms
            << ", weights (of each tensor's largest) " << weights << "; "
            << got.clipped << " steps clipped\n";
  EXPECT_LT(want.losses.back(), want.losses.front());
  EXPECT_GT(want.clipped, 0);
  EXPECT_EQ(got.clipped, want.clipped);
  EXPECT_LE(losses, 1e-6);
  EXPECT_LE(norms, 1e-5);
  EXPECT_LE(weights, 1e-5);
}

// Two gradient and weight buffers shared by the five layers, through the
// daemon's SSDs: the same results.
TEST_F(EngineTest, Fp32StreamedMatchesAdamW) {
  Options options = TrainingOptions(socket(), "streamed");
  options.buffers = "streamed";
  options.stream_buffers = 2;
  const Training want = TrainWithAdamW(config_, options);
  const Training got = TrainWithLohan(config_, options);
  const double losses = MaxRelativeDifference(got.losses, want.losses);
  const double weights = MaxWeightDifference(got, want);
  std::cout << "fp32 streamed (2 buffers): max relative difference losses "
            << losses << ", weights " << weights << "\n";
  EXPECT_LE(losses, 1e-6);
  EXPECT_LE(weights, 1e-5);
}

// 3 backward passes per step, each of a micro-batch's loss / 3, against
// AdamW on one backward of the 3 losses' sum.
TEST_F(EngineTest, GradientAccumulationMatchesAdamWOnTheSummedLosses) {
  Options options = TrainingOptions(socket(), "accumulate");
  options.grad_accumulation_steps = 3;
  const Training want = TrainWithAdamW(config_, options);
  const Training got = TrainWithLohan(config_, options);
  const double losses = MaxRelativeDifference(got.losses, want.losses);
  const double weights = MaxWeightDifference(got, want);
  std::cout << "fp32, grad_accumulation_steps=3: max relative difference "
            << "losses " << losses << ", weights " << weights << "\n";
  EXPECT_LE(losses, 1e-6);
  EXPECT_LE(weights, 1e-5);
  // One micro-batch per step instead is another run.
  Options single = TrainingOptions(socket(), "single");
  EXPECT_GT(MaxWeightDifference(TrainWithLohan(config_, single), want), 1e-4);
}

// How lohand runs the steps, not what they compute: the redo-all clip
// schedule and in-order service give the default's bits; states in small
// chunks train as AdamW; bf16 moments close to the exact ones.
TEST_F(EngineTest, TheStepOptionsReachTheDaemon) {
  const Training plain =
      TrainWithLohan(config_, TrainingOptions(socket(), "plain"));
  Options redo = TrainingOptions(socket(), "redo-in-order");
  redo.clip_schedule = "redo-all";
  redo.service = "in-order";
  const Training redone = TrainWithLohan(config_, redo);
  EXPECT_GT(redone.clipped, 0);
  EXPECT_EQ(redone.losses, plain.losses);
  EXPECT_EQ(redone.norms, plain.norms);
  EXPECT_EQ(MaxWeightDifference(redone, plain), 0.0);

  Options chunked = TrainingOptions(socket(), "chunked");
  chunked.chunk_elements = 1000;  // several chunks per block layer
  const Training want = TrainWithAdamW(config_, chunked);
  const Training in_chunks = TrainWithLohan(config_, chunked);
  EXPECT_LE(MaxRelativeDifference(in_chunks.losses, want.losses), 1e-6);
  EXPECT_LE(MaxWeightDifference(in_chunks, want), 1e-5);

  Options moments = TrainingOptions(socket(), "bf16-moments");
  moments.bf16_moments = true;
  const Training approximate = TrainWithLohan(config_, moments);
  std::cout << "bf16 moments: max relative difference losses "
            << MaxRelativeDifference(approximate.losses, plain.losses)
            << ", weights " << MaxWeightDifference(approximate, plain) << "\n";
  EXPECT_LE(MaxRelativeDifference(approximate.losses, plain.losses), 1e-3);
  EXPECT_GT(MaxWeightDifference(approximate, plain), 0.0);
}

// A step whose gradients hold inf: skipped by default, applied with
// skip_nonfinite = false.
TEST_F(EngineTest, SkipNonfiniteDecidesWhetherAnInfStepIsApplied) {
  for (const bool skip : {true, false}) {
    tiny_gpt::Model model = tiny_gpt::MakeModel(config_, kSeed);
    Options options = TrainingOptions(socket(), skip ? "skip" : "apply");
    options.max_grad_norm = 0.0;
    options.skip_nonfinite = skip;
    Engine engine(model.ptr(), model->block_list(), options);
    auto [inputs, targets] = tiny_gpt::MakeBatch(config_, 0);
    (tiny_gpt::Loss(model->forward(inputs), targets) * INFINITY).backward();
    EXPECT_EQ(engine.step().skipped, skip);
    EXPECT_EQ(engine.iteration(), skip ? 0u : 1u);
    bool finite = true;
    for (const torch::Tensor& param : model->parameters()) {
      finite = finite && torch::isfinite(param).all().item<bool>();
    }
    EXPECT_EQ(finite, skip);
    engine.close(/*delete_job=*/true);
  }
}

TEST_F(EngineTest, AStepBeforeTheKthBackwardIsRefused) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config_, kSeed);
  Options options = TrainingOptions(socket(), "short");
  options.grad_accumulation_steps = 2;
  Engine engine(model.ptr(), model->block_list(), options);
  auto backward = [&](int batch) {
    auto [inputs, targets] = tiny_gpt::MakeBatch(config_, batch);
    (tiny_gpt::Loss(model->forward(inputs), targets) / 2.0).backward();
  };
  backward(0);
  try {
    engine.step();
    ADD_FAILURE() << "a step after 1 of 2 backward passes was accepted";
  } catch (const std::logic_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("step() after 1 of 2 backward passes "
                                        "(grad_accumulation_steps=2)"));
  }
  // The step is still in progress: the second pass completes it.
  backward(1);
  EXPECT_FALSE(engine.step().skipped);
  EXPECT_EQ(engine.iteration(), 1u);
  backward(2);
  backward(3);
  try {
    backward(4);
    ADD_FAILURE() << "a third backward with grad_accumulation_steps=2";
  } catch (const std::exception& error) {
    EXPECT_THAT(error.what(), HasSubstr("grad_accumulation_steps=2"));
  }
  engine.close(/*delete_job=*/true);
}

TEST_F(EngineTest, ADifferentLearningRateIsCaught) {
  const Options options = TrainingOptions(socket(), "wrong-lr");
  Options wrong = options;
  wrong.lr = options.lr * 1.01;
  const Training want = TrainWithAdamW(config_, options);
  const Training got = TrainWithLohan(config_, wrong);
  EXPECT_GT(MaxWeightDifference(got, want), 1e-5);
}

// A warmup then cosine decay, applied at each step's begin, against the
// same schedule set on torch::optim::AdamW's groups by hand; and that the
// schedule is what trains (a constant lr differs).
TEST_F(EngineTest, LrScheduleMatchesAdamWWithTheScheduleByHand) {
  Options options = TrainingOptions(socket(), "schedule");
  const double peak = options.lr;
  options.lr_schedule = [peak](int64_t step) {
    if (step <= 5) return peak * static_cast<double>(step - 1) / 5.0;
    return peak * 0.5 *
           (1.0 + std::cos(M_PI * static_cast<double>(step - 5) /
                           static_cast<double>(kSteps - 5)));
  };
  const Training want = TrainWithAdamW(config_, options);
  const Training got = TrainWithLohan(config_, options);
  const double losses = MaxRelativeDifference(got.losses, want.losses);
  const double weights = MaxWeightDifference(got, want);
  std::cout << "fp32 with an lr schedule: max relative difference losses "
            << losses << ", weights " << weights << "\n";
  EXPECT_EQ(got.losses.front(), want.losses.front());
  EXPECT_LE(losses, 1e-6);
  EXPECT_LE(weights, 1e-5);
  Options constant = TrainingOptions(socket(), "constant");
  EXPECT_GT(MaxWeightDifference(TrainWithLohan(config_, constant), want), 1e-4);
}

TEST_F(EngineTest, Bf16MatchesAdamWOnFp32Masters) {
  Options options = TrainingOptions(socket(), "bf16");
  options.dtype = "bf16";
  const Training want = TrainWithAdamW(config_, options);
  const Training got = TrainWithLohan(config_, options);
  const double losses = MaxRelativeDifference(got.losses, want.losses);
  const double weights = MaxWeightDifference(got, want);
  std::cout << "bf16, " << kSteps << " steps: max relative difference "
            << "losses " << losses << ", bf16 weights (of each tensor's "
            << "largest) " << weights << "\n";
  EXPECT_LE(losses, 1e-3);
  EXPECT_LE(weights, 1e-2);
}

TEST_F(EngineTest, BadOptionsAreRefused) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config_, kSeed);
  auto refusal = [&](Options options,
                     std::vector<std::shared_ptr<torch::nn::Module>> blocks) {
    try {
      Engine engine(model.ptr(), std::move(blocks), std::move(options));
    } catch (const std::exception& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  Options options = TrainingOptions(socket(), "refused");
  Options negative_lr = options;
  negative_lr.lr = -1e-3;
  EXPECT_EQ(refusal(negative_lr, model->block_list()),
            "lohan Options: lr: ModelSpec adam.lr must be finite and >= 0; "
            "got -0.001");
  Options fp8 = options;
  fp8.dtype = "fp8";
  EXPECT_EQ(refusal(fp8, model->block_list()),
            "lohan Options: dtype=\"fp8\" is not supported; use \"fp32\" or "
            "\"bf16\"");
  Options schedule = options;
  schedule.clip_schedule = "eager";
  EXPECT_EQ(refusal(schedule, model->block_list()),
            "lohan Options: clip_schedule=\"eager\": use \"deferred\" or "
            "\"redo-all\"");
  Options service = options;
  service.service = "fifo";
  EXPECT_EQ(refusal(service, model->block_list()),
            "lohan Options: service=\"fifo\": use \"lanes\" or "
            "\"in-order\"");
  EXPECT_THAT(refusal(options, {}), HasSubstr("blocks is empty"));
  EXPECT_THAT(refusal(options, {std::make_shared<torch::nn::LinearImpl>(2, 2)}),
              "lohan Engine: blocks[0] is not a submodule of the model");
  for (const int steps : {0, -2}) {
    Options accumulation = options;
    accumulation.grad_accumulation_steps = steps;
    EXPECT_EQ(refusal(accumulation, model->block_list()),
              "lohan Options: grad_accumulation_steps must be >= 1, got " +
                  std::to_string(steps));
  }
  Options both = options;
  both.resume_job = true;
  both.resume_from = "/nonexistent";
  EXPECT_THAT(refusal(both, model->block_list()),
              HasSubstr("resume_job and resume_from exclude each other"));
  Options bad_name = options;
  bad_name.job_name = "no spaces";
  try {
    Engine engine(model.ptr(), model->block_list(), bad_name);
    ADD_FAILURE() << "a job name with a space was accepted";
  } catch (const LohanError& error) {
    EXPECT_EQ(error.status(), LOHAN_INVALID_ARGUMENT) << error.what();
  }
  Options no_daemon = options;
  no_daemon.socket_path = socket() + ".nobody";
  try {
    Engine engine(model.ptr(), model->block_list(), no_daemon);
    ADD_FAILURE() << "no daemon, yet accepted";
  } catch (const LohanError& error) {
    EXPECT_EQ(error.status(), LOHAN_UNAVAILABLE);
    EXPECT_THAT(error.what(), HasSubstr(no_daemon.socket_path));
  }
}

TEST_F(EngineTest, ATakenJobNameIsRefusedWithAHint) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config_, kSeed);
  const Options options = TrainingOptions(socket(), "taken");
  Engine first(model.ptr(), model->block_list(), options);
  EXPECT_EQ(first.layers().size(), 2u + config_.blocks);
  tiny_gpt::Model other = tiny_gpt::MakeModel(config_, kSeed);
  try {
    Engine second(other.ptr(), other->block_list(), options);
    ADD_FAILURE() << "a second job named \"taken\" was created";
  } catch (const LohanError& error) {
    EXPECT_EQ(error.status(), LOHAN_ALREADY_EXISTS);
    EXPECT_THAT(error.what(), HasSubstr("choose another job_name"));
  }
}

TEST_F(EngineTest, CallsOutOfOrderAreRefused) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config_, kSeed);
  Engine engine(model.ptr(), model->block_list(),
                TrainingOptions(socket(), "order"));
  EXPECT_THROW(engine.step(), std::logic_error);
  auto [inputs, targets] = tiny_gpt::MakeBatch(config_, 0);
  tiny_gpt::Loss(model->forward(inputs), targets).backward();
  try {
    tiny_gpt::Loss(model->forward(inputs), targets).backward();
    ADD_FAILURE() << "a second backward before step() was accepted";
  } catch (const std::exception& error) {
    EXPECT_THAT(error.what(),
                HasSubstr("got a gradient again after 1 backward passes"));
  }
  // The first backward's gradients still make a step.
  EXPECT_FALSE(engine.step().skipped);
  EXPECT_EQ(engine.iteration(), 1u);
  engine.close(/*delete_job=*/true);
  EXPECT_EQ(engine.iteration(), 1u);  // still readable once closed
  EXPECT_THROW(engine.step(), std::logic_error);
}

// Block 1 slower (at 1e-3, AdamWOptions' default lr, which torch's
// optimizer constructor would take for "unset": adamw_comparison.cc sets
// each group's lr after construction) and without decay, the head faster with
// more decay, the rest at the job's lr and decay but for the named exemptions
// (head.bias is among them but in a group: its group's decay holds).
Options GroupedOptions(const std::string& socket, const std::string& job,
                       torch::nn::Module& model) {
  Options options = TrainingOptions(socket, job);
  options.no_weight_decay_1d = false;
  options.no_weight_decay_names = {"positions.weight", "norm.weight",
                                   "norm.bias", "head.bias"};
  ParamGroup slow;
  for (const auto& item : model.named_parameters()) {
    if (item.key().rfind("blocks.1.", 0) == 0)
      slow.params.push_back(item.key());
  }
  slow.lr = 1e-3;
  slow.weight_decay = 0.0;
  ParamGroup head;
  head.params = {"head.weight", "head.bias"};
  head.lr = 6e-3;
  head.weight_decay = 0.3;
  options.param_groups = {slow, head};
  return options;
}

TEST_F(EngineTest, ParamGroupsMatchAdamWWithTheSameGroups) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config_, kSeed);
  const Options options = GroupedOptions(socket(), "groups", *model);
  const Training want = TrainWithAdamW(config_, options);
  const Training got = TrainWithLohan(config_, options);
  const double losses = MaxRelativeDifference(got.losses, want.losses);
  const double norms = MaxRelativeDifference(got.norms, want.norms);
  const double weights = MaxWeightDifference(got, want);
  std::cout << "fp32 with 2 param groups and named exemptions, " << kSteps
            << " steps: max relative difference losses " << losses
            << ", global norms " << norms << ", weights " << weights << "; "
            << got.clipped << " steps clipped\n";
  EXPECT_EQ(got.clipped, want.clipped);
  EXPECT_LE(losses, 1e-6);
  EXPECT_LE(norms, 1e-5);
  EXPECT_LE(weights, 1e-5);
  // Without the groups (one lr, 1-D exemptions) it is another run.
  const Training ungrouped =
      TrainWithLohan(config_, TrainingOptions(socket(), "ungrouped"));
  EXPECT_GT(MaxWeightDifference(ungrouped, want), 1e-4);
}

// An lr schedule scales every group alike: each keeps its lr / the job's.
TEST_F(EngineTest, ParamGroupsKeepTheirRatioUnderAnLrSchedule) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config_, kSeed);
  Options options = GroupedOptions(socket(), "group-schedule", *model);
  const double peak = options.lr;
  options.lr_schedule = [peak](int64_t step) {
    return peak * (1.0 - 0.04 * static_cast<double>(step - 1));
  };
  const Training want = TrainWithAdamW(config_, options);
  const Training got = TrainWithLohan(config_, options);
  const double losses = MaxRelativeDifference(got.losses, want.losses);
  const double weights = MaxWeightDifference(got, want);
  std::cout << "fp32 with 2 param groups and an lr schedule: max relative "
            << "difference losses " << losses << ", weights " << weights
            << "\n";
  EXPECT_LE(losses, 1e-6);
  EXPECT_LE(weights, 1e-5);
}

// The ranges the daemon gets: liblohan_client's cut of the groups, which
// the Python plugin's groups take too (client/model_cut_test.cc holds the
// cut's own cases).
TEST_F(EngineTest, ParamGroupsBecomeTheDaemonsElementRanges) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config_, kSeed);
  const Options options = GroupedOptions(socket(), "ranges", *model);
  const ModelPlan plan = PlanModel(
      model.ptr(), model->block_list(), &options,
      "{\"dtype\":\"DTYPE_FP32\",\"adam\":{\"lr\":" + JsonNumber(options.lr) +
          "}}");
  const std::vector<Layer>& layers = plan.layers;
  const uint64_t dim = config_.dim;
  const uint64_t tokens = config_.vocab * dim;
  auto range = [](uint32_t layer, uint64_t begin, uint64_t end) {
    return "{\"layer\":" + std::to_string(layer) + ",\"begin\":\"" +
           std::to_string(begin) + "\",\"end\":\"" + std::to_string(end) +
           "\"}";
  };
  auto group = [&](const std::string& name, const std::string& ranges) {
    return "\"ranges\":[" + ranges + "],\"name\":\"" + name + "\"";
  };
  // positions.weight after tokens.weight in layer 0; norm.weight and
  // norm.bias at the head of layer 1; head.bias (grouped) left out.
  EXPECT_THAT(plan.spec_json,
              HasSubstr(group("no_weight_decay",
                              range(0, tokens, tokens + config_.context * dim) +
                                  "," + range(1, 0, 2 * dim))));
  // Block 1 is layer 3, whole; head.weight and head.bias, adjacent after
  // the norm: one range.
  EXPECT_THAT(plan.spec_json, HasSubstr(group("param_groups[0]",
                                              range(3, 0, layers[3].numel))));
  EXPECT_THAT(
      plan.spec_json,
      HasSubstr(group("param_groups[1]", range(1, 2 * dim, layers[1].numel))));
  EXPECT_THAT(plan.spec_json, HasSubstr("\"weight_decay\":0.3"));
}

TEST_F(EngineTest, BadParamGroupsAreRefusedBeforeAJobIsCreated) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config_, kSeed);
  model->named_parameters()["positions.weight"].set_requires_grad(false);
  auto refusal = [&](const Options& options) {
    try {
      Engine engine(model.ptr(), model->block_list(), options);
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  const Options options = TrainingOptions(socket(), "bad-groups");
  Options unknown = options;
  unknown.no_weight_decay_1d = false;
  unknown.no_weight_decay_names = {"norm.bias", "head.wieght"};
  EXPECT_EQ(refusal(unknown),
            "lohan Options: no_weight_decay names \"head.wieght\", "
            "which the model does not have (see its named_parameters())");
  Options unknown_in_group = options;
  unknown_in_group.param_groups = {{{"head.weight"}, 1e-3, {}},
                                   {{"blocks.9.up.weight"}, {}, 0.0}};
  EXPECT_EQ(refusal(unknown_in_group),
            "lohan Options: param_groups[1] names \"blocks.9.up.weight\", "
            "which the model does not have (see its named_parameters())");
  Options twice = options;
  twice.param_groups = {{{"head.weight", "head.bias"}, 1e-3, {}},
                        {{"norm.bias", "head.bias"}, 2e-3, {}}};
  EXPECT_EQ(refusal(twice),
            "lohan Options: param_groups[0] and param_groups[1] both hold "
            "head.bias; a parameter may be in one group only");
  // A group's lr and weight decay, judged by the model cut
  // (client/model_cut.cc) for both plugins.
  Options negative = options;
  negative.param_groups = {{{"head.weight"}, 1e-3, -0.5}};
  EXPECT_EQ(refusal(negative),
            "lohan Options: param_groups[0]: lr 0.001 and weight_decay -0.5 "
            "must be finite and >= 0");
  Options infinite = options;
  infinite.param_groups = {{{"head.weight"}, INFINITY, {}}};
  EXPECT_THAT(refusal(infinite), HasSubstr("param_groups[0]: lr inf"));
  Options zero = options;
  zero.lr = 0.0;
  zero.param_groups = {{{"head.weight"}, 2e-3, {}}};
  EXPECT_EQ(refusal(zero),
            "lohan Options: param_groups[0] has lr 0.002 but the job's lr is "
            "0: a group runs at a fixed multiple of the job's lr");
  Options frozen = options;
  frozen.param_groups = {{{"positions.weight"}, 1e-3, {}}};
  EXPECT_EQ(refusal(frozen),
            "lohan Options: param_groups[0] names \"positions.weight\", a "
            "parameter the engine does not train (requires_grad is false)");
  // A frozen parameter among the exemptions is no trained one: nothing to
  // exempt, as in the Python plugin.
  Options frozen_exempt = options;
  frozen_exempt.no_weight_decay_1d = false;
  frozen_exempt.no_weight_decay_names = {"positions.weight"};
  // Nothing was created on the daemon by the refusals: the name is free.
  Engine engine(model.ptr(), model->block_list(), frozen_exempt);
  engine.close(/*delete_job=*/true);
}

// A parameter "first" on `first` and a block whose "weight" is on
// `second`.
class TwoDevicesImpl : public torch::nn::Module {
 public:
  TwoDevicesImpl(torch::Device first, torch::Device second) {
    register_parameter("first", torch::zeros({2}, torch::TensorOptions(first)));
    block_ = register_module("block", std::make_shared<torch::nn::Module>());
    block_->register_parameter(
        "weight", torch::zeros({2, 2}, torch::TensorOptions(second)));
  }
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() { return {block_}; }

 private:
  std::shared_ptr<torch::nn::Module> block_;
};
TORCH_MODULE(TwoDevices);

// Parameters on two devices, or on one the engine cannot train on, are
// refused naming them, before a job exists. (meta tensors stand in for a
// second device on a machine without GPUs.)
TEST_F(EngineTest, ParametersOnTwoDevicesAreRefusedNamingThem) {
  auto refusal = [&](TwoDevices model) {
    try {
      Engine engine(model.ptr(), model->blocks(),
                    TrainingOptions(socket(), "devices"));
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refusal(TwoDevices(torch::kCPU, torch::kMeta)),
            "lohan Engine: parameters first (on cpu) and block.weight (on "
            "meta) are on different devices; move the whole module to one "
            "(model->to(device)) before creating the Engine");
  EXPECT_EQ(refusal(TwoDevices(torch::kMeta, torch::kMeta)),
            "lohan Engine: parameter first (on meta): the engine trains "
            "modules on the CPU or on one CUDA device");
  // Nothing was created on the daemon by the refusals: the name is free.
  TwoDevices cpu(torch::kCPU, torch::kCPU);
  Engine engine(cpu.ptr(), cpu->blocks(), TrainingOptions(socket(), "devices"));
  EXPECT_EQ(engine.layers().size(), 2u);
  engine.close(/*delete_job=*/true);
}

TEST_F(EngineTest, LayersAreCutAsThePythonPlugin) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config_, kSeed);
  const std::vector<Layer> layers =
      PlanLayers(model.ptr(), model->block_list());
  ASSERT_EQ(layers.size(), 2u + config_.blocks);
  EXPECT_EQ(layers[0].names,
            (std::vector<std::string>{"tokens.weight", "positions.weight"}));
  EXPECT_EQ(layers[1].names,
            (std::vector<std::string>{"norm.weight", "norm.bias", "head.weight",
                                      "head.bias"}));
  EXPECT_EQ(layers[2].names.front(), "blocks.0.norm1.weight");
  EXPECT_EQ(layers[2].block.get(), model->block_list()[0].get());
}

}  // namespace
}  // namespace lohan::torch_plugin
