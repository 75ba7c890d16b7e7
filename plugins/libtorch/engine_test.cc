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
#include "plugins/libtorch/lohan_error.h"
#include "plugins/libtorch/test_daemon.h"
#include "plugins/libtorch/tiny_gpt.h"

namespace lohan::torch_plugin {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 20;
constexpr uint64_t kSeed = 7;

// What a run did: the loss and global norm of every step, the weights at
// the end (by name, as fp32).
struct Training {
  std::vector<double> losses;
  std::vector<double> norms;
  int clipped = 0;
  std::vector<std::pair<std::string, torch::Tensor>> weights;
};

Options TrainingOptions(const std::string& socket, const std::string& job) {
  Options options;
  options.socket_path = socket;
  options.job_name = job;
  options.lr = 3e-3;
  options.beta1 = 0.9;
  options.beta2 = 0.95;
  options.eps = 1e-8;
  options.weight_decay = 0.1;
  options.no_weight_decay_1d = true;
  options.max_grad_norm = 1.0;
  return options;
}

std::vector<std::pair<std::string, torch::Tensor>> Weights(
    torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> weights;
  for (const auto& item : model.named_parameters()) {
    weights.emplace_back(item.key(), item.value().detach().to(torch::kFloat32));
  }
  return weights;
}

// AdamW as the daemon runs it: decay on >= 2-D parameters only, the global
// norm clipped to max_grad_norm. With bf16, on fp32 masters whose bf16
// copies run forward and backward.
Training TrainWithAdamW(const tiny_gpt::Config& config,
                        const Options& options) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config, kSeed);
  const bool bf16 = options.dtype == "bf16";
  std::vector<torch::Tensor> masters;
  for (auto& param : model->parameters()) {
    masters.push_back(param.detach().clone().set_requires_grad(true));
  }
  if (bf16) model->to(torch::kBFloat16);
  std::vector<torch::Tensor> decay;
  std::vector<torch::Tensor> no_decay;
  for (auto& master : masters) {
    (master.dim() >= 2 ? decay : no_decay).push_back(master);
  }
  auto adamw = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(options.lr)
            .betas({options.beta1, options.beta2})
            .eps(options.eps)
            .weight_decay(weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, adamw(options.weight_decay));
  groups.emplace_back(no_decay, adamw(0.0));
  torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(options.lr));

  Training run;
  std::vector<torch::Tensor> params = model->parameters();
  for (int step = 0; step < kSteps; ++step) {
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
    }
    for (auto& param : params) param.mutable_grad() = torch::Tensor();
    // k micro-batches: one backward of the sum of their losses, each / k.
    const int k = options.grad_accumulation_steps;
    torch::Tensor loss;
    for (int micro = 0; micro < k; ++micro) {
      auto [inputs, targets] = tiny_gpt::MakeBatch(config, step * k + micro);
      torch::Tensor part = tiny_gpt::Loss(model->forward(inputs), targets) /
                           static_cast<double>(k);
      loss = loss.defined() ? loss + part : part;
    }
    loss.backward();
    for (size_t i = 0; i < params.size(); ++i) {
      masters[i].mutable_grad() = params[i].grad().to(torch::kFloat32);
    }
    run.losses.push_back(loss.item<double>());
    const double norm =
        torch::nn::utils::clip_grad_norm_(masters, options.max_grad_norm);
    run.norms.push_back(norm);
    if (norm > options.max_grad_norm) ++run.clipped;
    if (options.lr_schedule) {
      // The schedule by hand: step + 1 is the update's Adam step.
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::AdamWOptions&>(group.options())
            .lr(options.lr_schedule(step + 1));
      }
    }
    optimizer.step();
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
  run.weights = Weights(*model);
  return run;
}

Training TrainWithLohan(const tiny_gpt::Config& config,
                        const Options& options) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config, kSeed);
  Engine engine(model.ptr(), model->block_list(), options);
  EXPECT_EQ(model->parameters()[0].scalar_type(),
            options.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32);
  EXPECT_EQ(engine.buffers(),
            options.buffers == "streamed" ? "streamed" : "resident");
  Training run;
  for (int step = 0; step < kSteps; ++step) {
    // k backward passes, one per micro-batch, each loss / k.
    const int k = options.grad_accumulation_steps;
    double loss = 0.0;
    for (int micro = 0; micro < k; ++micro) {
      auto [inputs, targets] = tiny_gpt::MakeBatch(config, step * k + micro);
      torch::Tensor part = tiny_gpt::Loss(model->forward(inputs), targets) /
                           static_cast<double>(k);
      part.backward();
      loss += part.item<double>();
    }
    const StepResult result = engine.step();
    EXPECT_FALSE(result.skipped) << "step " << step;
    run.losses.push_back(loss);
    run.norms.push_back(result.global_norm);
    if (result.clipped) ++run.clipped;
  }
  EXPECT_EQ(engine.iteration(), static_cast<uint64_t>(kSteps));
  run.weights = Weights(*model);
  engine.close(/*delete_job=*/true);
  return run;
}

double MaxRelativeDifference(const std::vector<double>& got,
                             const std::vector<double>& want) {
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  }
  return worst;
}

// The largest of every tensor's max |got - want| / max |want|.
double MaxWeightDifference(const Training& got, const Training& want) {
  double worst = 0.0;
  for (size_t i = 0; i < want.weights.size(); ++i) {
    const torch::Tensor& expected = want.weights[i].second;
    const double difference =
        (got.weights[i].second - expected).abs().max().item<double>() /
        expected.abs().max().item<double>();
    worst = std::max(worst, difference);
  }
  return worst;
}

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
            "lohan Options: lr=-0.001 must be in [0, inf)");
  Options fp8 = options;
  fp8.dtype = "fp8";
  EXPECT_EQ(refusal(fp8, model->block_list()),
            "lohan Options: dtype=\"fp8\" is not supported; use \"fp32\" or "
            "\"bf16\"");
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
  EXPECT_THROW(engine.step(), std::logic_error);
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
  const std::vector<ElementRange> exempt = OneDimensionalRanges(layers);
  // norm.weight and norm.bias are adjacent: one range.
  ASSERT_FALSE(exempt.empty());
  EXPECT_EQ(exempt[0].layer, 1u);
  EXPECT_EQ(exempt[0].begin, 0u);
  EXPECT_EQ(exempt[0].end, 2u * config_.dim);
}

}  // namespace
}  // namespace lohan::torch_plugin
