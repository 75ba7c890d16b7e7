#include "plugins/libtorch/adamw_comparison.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <unordered_map>

#include "plugins/libtorch/engine.h"

namespace lohan::torch_plugin {
namespace {

std::vector<std::pair<std::string, torch::Tensor>> Weights(
    torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> weights;
  for (const auto& item : model.named_parameters()) {
    weights.emplace_back(
        item.key(), item.value().detach().to(torch::kCPU, torch::kFloat32));
  }
  return weights;
}

std::unique_ptr<torch::optim::AdamWOptions> AdamWWith(const Options& options,
                                                      double lr,
                                                      double weight_decay) {
  return std::make_unique<torch::optim::AdamWOptions>(
      torch::optim::AdamWOptions(lr)
          .betas({options.beta1, options.beta2})
          .eps(options.eps)
          .weight_decay(weight_decay));
}

// torch's param groups for `options` over `masters` (named as `names`),
// and each group's lr / options.lr and weight decay.
std::vector<torch::optim::OptimizerParamGroup> TorchGroups(
    const Options& options, const std::vector<std::string>& names,
    const std::vector<torch::Tensor>& masters, std::vector<double>& scales,
    std::vector<double>& decays) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) index[names[i]] = i;
  std::vector<bool> grouped(masters.size(), false);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const ParamGroup& group : options.param_groups) {
    std::vector<torch::Tensor> members;
    for (const std::string& name : group.params) {
      members.push_back(masters.at(index.at(name)));
      grouped[index.at(name)] = true;
    }
    const double lr = group.lr.value_or(options.lr);
    const double decay = group.weight_decay.value_or(options.weight_decay);
    groups.emplace_back(members, AdamWWith(options, lr, decay));
    scales.push_back(lr / options.lr);
    decays.push_back(decay);
  }
  const std::set<std::string> exempt_names(
      options.no_weight_decay_names.begin(),
      options.no_weight_decay_names.end());
  std::vector<torch::Tensor> decay;
  std::vector<torch::Tensor> no_decay;
  for (size_t i = 0; i < masters.size(); ++i) {
    if (grouped[i]) continue;
    const bool exempt = options.no_weight_decay_1d
                            ? masters[i].dim() < 2
                            : exempt_names.count(names[i]);
    (exempt ? no_decay : decay).push_back(masters[i]);
  }
  for (auto* rest : {&decay, &no_decay}) {
    if (rest->empty()) continue;
    const double rest_decay = rest == &decay ? options.weight_decay : 0.0;
    groups.emplace_back(*rest, AdamWWith(options, options.lr, rest_decay));
    scales.push_back(1.0);
    decays.push_back(rest_decay);
  }
  return groups;
}

}  // namespace

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

Training TrainWithAdamW(const tiny_gpt::Config& config, const Options& options,
                        const torch::Device& device) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config, kSeed);
  model->to(device);
  const bool bf16 = options.dtype == "bf16";
  std::vector<std::string> names;
  std::vector<torch::Tensor> masters;
  for (auto& item : model->named_parameters()) {
    names.push_back(item.key());
    masters.push_back(item.value().detach().clone().set_requires_grad(true));
  }
  if (bf16) model->to(torch::kBFloat16);
  std::vector<double> scales;
  std::vector<double> decays;
  torch::optim::AdamW optimizer(
      TorchGroups(options, names, masters, scales, decays),
      *AdamWWith(options, options.lr, options.weight_decay));
  // Set again after construction: torch 2.15's constructor takes a
  // group's option equal to AdamWOptions' own default (lr 1e-3, weight
  // decay 1e-2) as unset and gives it the optimizer's default instead.
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    static_cast<torch::optim::AdamWOptions&>(groups[g].options())
        .lr(options.lr * scales[g])
        .weight_decay(decays[g]);
  }

  Training run;
  std::vector<torch::Tensor> params = model->parameters();
  for (int step = 0; step < kSteps; ++step) {
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
    }
    for (auto& param : params) param.mutable_grad() = torch::Tensor();
    const int k = options.grad_accumulation_steps;
    torch::Tensor loss;
    for (int micro = 0; micro < k; ++micro) {
      auto [inputs, targets] = tiny_gpt::MakeBatch(config, step * k + micro);
      torch::Tensor part = tiny_gpt::Loss(model->forward(inputs.to(device)),
                                          targets.to(device)) /
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
      // The schedule by hand: step + 1 is the update's Adam step; each
      // group keeps its ratio to the job's lr.
      auto& groups = optimizer.param_groups();
      for (size_t g = 0; g < groups.size(); ++g) {
        static_cast<torch::optim::AdamWOptions&>(groups[g].options())
            .lr(options.lr_schedule(step + 1) * scales[g]);
      }
    }
    optimizer.step();
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
  run.weights = Weights(*model);
  return run;
}

Training TrainWithLohan(const tiny_gpt::Config& config, const Options& options,
                        const torch::Device& device) {
  tiny_gpt::Model model = tiny_gpt::MakeModel(config, kSeed);
  model->to(device);
  // The engine trains these tensors in place: they stay where they are.
  const std::vector<torch::Tensor> before = model->parameters();
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
      torch::Tensor part = tiny_gpt::Loss(model->forward(inputs.to(device)),
                                          targets.to(device)) /
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
  const std::vector<torch::Tensor> after = model->parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(after[i].is_same(before[i])) << "parameter " << i;
    EXPECT_EQ(after[i].device(), device) << "parameter " << i;
  }
  run.weights = Weights(*model);
  engine.close(/*delete_job=*/true);
  return run;
}

double MaxRelativeDifference(const std::vector<double>& got,
                             const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0.0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  }
  return worst;
}

double MaxWeightDifference(const Training& got, const Training& want) {
  EXPECT_EQ(got.weights.size(), want.weights.size());
  double worst = 0.0;
  for (size_t i = 0; i < want.weights.size() && i < got.weights.size(); ++i) {
    EXPECT_EQ(got.weights[i].first, want.weights[i].first);
    const torch::Tensor& expected = want.weights[i].second;
    const double difference =
        (got.weights[i].second - expected).abs().max().item<double>() /
        expected.abs().max().item<double>();
    worst = std::max(worst, difference);
  }
  return worst;
}

}  // namespace lohan::torch_plugin
