// Trains linear_tanh.h's model through lohand for the cross-plugin
// checkpoint test (tests/python/test_libtorch_checkpoint.py) and the
// arena moves' (tests/python/test_share_move.py):
//   checkpoint_tool --socket S --job NAME [--seed N | --resume DIR]
//                   [--steps N] [--save DIR] [--losses FILE]
//                   [--activations keep|recompute] [--dim N] [--blocks N]
//                   [--pause-before I,J,... --go DIR]
// The model (--dim wide, --blocks blocks: linear_tanh.h's Config by
// default) starts from --seed's init (default 0), or from the checkpoint
// --resume names (its step, masters and moments); --steps steps follow, the
// batch of each the one of its global step (iteration + 1); before the
// steps --pause-before names (0: the first of this run) it writes
// DIR/paused-I and waits for DIR/go-I. --save then writes a checkpoint
// with the optimizer state and --losses the losses, one %.9g per line.
// Exit status 1 with the error on stderr.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "plugins/libtorch/engine.h"
#include "plugins/libtorch/linear_tanh.h"

namespace lt = lohan::torch_plugin::linear_tanh;
using lohan::torch_plugin::Engine;
using lohan::torch_plugin::Options;

namespace {

// "2,5" as {2, 5}.
std::set<int> Steps(const std::string& list) {
  std::set<int> steps;
  std::stringstream items(list);
  for (std::string item; std::getline(items, item, ',');) {
    if (!item.empty()) steps.insert(std::stoi(item));
  }
  return steps;
}

// Says it paused before `step`, and waits to be let go.
void Pause(const std::string& directory, int step) {
  const std::string name = std::to_string(step);
  std::ofstream(directory + "/paused-" + name) << "paused\n";
  while (!std::filesystem::exists(directory + "/go-" + name)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args = {
      {"--seed", "0"}, {"--steps", "0"}, {"--activations", "keep"}};
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  if (argc % 2 == 0 || !args.count("--socket") || !args.count("--job")) {
    std::cerr << "usage: checkpoint_tool --socket S --job NAME [--seed N | "
                 "--resume DIR] [--steps N] [--save DIR] [--losses FILE] "
                 "[--activations keep|recompute] [--dim N] [--blocks N] "
                 "[--pause-before I,J,... --go DIR]\n";
    return 2;
  }
  try {
    torch::set_num_threads(1);
    lt::Config config;
    if (args.count("--dim")) config.dim = std::stoll(args["--dim"]);
    if (args.count("--blocks")) config.blocks = std::stoll(args["--blocks"]);
    const std::set<int> pauses = Steps(args["--pause-before"]);
    lt::Model model = lt::MakeModel(config, std::stoull(args["--seed"]));
    Options options;
    options.socket_path = args["--socket"];
    options.job_name = args["--job"];
    options.lr = 1e-2;
    options.beta1 = 0.9;
    options.beta2 = 0.99;
    options.eps = 1e-8;
    options.weight_decay = 0.01;
    options.activations = args["--activations"];
    if (args.count("--resume")) options.resume_from = args["--resume"];
    Engine engine(model.ptr(), model->block_list(), options);
    std::string losses;
    for (int step = 0; step < std::stoi(args["--steps"]); ++step) {
      if (pauses.count(step)) Pause(args["--go"], step);
      auto [x, y] =
          lt::MakeBatch(config, static_cast<int64_t>(engine.iteration()) + 1);
      torch::Tensor loss = lt::Loss(model->forward(x, &engine), y);
      loss.backward();
      engine.step();
      char line[32];
      std::snprintf(line, sizeof(line), "%.9g\n", loss.item<float>());
      losses += line;
    }
    if (args.count("--save")) engine.save(args["--save"], true);
    if (args.count("--losses")) {
      std::FILE* out = std::fopen(args["--losses"].c_str(), "w");
      if (out == nullptr) throw std::runtime_error("cannot write --losses");
      std::fputs(losses.c_str(), out);
      std::fclose(out);
    }
    engine.close(/*delete_job=*/true);
  } catch (const std::exception& error) {
    std::cerr << "checkpoint_tool: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
