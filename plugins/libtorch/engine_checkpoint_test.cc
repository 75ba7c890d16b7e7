// Engine::save, Options::resume_from and Options::resume_job through a
// real lohand (a resumed run is the uninterrupted one, bit for bit; torn
// or mismatched checkpoints and absent jobs are refused), and
// Options::activations = "recompute" against "keep".
#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/libtorch/checkpoint.h"
#include "plugins/libtorch/engine.h"
#include "plugins/libtorch/linear_tanh.h"
#include "plugins/libtorch/lohan_error.h"
#include "plugins/libtorch/test_daemon.h"

namespace lohan::torch_plugin {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class EngineCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lohan-engine-ckpt-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Options OptionsFor(const std::string& job) const {
    Options options;
    options.socket_path = daemon_.socket();
    options.job_name = job;
    options.lr = 1e-2;
    options.beta2 = 0.99;
    options.weight_decay = 0.01;
    return options;
  }

  // Trains `steps` steps, each on its global step's batch; the losses.
  std::vector<float> Train(linear_tanh::Model& model, Engine& engine,
                           int steps) {
    std::vector<float> losses;
    for (int i = 0; i < steps; ++i) {
      auto [x, y] = linear_tanh::MakeBatch(
          config_, static_cast<int64_t>(engine.iteration()) + 1);
      // In the training dtype (bf16 parameters take bf16 inputs).
      x = x.to(model->parameters()[0].scalar_type());
      torch::Tensor loss =
          linear_tanh::Loss(model->forward(x, &engine).to(torch::kFloat32), y);
      loss.backward();
      engine.step();
      losses.push_back(loss.item<float>());
    }
    return losses;
  }

  static void ExpectSameWeights(torch::nn::Module& got,
                                torch::nn::Module& want) {
    const auto a = got.named_parameters();
    const auto b = want.named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::equal(a[i].value(), b[i].value())) << a[i].key();
    }
  }

  TestDaemon daemon_;
  linear_tanh::Config config_;
  fs::path dir_;
};

// fp32 with one buffer per layer, and bf16 (fp32 masters) streamed through
// two shared buffers.
class ResumeTest : public EngineCheckpointTest,
                   public ::testing::WithParamInterface<std::string> {
 protected:
  Options OptionsFor(const std::string& job) const {
    Options options = EngineCheckpointTest::OptionsFor(job);
    if (GetParam() == "bf16-streamed") {
      options.dtype = "bf16";
      options.buffers = "streamed";
      options.stream_buffers = 2;
    }
    return options;
  }
};

TEST_P(ResumeTest, AResumedRunIsTheUninterruptedOneBitForBit) {
  linear_tanh::Model straight = linear_tanh::MakeModel(config_, 3);
  Engine whole(straight.ptr(), straight->block_list(), OptionsFor("whole"));
  if (GetParam() == "bf16-streamed") {
    ASSERT_EQ(whole.buffers(), "streamed");
  }
  const std::vector<float> want = Train(straight, whole, 6);

  linear_tanh::Model first = linear_tanh::MakeModel(config_, 3);
  std::vector<float> losses;
  {
    Engine engine(first.ptr(), first->block_list(), OptionsFor("first"));
    losses = Train(first, engine, 2);
    engine.save((dir_ / "ckpt").string());
    engine.close(/*delete_job=*/true);
  }
  const CheckpointReader reader((dir_ / "ckpt").string());
  EXPECT_EQ(reader.iteration(), 2u);

  // Another init: the checkpoint's masters replace it.
  linear_tanh::Model second = linear_tanh::MakeModel(config_, 99);
  Options options = OptionsFor("second");
  options.resume_from = (dir_ / "ckpt").string();
  Engine engine(second.ptr(), second->block_list(), options);
  EXPECT_EQ(engine.iteration(), 2u);
  ExpectSameWeights(*second, *first);
  const std::vector<float> rest = Train(second, engine, 4);
  losses.insert(losses.end(), rest.begin(), rest.end());
  EXPECT_EQ(losses, want);
  ExpectSameWeights(*second, *straight);

  // The moments too: a save of each holds the same bits.
  engine.save((dir_ / "resumed").string());
  whole.save((dir_ / "whole").string());
  const CheckpointReader a((dir_ / "resumed").string());
  const CheckpointReader b((dir_ / "whole").string());
  for (const auto& item : straight->named_parameters()) {
    const auto sizes = item.value().sizes();
    const std::vector<int64_t> shape(sizes.begin(), sizes.end());
    for (const std::string part : {"weights", "exp_avg", "exp_avg_sq"}) {
      std::vector<float> x(item.value().numel());
      std::vector<float> y(item.value().numel());
      a.Read(item.key(), part, shape, x.data());
      b.Read(item.key(), part, shape, y.data());
      EXPECT_EQ(x, y) << part << "/" << item.key();
    }
  }
  engine.close(true);
  whole.close(true);
}

// Options::resume_job: 3 steps, the job kept (close(false)), a module of
// another init continues it for 3 more: the uninterrupted 6 steps, bit for
// bit.
TEST_P(ResumeTest, AResumedJobIsTheUninterruptedRunBitForBit) {
  linear_tanh::Model straight = linear_tanh::MakeModel(config_, 3);
  Engine whole(straight.ptr(), straight->block_list(), OptionsFor("whole"));
  const std::vector<float> want = Train(straight, whole, 6);

  linear_tanh::Model first = linear_tanh::MakeModel(config_, 3);
  std::vector<float> losses;
  std::string job_id;
  {
    Engine engine(first.ptr(), first->block_list(), OptionsFor("kept"));
    losses = Train(first, engine, 3);
    job_id = engine.job_id();
    engine.close(/*delete_job=*/false);
  }

  linear_tanh::Model second = linear_tanh::MakeModel(config_, 99);
  Options options = OptionsFor("kept");
  options.resume_job = true;
  Engine engine(second.ptr(), second->block_list(), options);
  EXPECT_EQ(engine.job_id(), job_id);
  EXPECT_EQ(engine.iteration(), 3u);
  if (GetParam() == "bf16-streamed") {
    EXPECT_EQ(engine.buffers(), "streamed");
  }
  ExpectSameWeights(*second, *first);
  const std::vector<float> rest = Train(second, engine, 3);
  losses.insert(losses.end(), rest.begin(), rest.end());
  EXPECT_EQ(engine.iteration(), 6u);
  EXPECT_EQ(losses, want);
  ExpectSameWeights(*second, *straight);
  engine.close(/*delete_job=*/true);
}

INSTANTIATE_TEST_SUITE_P(Buffers, ResumeTest,
                         ::testing::Values("fp32-resident", "bf16-streamed"),
                         [](const auto& info) {
                           std::string name = info.param;
                           name.erase(name.find('-'), 1);
                           return name;
                         });

TEST_F(EngineCheckpointTest, RefusesACheckpointOfAnotherModelOrTorn) {
  linear_tanh::Model model = linear_tanh::MakeModel(config_, 3);
  {
    Engine engine(model.ptr(), model->block_list(), OptionsFor("source"));
    Train(model, engine, 1);
    engine.save((dir_ / "ckpt").string());
    engine.close(true);
  }
  linear_tanh::Config wider = config_;
  wider.dim = 8;
  linear_tanh::Model other = linear_tanh::MakeModel(wider, 3);
  Options options = OptionsFor("other");
  options.resume_from = (dir_ / "ckpt").string();
  try {
    Engine engine(other.ptr(), other->block_list(), options);
    FAIL() << "resumed another model's checkpoint";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(),
                HasSubstr("has shape (4, 16), the model's (4, 8)"));
  }
  fs::resize_file(dir_ / "ckpt" / kWeightsFile,
                  fs::file_size(dir_ / "ckpt" / kWeightsFile) - 1);
  options.job_name = "torn";
  try {
    Engine engine(model.ptr(), model->block_list(), options);
    FAIL() << "resumed a torn checkpoint";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("is torn: model.safetensors"));
  }
  options.resume_from = (dir_ / "missing").string();
  EXPECT_THROW(Engine(model.ptr(), model->block_list(), options),
               std::invalid_argument);
}

TEST_F(EngineCheckpointTest, ResumingAJobThatDoesNotExistIsRefused) {
  linear_tanh::Model model = linear_tanh::MakeModel(config_, 3);
  Options options = OptionsFor("absent");
  options.resume_job = true;
  try {
    Engine engine(model.ptr(), model->block_list(), options);
    ADD_FAILURE() << "resumed a job that does not exist";
  } catch (const LohanError& error) {
    EXPECT_EQ(error.status(), LOHAN_NOT_FOUND);
    EXPECT_STREQ(error.what(),
                 "resume_job=true but you have no job named \"absent\" on "
                 "this daemon; start it without resume_job first (lohanctl "
                 "jobs lists your jobs)");
  }
  // Nothing was created: the name is free for a new job.
  options.resume_job = false;
  Engine created(model.ptr(), model->block_list(), options);
  EXPECT_EQ(created.iteration(), 0u);
  created.close(/*delete_job=*/true);
}

TEST_F(EngineCheckpointTest, SavesBetweenStepsOnly) {
  linear_tanh::Model model = linear_tanh::MakeModel(config_, 3);
  Engine engine(model.ptr(), model->block_list(), OptionsFor("mid-step"));
  auto [x, y] = linear_tanh::MakeBatch(config_, 1);
  linear_tanh::Loss(model->forward(x, &engine), y).backward();
  try {
    engine.save((dir_ / "ckpt").string());
    FAIL() << "saved in the middle of a step";
  } catch (const std::logic_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("call step() first"));
  }
  EXPECT_FALSE(fs::exists(dir_ / "ckpt"));
  engine.step();
  engine.save((dir_ / "ckpt").string(), /*with_optimizer=*/false);
  const CheckpointReader reader((dir_ / "ckpt").string());
  EXPECT_EQ(reader.iteration(), 1u);
  EXPECT_TRUE(reader.moments().empty());
  engine.close(true);
}

// Nodes of the autograd graph behind `output`.
size_t GraphNodes(const torch::Tensor& output) {
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> work = {output.grad_fn().get()};
  while (!work.empty()) {
    torch::autograd::Node* node = work.back();
    work.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      work.push_back(edge.function.get());
    }
  }
  return seen.size();
}

TEST_F(EngineCheckpointTest, RecomputeTrainsAsKeepBitForBitWithASmallerGraph) {
  config_.blocks = 4;
  std::vector<std::vector<float>> losses;
  std::vector<size_t> nodes;
  std::vector<linear_tanh::Model> models;
  for (const std::string policy : {"keep", "recompute"}) {
    models.push_back(linear_tanh::MakeModel(config_, 5));
    linear_tanh::Model& model = models.back();
    Options options = OptionsFor(policy);
    options.activations = policy;
    Engine engine(model.ptr(), model->block_list(), options);
    auto [x, y] = linear_tanh::MakeBatch(config_, 1);
    nodes.push_back(
        GraphNodes(linear_tanh::Loss(model->forward(x, &engine), y)));
    losses.push_back(Train(model, engine, 5));
    engine.close(true);
  }
  std::cout << "graph nodes: keep " << nodes[0] << ", recompute " << nodes[1]
            << "\n";
  EXPECT_EQ(losses[0], losses[1]);
  ExpectSameWeights(*models[1], *models[0]);
  // keep: per block addmm, tanh and the weight's transpose; recompute: one
  // node per block.
  EXPECT_LE(nodes[1] + 2 * static_cast<size_t>(config_.blocks), nodes[0]);
}

}  // namespace
}  // namespace lohan::torch_plugin
