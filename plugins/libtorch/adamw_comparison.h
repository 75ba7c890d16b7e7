#ifndef LOHAN_PLUGINS_LIBTORCH_ADAMW_COMPARISON_H_
#define LOHAN_PLUGINS_LIBTORCH_ADAMW_COMPARISON_H_

// Training tiny_gpt.h's model with torch::optim::AdamW and through an
// Engine on the same data, on the CPU or a CUDA device, and comparing the
// runs: for engine_test and engine_cuda_test.

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "plugins/libtorch/options.h"
#include "plugins/libtorch/tiny_gpt.h"

namespace lohan::torch_plugin {

inline constexpr int kSteps = 20;
inline constexpr uint64_t kSeed = 7;

// What a run did: the loss and global norm of every step, the weights at
// the end (by name, as fp32 on the CPU).
struct Training {
  std::vector<double> losses;
  std::vector<double> norms;
  int clipped = 0;
  std::vector<std::pair<std::string, torch::Tensor>> weights;
};

// Decay, clipping, betas as the tests use them, on lohand at `socket`.
Options TrainingOptions(const std::string& socket, const std::string& job);

// AdamW as the daemon runs it, on `device`: torch param groups for
// options.param_groups (by name, with their lr and weight decay), then
// the rest with options.lr and weight_decay, those no_weight_decay_1d or
// no_weight_decay_names exempts in a group of their own with decay 0; the
// global norm clipped to max_grad_norm; lr_schedule applied to every
// group at its lr ratio. With bf16, on fp32 masters whose bf16 copies run
// forward and backward. kSteps steps of options.grad_accumulation_steps
// micro-batches (one backward of their losses' sum, each / k).
Training TrainWithAdamW(const tiny_gpt::Config& config, const Options& options,
                        const torch::Device& device = torch::kCPU);

// The same through an Engine on `device` (k backward passes per step).
Training TrainWithLohan(const tiny_gpt::Config& config, const Options& options,
                        const torch::Device& device = torch::kCPU);

// max |got - want| / |want| over the steps.
double MaxRelativeDifference(const std::vector<double>& got,
                             const std::vector<double>& want);

// The largest of every tensor's max |got - want| / max |want|.
double MaxWeightDifference(const Training& got, const Training& want);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_ADAMW_COMPARISON_H_
