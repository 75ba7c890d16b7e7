// Training through a real lohand: the synthetic client (train_client) runs
// iterations over the control and data planes; every fp32 master weight it
// reads back, and every 16-bit weight the daemon published, is checked
// against a float64 AdamW reference computed here.
//
// Tolerance: |w - reference| <= 2e-5 * (1 + |reference|) per weight. The
// daemon's Adam runs in fp32 (exactly torch's arithmetic, see daemon/optim);
// against float64 over a few steps the difference is a few fp32 ulps of the
// update, far inside this bound, while any wrong step count, bias
// correction, clip scale or lost update is larger by orders of magnitude.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <array>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/control_client.h"
#include "client/data_plane.h"
#include "daemon/optim/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/model_spec_checks.h"
#include "tests/dumped_weights.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/raw_control.h"
#include "tests/harness/subprocess.h"
#include "tests/synthetic_model.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;

const std::vector<uint64_t> kLayers = {1000, 5000, 333};
constexpr uint64_t kSeed = 7;

// A RegisterModel request for `job_id`: layers of `sizes`, AdamW with
// lr 1e-3, betas (0.9, 0.999), eps 1e-8.
v1::RegisterModelRequest ModelRequest(const std::string& job_id,
                                      const std::vector<uint64_t>& sizes,
                                      v1::DType dtype) {
  v1::RegisterModelRequest request;
  request.set_job_id(job_id);
  for (uint64_t n : sizes) request.mutable_model()->add_layer_elements(n);
  request.mutable_model()->set_dtype(dtype);
  request.mutable_model()->mutable_adam()->set_lr(1e-3);
  request.mutable_model()->mutable_adam()->set_beta1(0.9);
  request.mutable_model()->mutable_adam()->set_beta2(0.999);
  request.mutable_model()->mutable_adam()->set_eps(1e-8);
  return request;
}

class TrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start(dir_.path());
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
  }

  RunResult Train(const std::vector<std::string>& extra,
                  const std::string& layers = "1000,5000,333",
                  const std::string& job = "synthetic") {
    return RunTrainer({Runfile("tests/train_client")}, job, layers, extra);
  }

  // The same model through the C ABI alone, asynchronously
  // (tests/async_client.cc): every gradient handed over from host memory
  // without waiting, the tickets waited for before ITER_END.
  RunResult TrainAsync(const std::vector<std::string>& extra,
                       const std::string& layers = "1000,5000,333") {
    return RunTrainer({Runfile("tests/async_client"), "train"},
                      "synthetic-async", layers, extra);
  }

  // `command` on the synthetic model (seed 7, weights dumped for
  // ExpectWeights).
  RunResult RunTrainer(std::vector<std::string> command, const std::string& job,
                       const std::string& layers,
                       const std::vector<std::string>& extra) {
    for (const std::string& arg :
         {std::string("--socket"), daemon_->socket(), std::string("--job"), job,
          std::string("--layers"), layers, std::string("--seed"),
          std::string("7"), std::string("--out"), dir_.path() + "/weights"}) {
      command.push_back(arg);
    }
    for (const std::string& arg : extra) command.push_back(arg);
    return RunCommand(command);
  }

  // Waits until the daemon has given every arena back to its host pool.
  bool WaitForPoolFreed(ControlClient& client) {
    for (int i = 0; i < 3000; ++i) {
      auto status = client.GetStatus();
      if (status.ok() && status->pool().used_bytes() == 0) return true;
      usleep(10 * 1000);
    }
    return false;
  }

  // A job named `name` with `pool_bytes` of host pool, attached by this
  // process, and its data plane.
  struct OpenJob {
    std::unique_ptr<ControlClient> client;
    v1::Job job;
    std::unique_ptr<DataPlane> plane;
  };
  void Open(const std::string& name, uint64_t pool_bytes, OpenJob& out) {
    auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
    ASSERT_TRUE(client.ok()) << client.status();
    v1::JobSpec spec;
    spec.set_name(name);
    spec.set_host_pool_bytes(pool_bytes);
    auto job = (*client)->CreateJob(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE((*client)->AttachJob(job->id()).ok());
    auto plane =
        DataPlane::Open((*client)->hello().data_socket_path(), job->id());
    ASSERT_TRUE(plane.ok()) << plane.status();
    out = {*std::move(client), *std::move(job), *std::move(plane)};
  }

  // Compares the dumped weights with the reference after `iterations`.
  void ExpectWeights(int iterations, bool bf16, double max_norm,
                     double grad_scale) {
    ExpectWeightsOf(kLayers, iterations, bf16, max_norm, grad_scale);
  }
  void ExpectWeightsOf(const std::vector<uint64_t>& layers, int iterations,
                       bool bf16, double max_norm, double grad_scale) {
    double worst = 0;
    const absl::Status matches = CheckDumpedWeights(dir_.path() + "/weights",
                                                    {.layers = layers,
                                                     .iterations = iterations,
                                                     .bf16 = bf16,
                                                     .max_norm = max_norm,
                                                     .grad_scale = grad_scale,
                                                     .seed = kSeed},
                                                    &worst);
    ASSERT_TRUE(matches.ok()) << matches;
    RecordProperty("worst_relative_error", absl::StrCat(worst));
  }

  PublicTempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(TrainingTest, Fp32MatchesReferenceAdamW) {
  RunResult result = Train({"--iterations", "4", "--dtype", "fp32"});
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err << daemon_->Log();
  EXPECT_THAT(result.out, HasSubstr("iteration 4 norm"));
  ExpectWeights(4, /*bf16=*/false, 0.0, 0.01);
}

TEST_F(TrainingTest, Bf16MatchesReferenceAdamW) {
  RunResult result = Train({"--iterations", "3", "--dtype", "bf16"});
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err << daemon_->Log();
  ExpectWeights(3, /*bf16=*/true, 0.0, 0.01);
}

TEST_F(TrainingTest, AsyncCAbiFp32MatchesReferenceAdamW) {
  RunResult result = TrainAsync({"--iterations", "4", "--dtype", "fp32"});
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err << daemon_->Log();
  EXPECT_THAT(result.out, HasSubstr("iteration 4 norm"));
  ExpectWeights(4, /*bf16=*/false, 0.0, 0.01);
}

TEST_F(TrainingTest, AsyncCAbiBf16FromThreeThreadsMatchesReferenceAdamW) {
  // Each layer's gradient handed over by a different thread; the published
  // 16-bit weights read back with lohan_model_weights_to_host.
  RunResult result = TrainAsync(
      {"--iterations", "3", "--dtype", "bf16", "--grad-threads", "3"});
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err << daemon_->Log();
  ExpectWeights(3, /*bf16=*/true, 0.0, 0.01);
}

TEST_F(TrainingTest, AsyncCAbiStreamedLayoutWaitsForSharedBuffers) {
  // 8 layers share 2 gradient buffers; every gradient is handed over without
  // waiting, from two threads: each copy into a buffer waits by itself for
  // the buffer's previous GRAD_READY (which stores that gradient first).
  RunResult result = TrainAsync(
      {"--dtype", "bf16", "--host-pool", "786432", "--chunk", "8192",
       "--iterations", "3", "--max-norm", "1.0", "--grad-scale", "1.0",
       "--grad-slots", "2", "--weight-slots", "2", "--grad-threads", "2"},
      "32768,32768,32768,32768,32768,32768,32768,32768");
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err << daemon_->Log();
  EXPECT_THAT(result.out, HasSubstr("iteration 3 norm"));
  ExpectWeightsOf(std::vector<uint64_t>(8, 32768), 3, /*bf16=*/true, 1.0, 1.0);
}

TEST_F(TrainingTest, ClippingIsExactAlthoughUpdatesRunEagerly) {
  // Gradient norms of ~46 and ~920 clipped to 1: every iteration is redone.
  RunResult result =
      Train({"--iterations", "3", "--max-norm", "1.0", "--grad-scale", "1.0"});
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err << daemon_->Log();
  EXPECT_THAT(result.out, HasSubstr("flags 1"));  // kIterEndClipped
  ExpectWeights(3, /*bf16=*/false, 1.0, 1.0);
}

TEST_F(TrainingTest, ClientKilledMidIterationLosesOnlyThatIteration) {
  // Two iterations commit, the third dies half-way through backward.
  RunResult died = Train({"--iterations", "3", "--die-in-iteration", "3"});
  EXPECT_EQ(died.exit_code, 128 + SIGKILL) << died.out << daemon_->Log();
  EXPECT_THAT(died.out, HasSubstr("iteration 2 norm"));
  // The daemon frees the arena...
  auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(WaitForPoolFreed(**client)) << daemon_->Log();
  // ...and a new process re-attaches at iteration 2 and trains on: its
  // first iteration is the third, so the result is that of 4 iterations.
  RunResult resumed = Train({"--iterations", "2"});
  ASSERT_EQ(resumed.exit_code, 0)
      << resumed.out << resumed.err << daemon_->Log();
  EXPECT_THAT(resumed.out, HasSubstr("iteration 3 norm"));
  EXPECT_THAT(resumed.out, HasSubstr("iteration 4 norm"));
  ExpectWeights(4, /*bf16=*/false, 0.0, 0.01);
}

TEST_F(TrainingTest, StatesSurviveADaemonRestart) {
  // Every iteration durable (lohand's default is by time).
  ASSERT_EQ(Train({"--iterations", "2", "--commit-interval", "1"}).exit_code, 0)
      << daemon_->Log();
  ASSERT_EQ(daemon_->Stop(SIGKILL), 128 + SIGKILL);
  auto restarted = DaemonProcess::Start(dir_.path());
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  daemon_ = *std::move(restarted);
  RunResult resumed = Train({"--iterations", "1"});
  ASSERT_EQ(resumed.exit_code, 0)
      << resumed.out << resumed.err << daemon_->Log();
  EXPECT_THAT(resumed.out, HasSubstr("iteration 3 norm"));
  ExpectWeights(3, /*bf16=*/false, 0.0, 0.01);
}

TEST_F(TrainingTest, StatusShowsTrainingProgress) {
  auto trainer = BackgroundProcess::Start(
      {Runfile("tests/train_client"), "--socket", daemon_->socket(), "--job",
       "watched", "--layers", "1000,5000,333", "--iterations", "2",
       "--max-norm", "1.0", "--grad-scale", "1.0", "--out",
       dir_.path() + "/weights", "--hold"});
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  // The first line is iteration 1's; wait for the process to hold.
  auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
  ASSERT_TRUE(client.ok());
  v1::SessionStatus session;
  for (int i = 0; i < 3000; ++i) {
    auto status = (*client)->GetStatus();
    ASSERT_TRUE(status.ok());
    if (status->sessions_size() == 1 && status->sessions(0).iteration() == 2) {
      session = status->sessions(0);
      break;
    }
    usleep(10 * 1000);
  }
  EXPECT_EQ(session.iteration(), 2u) << daemon_->Log();
  EXPECT_EQ(session.layers(), 3u);
  EXPECT_EQ(session.parameters(), 6333u);
  EXPECT_EQ(session.pid(), (*trainer)->pid());
  EXPECT_EQ(session.clipped_iterations(), 2u);
  EXPECT_GT(session.last_global_norm(), 1.0);
  EXPECT_GT(session.last_iteration_seconds(), 0.0);
  EXPECT_EQ(session.failed_requests(), 0u);
  // The states (12 bytes a parameter) all in the state tier ("auto": this
  // machine has room), read from RAM, written to the SSDs at the durable
  // iterations only (lohand's default: a minute apart), so status says
  // what a crash of lohand would lose.
  EXPECT_EQ(session.state_bytes(), 6333u * 12);
  EXPECT_EQ(session.state_tier_bytes(), session.state_bytes());
  EXPECT_GE(session.state_tier_share_bytes(), session.state_bytes());
  RunResult text = RunCommand({Runfile("client/ctl/lohanctl"), "--socket",
                               daemon_->socket(), "status"});
  EXPECT_THAT(text.out, HasSubstr("training (open data planes)"));
  EXPECT_THAT(text.out, HasSubstr(session.job_id()));
  EXPECT_THAT(text.out, HasSubstr("states 74.2 KiB: 74.2 KiB in RAM (share "));
  EXPECT_THAT(text.out,
              HasSubstr("0 B on the SSDs only, durable at iteration 0 (a "
                        "crash of lohand now loses 2 iterations, "));
}

TEST_F(TrainingTest, RegisterModelRefusesBadSpecs) {
  auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
  ASSERT_TRUE(client.ok());
  v1::JobSpec spec;
  spec.set_name("specs");
  spec.set_host_pool_bytes(1 << 20);
  auto job = (*client)->CreateJob(spec);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE((*client)->AttachJob(job->id()).ok());
  auto good = [&]() { return ModelRequest(job->id(), {100}, v1::DTYPE_BF16); };
  // No data plane open yet.
  EXPECT_EQ((*client)->RegisterModel(good()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto plane =
      DataPlane::Open((*client)->hello().data_socket_path(), job->id());
  ASSERT_TRUE(plane.ok()) << plane.status();
  struct Case {
    std::function<void(v1::RegisterModelRequest&)> mutate;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {[](auto& r) { r.mutable_model()->set_dtype(v1::DTYPE_UNSPECIFIED); },
       absl::StatusCode::kInvalidArgument},
      {[](auto& r) { r.mutable_model()->set_max_grad_norm(-1); },
       absl::StatusCode::kInvalidArgument},
      {[](auto& r) { r.mutable_model()->clear_layer_elements(); },
       absl::StatusCode::kInvalidArgument},
      {[](auto& r) { r.mutable_model()->add_layer_elements(0); },
       absl::StatusCode::kInvalidArgument},
      {[](auto& r) { r.mutable_model()->add_layer_elements(1 << 30); },
       absl::StatusCode::kResourceExhausted},
      // Takes 400 KiB of slots before it fails: twice, so a leak would
      // leave no room for the spec below.
      {[](auto& r) {
         r.mutable_model()->set_layer_elements(0, 100 * 1024);
         r.mutable_model()->add_layer_elements(1 << 30);
       },
       absl::StatusCode::kResourceExhausted},
      {[](auto& r) {
         r.mutable_model()->set_layer_elements(0, 100 * 1024);
         r.mutable_model()->add_layer_elements(1 << 30);
       },
       absl::StatusCode::kResourceExhausted},
      {[](auto& r) { r.set_job_id("j-999999"); }, absl::StatusCode::kNotFound},
  };
  for (const Case& c : cases) {
    v1::RegisterModelRequest request = good();
    c.mutate(request);
    // lohand's own answer, to a client that skips liblohan_client's checks.
    absl::Status status =
        RegisterModelPastTheClientChecks(daemon_->socket(), request);
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_FALSE(status.message().empty());
    // ControlClient refuses a spec the checks refuse with the same words,
    // naming the field, before it reaches lohand.
    absl::Status client_side = (*client)->RegisterModel(request).status();
    EXPECT_EQ(client_side.code(), c.code) << client_side;
    if (c.code == absl::StatusCode::kInvalidArgument) {
      EXPECT_EQ(client_side.message(), status.message());
      EXPECT_FALSE(RefusedField(client_side).empty()) << client_side;
    } else {
      EXPECT_EQ(RefusedField(client_side), "") << client_side;
    }
  }
  // After all that (the refused ones gave their slots back), a spec that
  // needs most of the arena registers on the same data plane.
  v1::RegisterModelRequest big = good();
  // 200 KiB gradient + 200 KiB weights + 400 KiB fp32 staging.
  big.mutable_model()->set_layer_elements(0, 100 * 1024);
  EXPECT_TRUE((*client)->RegisterModel(big).ok()) << daemon_->Log();
}

TEST_F(TrainingTest, RegisterModelRefusesBadNoWeightDecayRanges) {
  OpenJob opened;
  ASSERT_NO_FATAL_FAILURE(Open("no-decay", 1 << 20, opened));
  ControlClient& client = *opened.client;
  auto request = [&](std::vector<std::array<uint64_t, 3>> ranges) {
    v1::RegisterModelRequest r =
        ModelRequest(opened.job.id(), {100, 50}, v1::DTYPE_BF16);
    r.mutable_model()->mutable_adam()->set_weight_decay(0.1);
    r.mutable_model()->mutable_adam()->set_decoupled_weight_decay(true);
    v1::ParamGroup* exempt = r.mutable_model()->add_param_groups();
    exempt->set_name("no_weight_decay");
    exempt->set_lr_scale(1.0);
    for (const auto& [layer, begin, end] : ranges) {
      v1::ElementRange* range = exempt->add_ranges();
      range->set_layer(static_cast<uint32_t>(layer));
      range->set_begin(begin);
      range->set_end(end);
    }
    return r;
  };
  struct Case {
    std::vector<std::array<uint64_t, 3>> ranges;
    std::string message;
  };
  const Case cases[] = {
      {{{0, 0, 10}, {2, 0, 1}},
       "no_weight_decay range 1 (layer 2, [0, 1)): the model has 2 layers"},
      {{{0, 5, 5}}, "no_weight_decay range [5, 5) of layer 0 is empty"},
      {{{1, 9, 3}}, "no_weight_decay range [9, 3) of layer 1 is empty"},
      {{{1, 40, 51}},
       "no_weight_decay range [40, 51) of layer 1 ends past the layer's 50 "
       "elements"},
      {{{0, 30, 40}, {0, 15, 25}, {0, 10, 20}},
       "no_weight_decay range [15, 25) of layer 0 overlaps [10, 20)"},
  };
  for (const Case& c : cases) {
    absl::Status status = client.RegisterModel(request(c.ranges)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
  }
  // In any order, touching, up to a layer's last element: registered.
  auto registered = client.RegisterModel(
      request({{1, 0, 50}, {0, 90, 100}, {0, 0, 10}, {0, 10, 12}}));
  EXPECT_TRUE(registered.ok()) << registered.status() << daemon_->Log();
}

TEST_F(TrainingTest, RegisterModelRefusesBadParamGroups) {
  OpenJob opened;
  ASSERT_NO_FATAL_FAILURE(Open("groups", 1 << 20, opened));
  ControlClient& client = *opened.client;
  struct Group {
    double lr_scale;
    double weight_decay;
    std::vector<std::array<uint64_t, 3>> ranges;
  };
  auto request = [&](const std::vector<Group>& groups) {
    v1::RegisterModelRequest r =
        ModelRequest(opened.job.id(), {100, 50}, v1::DTYPE_BF16);
    // Biases without decay as a group of their own, first; the others
    // named as the caller numbers them.
    v1::ParamGroup* no_decay = r.mutable_model()->add_param_groups();
    no_decay->set_name("no_weight_decay");
    no_decay->set_lr_scale(1.0);
    v1::ElementRange* exempt = no_decay->add_ranges();
    exempt->set_layer(0);
    exempt->set_begin(0);
    exempt->set_end(10);
    for (size_t i = 0; i < groups.size(); ++i) {
      const Group& g = groups[i];
      v1::ParamGroup* group = r.mutable_model()->add_param_groups();
      group->set_name(absl::StrCat("param_groups[", i, "]"));
      group->set_lr_scale(g.lr_scale);
      group->set_weight_decay(g.weight_decay);
      for (const auto& [layer, begin, end] : g.ranges) {
        v1::ElementRange* range = group->add_ranges();
        range->set_layer(static_cast<uint32_t>(layer));
        range->set_begin(begin);
        range->set_end(end);
      }
    }
    return r;
  };
  struct Case {
    std::vector<Group> groups;
    std::string message;
  };
  const Case cases[] = {
      {{{0.5, 0.0, {{3, 0, 1}}}},
       "param_groups[0] range 0 (layer 3, [0, 1)): the model has 2 layers"},
      {{{0.5, 0.0, {{0, 20, 30}}}, {2.0, 0.1, {{0, 25, 40}}}},
       "param_groups[1] range [25, 40) of layer 0 overlaps [20, 30) "
       "(param_groups[0])"},
      {{{0.5, 0.0, {{0, 5, 15}}}},
       "param_groups[0] range [5, 15) of layer 0 overlaps [0, 10) "
       "(no_weight_decay)"},
      {{{-0.5, 0.0, {{1, 0, 5}}}},
       "param_groups[0] has lr_scale -0.5 and weight_decay 0; both must be "
       "finite and >= 0"},
      {{{1.0, std::numeric_limits<double>::infinity(), {{1, 0, 5}}}},
       "param_groups[0] has lr_scale 1 and weight_decay inf"},
      {{{1.0, 0.0, {{1, 7, 7}}}},
       "param_groups[0] range [7, 7) of layer 1 is empty"},
  };
  for (const Case& c : cases) {
    absl::Status status = client.RegisterModel(request(c.groups)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
  }
  auto registered = client.RegisterModel(request(
      {{0.5, 0.0, {{0, 10, 20}, {1, 0, 50}}}, {3.0, 0.2, {{0, 90, 100}}}}));
  EXPECT_TRUE(registered.ok()) << registered.status() << daemon_->Log();
}

TEST_F(TrainingTest, MalformedRingEntriesFailOneByOneAndHurtNothing) {
  OpenJob opened;
  ASSERT_NO_FATAL_FAILURE(Open("fuzzed", 4 << 20, opened));
  ControlClient& client = *opened.client;
  DataPlane& plane = *opened.plane;
  const v1::Job& job = opened.job;
  v1::RegisterModelRequest request =
      ModelRequest(job.id(), {64}, v1::DTYPE_FP32);
  auto registered = client.RegisterModel(request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  plane.SetErrorText(registered->error_text_offset(),
                     registered->error_text_bytes());
  // Random entries, and random entries with a valid op: each fails on its
  // own with a status and a text; none is acted on.
  uint64_t state = 12345;
  auto next = [&]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state;
  };
  for (int i = 0; i < 2000; ++i) {
    SubmissionEntry entry;
    uint64_t words[8];
    for (uint64_t& word : words) word = next();
    std::memcpy(&entry, words, sizeof(entry));
    if (i % 2 == 1) entry.op = static_cast<uint16_t>(1 + next() % 12);
    auto completion = plane.Call(entry, absl::Seconds(60));
    ASSERT_FALSE(completion.ok()) << "entry " << i << " was accepted";
    EXPECT_NE(completion.status().message(), "(no text)");
  }
  // The daemon still serves this job correctly, and everyone else.
  float* staging =
      reinterpret_cast<float*>(plane.arena() + registered->staging_offset());
  for (int i = 0; i < 64; ++i) staging[i] = 1.0f;
  SubmissionEntry init{};
  init.op = static_cast<uint16_t>(RingOp::kInitWeights);
  init.slot_offset = registered->staging_offset();
  init.length = 64 * 4;
  EXPECT_TRUE(plane.Call(init, absl::Seconds(60)).ok());
  EXPECT_TRUE(client.GetStatus().ok());
}

// A job whose arena cannot hold every layer's gradient and weight buffers:
// 8 layers x 32768 parameters need 1 MiB of bf16 buffers resident (2 MiB in
// fp32), more than the job's arena; with 2 gradient and 2 weight buffers
// (the gradients and 16-bit weights streamed through the SSDs) the same
// job trains, and to the same weights.
TEST_F(TrainingTest, StreamedLayoutTrainsWhereResidentDoesNotFit) {
  const std::string layers = "32768,32768,32768,32768,32768,32768,32768,32768";
  const std::vector<uint64_t> sizes(8, 32768);
  struct Case {
    std::string job, dtype, pool;
    double max_norm, grad_scale;
  };
  // bf16 with every iteration clipped (redo from the stored gradients);
  // fp32 without clipping.
  const Case cases[] = {{"streamed-bf16", "bf16", "786432", 1.0, 1.0},
                        {"streamed-fp32", "fp32", "1310720", 0.0, 0.01}};
  for (const Case& c : cases) {
    const bool bf16 = c.dtype == "bf16";
    const std::vector<std::string> common = {
        "--dtype",      c.dtype,
        "--host-pool",  c.pool,
        "--chunk",      "8192",
        "--iterations", "3",
        "--max-norm",   absl::StrCat(c.max_norm),
        "--grad-scale", absl::StrCat(c.grad_scale)};
    RunResult resident = Train(common, layers, c.job);
    EXPECT_EQ(resident.exit_code, 1) << resident.out << daemon_->Log();
    EXPECT_THAT(resident.out, HasSubstr("RESOURCE_EXHAUSTED"));
    EXPECT_THAT(resident.out, HasSubstr("grad_slots"));  // the way out
    std::vector<std::string> streamed = common;
    for (const char* arg : {"--grad-slots", "2", "--weight-slots", "2"}) {
      streamed.push_back(arg);
    }
    RunResult result = Train(streamed, layers, c.job);
    ASSERT_EQ(result.exit_code, 0)
        << c.job << "\n"
        << result.out << result.err << daemon_->Log();
    EXPECT_THAT(result.out, HasSubstr("buffers 2 gradient 2 weight"));
    EXPECT_THAT(result.out, HasSubstr("iteration 3 norm"));
    if (c.max_norm > 0) {
      EXPECT_THAT(result.out, HasSubstr("flags 1"));  // kIterEndClipped
    }
    ExpectWeightsOf(sizes, 3, bf16, c.max_norm, c.grad_scale);
  }
}

TEST_F(TrainingTest, StreamedClientKilledMidIterationResumesExactly) {
  const std::vector<std::string> streamed = {
      "--dtype", "bf16", "--grad-slots", "2", "--weight-slots", "2"};
  std::vector<std::string> args = streamed;
  for (const char* arg : {"--iterations", "3", "--die-in-iteration", "3"}) {
    args.push_back(arg);
  }
  RunResult died = Train(args);
  EXPECT_EQ(died.exit_code, 128 + SIGKILL) << died.out << daemon_->Log();
  EXPECT_THAT(died.out, HasSubstr("iteration 2 norm"));
  auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(WaitForPoolFreed(**client)) << daemon_->Log();
  // The half-submitted iteration's gradients went with it: the store holds
  // the states (1 + 3 + 1 chunks of 2048), their 16-bit copies and the meta,
  // no scratch.
  auto status = (*client)->GetStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->store().tensors(), 5u + 5 + 1) << daemon_->Log();
  args = streamed;
  for (const char* arg : {"--iterations", "2"}) args.push_back(arg);
  RunResult resumed = Train(args);
  ASSERT_EQ(resumed.exit_code, 0)
      << resumed.out << resumed.err << daemon_->Log();
  EXPECT_THAT(resumed.out, HasSubstr("iteration 3 norm"));
  EXPECT_THAT(resumed.out, HasSubstr("iteration 4 norm"));
  ExpectWeights(4, /*bf16=*/true, 0.0, 0.01);
  status = (*client)->GetStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->store().tensors(), 5u + 5 + 1);
}

TEST_F(TrainingTest, DaemonKilledMidStreamedIterationLeavesNoScratch) {
  // The client stops half-way through backward: one layer's gradient is in
  // the store as scratch (an uncommitted tensor) when the daemon dies. No
  // state tier: with room in one, streamed gradients wait in its memory,
  // not in the store.
  const std::vector<std::string> no_tier = {"--state-tier", "0"};
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  {
    auto started = DaemonProcess::Start(dir_.path(), no_tier);
    ASSERT_TRUE(started.ok()) << started.status();
    daemon_ = *std::move(started);
  }
  auto trainer = BackgroundProcess::Start(
      {Runfile("tests/train_client"), "--socket", daemon_->socket(), "--job",
       "synthetic", "--layers", "1000,5000,333", "--dtype", "bf16",
       "--grad-slots", "1", "--weight-slots", "1", "--iterations", "1",
       "--hold-in-iteration", "1", "--out", dir_.path() + "/weights"});
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
  ASSERT_TRUE(client.ok());
  // States (5 chunks), their 16-bit copies, the meta, and layer 2's
  // gradient (1 chunk).
  uint64_t tensors = 0;
  for (int i = 0; i < 3000 && tensors != 12; ++i) {
    auto status = (*client)->GetStatus();
    ASSERT_TRUE(status.ok());
    tensors = status->store().tensors();
    if (tensors != 12) usleep(10 * 1000);
  }
  ASSERT_EQ(tensors, 12u) << daemon_->Log();
  client->reset();
  ASSERT_EQ(daemon_->Stop(SIGKILL), 128 + SIGKILL);
  (*trainer)->Stop(SIGKILL);
  auto restarted = DaemonProcess::Start(dir_.path(), no_tier);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  daemon_ = *std::move(restarted);
  // The daemon drops it at start, before the job registers again.
  client = ControlClient::Connect({.socket_path = daemon_->socket()});
  ASSERT_TRUE(client.ok());
  auto status = (*client)->GetStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->store().tensors(), 11u) << daemon_->Log();
  // And the job trains on from its last commit (none: iteration 1 again).
  RunResult resumed = Train({"--dtype", "bf16", "--grad-slots", "1",
                             "--weight-slots", "1", "--iterations", "2"});
  ASSERT_EQ(resumed.exit_code, 0)
      << resumed.out << resumed.err << daemon_->Log();
  EXPECT_THAT(resumed.out, HasSubstr("iteration 2 norm"));
  ExpectWeights(2, /*bf16=*/true, 0.0, 0.01);
}

TEST_F(TrainingTest, StreamedLayoutRefusesWrongSlotsAndKeepsServing) {
  OpenJob opened;
  ASSERT_NO_FATAL_FAILURE(Open("slots", 4 << 20, opened));
  ControlClient& client = *opened.client;
  DataPlane& plane = *opened.plane;
  const v1::Job& job = opened.job;
  const std::vector<uint64_t> sizes = {1000, 3000, 500, 2000};
  v1::RegisterModelRequest request =
      ModelRequest(job.id(), sizes, v1::DTYPE_BF16);
  request.mutable_model()->set_grad_slots(2);
  request.mutable_model()->set_weight_slots(1);
  auto registered = client.RegisterModel(request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  plane.SetErrorText(registered->error_text_offset(),
                     registered->error_text_bytes());
  EXPECT_EQ(registered->grad_slots(), 2u);
  EXPECT_EQ(registered->weight_slots(), 1u);
  const uint64_t grad0 = registered->layers(0).grad_offset();
  const uint64_t grad1 = registered->layers(1).grad_offset();
  const uint64_t weight = registered->layers(0).weight_offset();
  EXPECT_NE(grad0, grad1);
  EXPECT_EQ(registered->layers(2).grad_offset(), grad0);  // layer % K
  EXPECT_EQ(registered->layers(3).grad_offset(), grad1);
  for (size_t l = 0; l < sizes.size(); ++l) {
    EXPECT_EQ(registered->layers(l).weight_offset(), weight);
    EXPECT_EQ(registered->layers(l).bytes(), sizes[l] * 2);
  }
  uint8_t* arena = plane.arena();
  float* staging =
      reinterpret_cast<float*>(arena + registered->staging_offset());
  for (size_t l = 0; l < sizes.size(); ++l) {
    for (uint64_t i = 0; i < sizes[l]; ++i) staging[i] = 0.25f;
    SubmissionEntry init{};
    init.op = static_cast<uint16_t>(RingOp::kInitWeights);
    init.layer = static_cast<uint32_t>(l);
    init.slot_offset = registered->staging_offset();
    init.length = sizes[l] * 4;
    ASSERT_TRUE(plane.Call(init, absl::Seconds(60)).ok());
  }
  auto call = [&](RingOp op, uint32_t layer, uint64_t offset, uint64_t length) {
    SubmissionEntry entry{};
    entry.op = static_cast<uint16_t>(op);
    entry.layer = layer;
    entry.slot_offset = offset;
    entry.length = length;
    if (op == RingOp::kGradReady) {
      entry.dtype = static_cast<uint16_t>(RingDtype::kBf16);
    }
    return plane.Call(entry, absl::Seconds(60)).status();
  };
  SubmissionEntry begin{};
  begin.op = static_cast<uint16_t>(RingOp::kIterBegin);
  ASSERT_TRUE(plane.Call(begin, absl::Seconds(60)).ok());
  struct Bad {
    RingOp op;
    uint32_t layer;
    uint64_t offset, length;
  };
  const Bad bad[] = {
      // Inside a gradient slot, not at its start.
      {RingOp::kGradReady, 0, grad0 + 4096, 2000},
      // The weight slot for a gradient, a gradient slot for weights.
      {RingOp::kGradReady, 0, weight, 2000},
      {RingOp::kFetchParams, 2, grad1, 1000},
      // Right slot, another layer's length (it fits the slot).
      {RingOp::kGradReady, 1, grad1, 2000},
      {RingOp::kFetchParams, 2, weight, 6000},
      // Past the end of the arena.
      {RingOp::kGradReady, 3, ~uint64_t{0} - 100, 4000},
  };
  for (const Bad& b : bad) {
    absl::Status status = call(b.op, b.layer, b.offset, b.length);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << status << " (offset " << b.offset << ")";
    EXPECT_THAT(std::string(status.message()), HasSubstr("layer"));
  }
  EXPECT_THAT(
      std::string(call(RingOp::kGradReady, 0, grad0 + 4096, 2000).message()),
      HasSubstr(absl::StrCat("offsets ", std::min(grad0, grad1), ", ",
                             std::max(grad0, grad1))));
  // The session still serves this iteration: every layer through the right
  // slot (any of the K), fetches, and the end.
  for (size_t back = 0; back < sizes.size(); ++back) {
    const uint32_t l = static_cast<uint32_t>(sizes.size() - 1 - back);
    uint16_t* grad =
        reinterpret_cast<uint16_t*>(arena + (back % 2 == 0 ? grad1 : grad0));
    for (uint64_t i = 0; i < sizes[l]; ++i) grad[i] = FloatToBf16(0.5f);
    ASSERT_TRUE(
        call(RingOp::kGradReady, l, back % 2 == 0 ? grad1 : grad0, sizes[l] * 2)
            .ok());
  }
  SubmissionEntry end{};
  end.op = static_cast<uint16_t>(RingOp::kIterEnd);
  auto ended = plane.Call(end, absl::Seconds(60));
  ASSERT_TRUE(ended.ok()) << ended.status() << daemon_->Log();
  double norm = 0;
  std::memcpy(&norm, &ended->detail, sizeof(norm));
  EXPECT_NEAR(norm, 0.5 * std::sqrt(6500.0), 1e-6);
  // Weights moved by one AdamW step (lr 1e-3: 0.25 - 0.001), as fetched.
  for (uint32_t l = 0; l < sizes.size(); ++l) {
    ASSERT_TRUE(call(RingOp::kFetchParams, l, weight, sizes[l] * 2).ok());
    const uint16_t* got = reinterpret_cast<const uint16_t*>(arena + weight);
    EXPECT_EQ(got[0], FloatToBf16(0.25f - 0.001f)) << l;
    EXPECT_EQ(got[sizes[l] - 1], got[0]) << l;
  }
  auto status = client.GetStatus();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->sessions_size(), 1);
  EXPECT_EQ(status->sessions(0).iteration(), 1u);
  EXPECT_EQ(status->sessions(0).failed_requests(),
            static_cast<uint64_t>(std::size(bad)) + 1);
  EXPECT_EQ(status->sessions(0).grad_slots(), 2u);
  EXPECT_EQ(status->sessions(0).weight_slots(), 1u);
}

// READ_STATE / INIT_STATE through the rings, and a job registered at an
// initial iteration: bad entries fail one by one with their reason, the
// session keeps serving, ITER_BEGIN numbering continues from the initial
// iteration, and a job with states refuses another one.
TEST_F(TrainingTest, StateOpsAndInitialIterationThroughTheRings) {
  OpenJob opened;
  ASSERT_NO_FATAL_FAILURE(Open("states", 4 << 20, opened));
  ControlClient& client = *opened.client;
  const v1::Job& job = opened.job;
  const std::vector<uint64_t> sizes = {64, 100};
  v1::RegisterModelRequest request =
      ModelRequest(job.id(), sizes, v1::DTYPE_FP32);
  request.mutable_model()->set_initial_iteration(5);
  auto registered = client.RegisterModel(request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(registered->iteration(), 5u);
  DataPlane& plane = *opened.plane;
  plane.SetErrorText(registered->error_text_offset(),
                     registered->error_text_bytes());
  const uint64_t staging_offset = registered->staging_offset();
  float* staging = reinterpret_cast<float*>(plane.arena() + staging_offset);
  auto entry = [&](RingOp op, uint32_t layer, uint64_t part) {
    SubmissionEntry e{};
    e.op = static_cast<uint16_t>(op);
    e.layer = layer;
    e.slot_offset = staging_offset;
    e.length = layer < sizes.size() ? sizes[layer] * 4 : 4;
    e.activation_id = part;
    return e;
  };
  auto call = [&](const SubmissionEntry& e) {
    return plane.Call(e, absl::Seconds(60)).status();
  };
  // Before INIT_WEIGHTS the layer has no states.
  absl::Status status = call(entry(RingOp::kReadState, 0, 1));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("no states"));
  for (uint32_t l = 0; l < sizes.size(); ++l) {
    for (uint64_t i = 0; i < sizes[l]; ++i) staging[i] = 0.5f;
    ASSERT_TRUE(call(entry(RingOp::kInitWeights, l, 0)).ok());
  }
  // Restore exp_avg = 0.01, exp_avg_sq = 1e-4 everywhere; read back.
  for (uint32_t l = 0; l < sizes.size(); ++l) {
    for (uint64_t part : {1, 2}) {
      for (uint64_t i = 0; i < sizes[l]; ++i) {
        staging[i] = part == 1 ? 0.01f : 1e-4f;
      }
      ASSERT_TRUE(call(entry(RingOp::kInitState, l, part)).ok());
    }
  }
  for (uint64_t i = 0; i < sizes[1]; ++i) staging[i] = -1.0f;
  ASSERT_TRUE(call(entry(RingOp::kReadState, 1, 2)).ok());
  EXPECT_EQ(staging[0], 1e-4f);
  EXPECT_EQ(staging[sizes[1] - 1], 1e-4f);

  struct Bad {
    const char* what;
    SubmissionEntry entry;
    absl::StatusCode code;
    const char* says;
  };
  std::vector<Bad> bad;
  auto add = [&](const char* what, SubmissionEntry e, absl::StatusCode code,
                 const char* says) {
    bad.push_back({what, e, code, says});
  };
  for (RingOp op : {RingOp::kReadState, RingOp::kInitState}) {
    SubmissionEntry e = entry(op, 1, 1);
    e.slot_offset += 4;
    add("offset", e, absl::StatusCode::kInvalidArgument, "staging slot");
    e = entry(op, 1, 1);
    e.length = sizes[0] * 4;  // another layer's length
    add("length", e, absl::StatusCode::kInvalidArgument, "staging slot");
    e = entry(op, 2, 1);
    add("layer", e, absl::StatusCode::kInvalidArgument, "layer 2 of 2");
    for (uint64_t part : {uint64_t{0}, uint64_t{4}}) {
      add("part", entry(op, 1, part), absl::StatusCode::kInvalidArgument,
          "is not 1 (exp_avg)");
    }
    add("amsgrad", entry(op, 1, 3), absl::StatusCode::kInvalidArgument,
        "only with AMSGrad");
    e = entry(op, 1, 1);
    e.dtype = static_cast<uint16_t>(RingDtype::kFp32);
    add("dtype", e, absl::StatusCode::kInvalidArgument, "not zero");
    e = entry(op, 1, 1);
    e.iteration = 5;
    add("iteration", e, absl::StatusCode::kInvalidArgument, "not zero");
    e = entry(op, 1, 1);
    e.lr = 1e-3;
    add("lr", e, absl::StatusCode::kInvalidArgument, "not zero");
    e = entry(op, 1, 1);
    e.reserved[2] = 1;
    add("reserved", e, absl::StatusCode::kInvalidArgument, "reserved");
  }
  for (const Bad& b : bad) {
    status = call(b.entry);
    EXPECT_EQ(status.code(), b.code) << b.what << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(b.says)) << b.what;
    // The session keeps serving: the moment is as it was.
    for (uint64_t i = 0; i < sizes[1]; ++i) staging[i] = -1.0f;
    ASSERT_TRUE(call(entry(RingOp::kReadState, 1, 1)).ok()) << b.what;
    EXPECT_EQ(staging[7], 0.01f) << b.what;
  }

  // The first iteration is number 5 (Adam step 6), and states are not
  // staged inside it.
  SubmissionEntry begin{};
  begin.op = static_cast<uint16_t>(RingOp::kIterBegin);
  status = plane.Call(begin, absl::Seconds(60)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("want 5"));
  begin.iteration = 5;
  ASSERT_TRUE(plane.Call(begin, absl::Seconds(60)).ok());
  status = call(entry(RingOp::kReadState, 0, 1));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("READ_STATE: optimizer states are staged only between "
                        "iterations"));
  for (uint32_t l = 0; l < sizes.size(); ++l) {
    SubmissionEntry grad{};
    grad.op = static_cast<uint16_t>(RingOp::kGradReady);
    grad.dtype = static_cast<uint16_t>(RingDtype::kFp32);
    grad.layer = l;
    grad.slot_offset = registered->layers(l).grad_offset();
    grad.length = sizes[l] * 4;
    float* g = reinterpret_cast<float*>(plane.arena() + grad.slot_offset);
    for (uint64_t i = 0; i < sizes[l]; ++i) g[i] = 0.1f;
    ASSERT_TRUE(plane.Call(grad, absl::Seconds(60)).ok());
  }
  SubmissionEntry end{};
  end.op = static_cast<uint16_t>(RingOp::kIterEnd);
  end.iteration = 5;
  ASSERT_TRUE(plane.Call(end, absl::Seconds(60)).ok()) << daemon_->Log();
  // Adam step 6 on the restored moments, as torch computes it (float64
  // here; the daemon's fp32 is within a few ulps).
  const double m = 0.9 * 0.01 + 0.1 * 0.1;
  const double v = 0.999 * 1e-4f + 0.001 * 0.01;
  const double m_hat = m / (1 - std::pow(0.9, 6));
  const double v_hat = v / (1 - std::pow(0.999, 6));
  const double expected = 0.5 - 1e-3 * m_hat / (std::sqrt(v_hat) + 1e-8);
  ASSERT_TRUE(call(entry(RingOp::kReadWeights, 1, 0)).ok());
  EXPECT_NEAR(staging[3], expected, 1e-6);
  ASSERT_TRUE(call(entry(RingOp::kReadState, 1, 1)).ok());
  EXPECT_NEAR(staging[3], m, 1e-8);
  auto state = client.GetStatus();
  ASSERT_TRUE(state.ok());
  ASSERT_EQ(state->sessions_size(), 1);
  EXPECT_EQ(state->sessions(0).iteration(), 6u);

  // Another process (here: a new data plane) registering the job again:
  // its stored iteration wins; another initial iteration is refused.
  opened.plane.reset();
  ASSERT_TRUE(WaitForPoolFreed(client));
  auto again = DataPlane::Open(client.hello().data_socket_path(), job.id());
  ASSERT_TRUE(again.ok()) << again.status();
  request.mutable_model()->set_initial_iteration(9);
  auto refused = client.RegisterModel(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
      << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("has states at iteration 6"));
  request.mutable_model()->set_initial_iteration(0);
  auto resumed = client.RegisterModel(request);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->iteration(), 6u);
}

}  // namespace
}  // namespace lohan::testing
