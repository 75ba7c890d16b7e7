// lohan::torch_plugin::Engine with the module on cuda:0 against
// torch::optim::AdamW on cuda:0, through a real lohand: the gradients go
// from the device into the pinned arena and the weights back on torch's
// current stream (device_transfer.h). Skipped, saying so, where torch sees
// no GPU. The refusals of a CUDA device where liblohan_client cannot copy
// run everywhere.
#include <torch/cuda.h>
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lohan/lohan_client.h"
#include "plugins/libtorch/adamw_comparison.h"
#include "plugins/libtorch/device_transfer.h"
#include "plugins/libtorch/engine.h"
#include "plugins/libtorch/lohan_error.h"
#include "plugins/libtorch/test_daemon.h"
#include "plugins/libtorch/tiny_gpt.h"

namespace lohan::torch_plugin {
namespace {

using ::testing::HasSubstr;

const torch::Device kCuda0(torch::kCUDA, 0);

class EngineCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) {
      GTEST_SKIP() << "torch sees no CUDA device (torch::cuda::is_available() "
                      "is false): the CUDA engine tests need a GPU";
    }
  }

  const std::string& socket() const { return daemon_.socket(); }

  TestDaemon daemon_;
  tiny_gpt::Config config_;
};

void Report(const std::string& what, const Training& got, const Training& want,
            double losses, double weights) {
  std::cout << what << " on cuda:0, " << kSteps << " steps: loss "
            << want.losses.front() << " -> " << want.losses.back()
            << "; max relative difference losses " << losses
            << ", weights (of each tensor's largest) " << weights << "; "
            << got.clipped << " steps clipped\n";
}

TEST_F(EngineCudaTest, Fp32MatchesAdamWWithDecayAndClipping) {
  const Options options = TrainingOptions(socket(), "cuda-fp32");
  const Training want = TrainWithAdamW(config_, options, kCuda0);
  const Training got = TrainWithLohan(config_, options, kCuda0);
  const double losses = MaxRelativeDifference(got.losses, want.losses);
  const double norms = MaxRelativeDifference(got.norms, want.norms);
  const double weights = MaxWeightDifference(got, want);
  Report("fp32", got, want, losses, weights);
  EXPECT_LT(want.losses.back(), want.losses.front());
  EXPECT_GT(want.clipped, 0);
  EXPECT_EQ(got.clipped, want.clipped);
  EXPECT_LE(losses, 1e-6);
  EXPECT_LE(norms, 1e-5);
  EXPECT_LE(weights, 1e-5);
}

// Two shared gradient and weight buffers for five layers: a device copy
// waits for the buffer's previous request.
TEST_F(EngineCudaTest, Fp32StreamedMatchesAdamW) {
  Options options = TrainingOptions(socket(), "cuda-streamed");
  options.buffers = "streamed";
  options.stream_buffers = 2;
  const Training want = TrainWithAdamW(config_, options, kCuda0);
  const Training got = TrainWithLohan(config_, options, kCuda0);
  const double losses = MaxRelativeDifference(got.losses, want.losses);
  const double weights = MaxWeightDifference(got, want);
  Report("fp32 streamed (2 buffers)", got, want, losses, weights);
  EXPECT_LE(losses, 1e-6);
  EXPECT_LE(weights, 1e-5);
}

TEST_F(EngineCudaTest, Bf16MatchesAdamWOnFp32Masters) {
  Options options = TrainingOptions(socket(), "cuda-bf16");
  options.dtype = "bf16";
  const Training want = TrainWithAdamW(config_, options, kCuda0);
  const Training got = TrainWithLohan(config_, options, kCuda0);
  const double losses = MaxRelativeDifference(got.losses, want.losses);
  const double weights = MaxWeightDifference(got, want);
  Report("bf16", got, want, losses, weights);
  EXPECT_LE(losses, 1e-3);
  EXPECT_LE(weights, 1e-2);
}

// Gradients summed on the device over 3 backward passes.
TEST_F(EngineCudaTest, GradientAccumulationMatchesAdamW) {
  Options options = TrainingOptions(socket(), "cuda-accumulate");
  options.grad_accumulation_steps = 3;
  const Training want = TrainWithAdamW(config_, options, kCuda0);
  const Training got = TrainWithLohan(config_, options, kCuda0);
  const double losses = MaxRelativeDifference(got.losses, want.losses);
  const double weights = MaxWeightDifference(got, want);
  Report("fp32, grad_accumulation_steps=3", got, want, losses, weights);
  EXPECT_LE(losses, 1e-6);
  EXPECT_LE(weights, 1e-5);
}

// A CUDA module where liblohan_client cannot copy (built without CUDA, or
// no usable driver or GPU) is refused before a job exists, saying why and
// what to do. Runs where the client cannot use CUDA (this check's point:
// machines without a GPU); skipped where it can.
TEST(CudaTransferRefusal, SaysWhyTheClientCannotCopy) {
  if (lohan_cuda_available() == 1) {
    GTEST_SKIP() << "liblohan_client can use CUDA here; the refusal is for "
                    "machines where it cannot";
  }
  try {
    CudaTransfer transfer(kCuda0);
    ADD_FAILURE() << "a CUDA device was accepted without usable CUDA";
  } catch (const LohanError& error) {
    if (lohan_cuda_built_with() == 0) {
      EXPECT_EQ(error.status(), LOHAN_UNIMPLEMENTED);
      EXPECT_THAT(error.what(), HasSubstr("built without CUDA"));
    } else {
      EXPECT_EQ(error.status(), LOHAN_FAILED_PRECONDITION);
      EXPECT_THAT(error.what(),
                  HasSubstr("the module is on cuda:0 but liblohan_client "
                            "cannot use CUDA in this process ("));
      EXPECT_THAT(error.what(), HasSubstr("or train the module on the CPU"));
    }
    std::cout << "refused: " << error.what() << "\n";
  }
}

TEST(CudaTransferRefusal, OnlyACudaDeviceWithAnIndex) {
  for (const torch::Device device :
       {torch::Device(torch::kCPU), torch::Device(torch::kCUDA)}) {
    try {
      CudaTransfer transfer(device);
      ADD_FAILURE() << device << " accepted";
    } catch (const std::invalid_argument& error) {
      EXPECT_THAT(error.what(),
                  HasSubstr("is not a CUDA device with an index"));
    }
  }
}

}  // namespace
}  // namespace lohan::torch_plugin
