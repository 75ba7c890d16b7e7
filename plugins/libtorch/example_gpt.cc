// Trains the small GPT-like model of tiny_gpt.h on generated data through
// lohand, one progress line per step:
//   example_gpt [--socket PATH] [--job NAME] [--steps N] [--dtype fp32|bf16]
// The job is deleted at the end.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "plugins/libtorch/engine.h"
#include "plugins/libtorch/tiny_gpt.h"

namespace {

using lohan::torch_plugin::Engine;
using lohan::torch_plugin::Options;
using lohan::torch_plugin::StepResult;
namespace tiny_gpt = lohan::torch_plugin::tiny_gpt;

int Train(const Options& options, int steps) {
  const tiny_gpt::Config config;
  tiny_gpt::Model model = tiny_gpt::MakeModel(config, /*seed=*/7);
  Engine engine(model.ptr(), model->block_list(), options);
  std::printf("job %s: %zu layers, %s buffers, %s\n", engine.job_id().c_str(),
              engine.layers().size(), engine.buffers().c_str(),
              options.dtype.c_str());
  for (int step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    auto [inputs, targets] = tiny_gpt::MakeBatch(config, step);
    torch::Tensor loss = tiny_gpt::Loss(model->forward(inputs), targets);
    loss.backward();
    const StepResult result = engine.step();
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count();
    std::printf("step %3d  loss %.4f  grad-norm %.3f%s%s  %.1f ms\n", step + 1,
                loss.item<double>(), result.global_norm,
                result.clipped ? " (clipped)" : "",
                result.skipped ? " (skipped)" : "", ms);
    std::fflush(stdout);
  }
  engine.close(/*delete_job=*/true);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  options.job_name = "example-gpt";
  options.lr = 3e-3;
  options.beta2 = 0.95;
  options.weight_decay = 0.1;
  options.no_weight_decay_1d = true;
  options.max_grad_norm = 1.0;
  int steps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--socket") {
      options.socket_path = value;
    } else if (flag == "--job") {
      options.job_name = value;
    } else if (flag == "--steps") {
      steps = std::atoi(value.c_str());
    } else if (flag == "--dtype") {
      options.dtype = value;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    return Train(options, steps);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "example_gpt: %s\n", error.what());
    return 1;
  }
}
