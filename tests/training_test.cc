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
#include <signal.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/control_client.h"
#include "client/data_plane.h"
#include "daemon/optim/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"
#include "tests/synthetic_model.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;

const std::vector<uint64_t> kLayers = {1000, 5000, 333};
constexpr uint64_t kSeed = 7;

class TrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start(dir_.path());
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
  }

  RunResult Train(const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {Runfile("tests/train_client"),
                                     "--socket",
                                     daemon_->socket(),
                                     "--job",
                                     "synthetic",
                                     "--layers",
                                     "1000,5000,333",
                                     "--seed",
                                     "7",
                                     "--out",
                                     dir_.path() + "/weights"};
    for (const std::string& arg : extra) argv.push_back(arg);
    return RunCommand(argv);
  }

  // Compares the dumped weights with the reference after `iterations`.
  void ExpectWeights(int iterations, bool bf16, double max_norm,
                     double grad_scale) {
    auto grad = [&](int t, size_t l, uint64_t i) -> double {
      const float g = Gradient(kSeed, t, l, i, grad_scale);
      return bf16 ? Bf16ToFloat(FloatToBf16(g)) : g;
    };
    const auto reference = ReferenceAdamW(kLayers, kSeed, iterations,
                                          SyntheticAdam(), max_norm, grad);
    std::ifstream in(dir_.path() + "/weights", std::ios::binary);
    ASSERT_TRUE(in) << "no weights written";
    double worst = 0;
    for (size_t l = 0; l < kLayers.size(); ++l) {
      std::vector<float> master(kLayers[l]);
      in.read(reinterpret_cast<char*>(master.data()), kLayers[l] * 4);
      std::vector<uint8_t> copy(kLayers[l] * (bf16 ? 2 : 4));
      in.read(reinterpret_cast<char*>(copy.data()), copy.size());
      ASSERT_TRUE(in) << "short weights file";
      for (uint64_t i = 0; i < kLayers[l]; ++i) {
        const double expected = reference[l][i];
        const double error = std::abs(master[i] - expected);
        worst = std::max(worst, error / (1 + std::abs(expected)));
        ASSERT_LE(error, 2e-5 * (1 + std::abs(expected)))
            << "layer " << l << " element " << i << " after " << iterations
            << " iterations";
        // What the next forward gets is exactly the master weight, rounded.
        // (An fp32 model's weights are copied at FETCH_PARAMS instead, at
        // the next iteration's forward.)
        if (bf16) {
          uint16_t published;
          std::memcpy(&published, copy.data() + 2 * i, 2);
          ASSERT_EQ(published, FloatToBf16(master[i])) << l << "/" << i;
        }
      }
    }
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
  bool freed = false;
  for (int i = 0; i < 3000 && !freed; ++i) {
    auto status = (*client)->GetStatus();
    freed = status.ok() && status->pool().used_bytes() == 0;
    if (!freed) usleep(10 * 1000);
  }
  EXPECT_TRUE(freed) << daemon_->Log();
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
  ASSERT_EQ(Train({"--iterations", "2"}).exit_code, 0) << daemon_->Log();
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
  RunResult text = RunCommand({Runfile("client/ctl/lohanctl"), "--socket",
                               daemon_->socket(), "status"});
  EXPECT_THAT(text.out, HasSubstr("training (open data planes)"));
  EXPECT_THAT(text.out, HasSubstr(session.job_id()));
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
  auto good = [&]() {
    v1::RegisterModelRequest request;
    request.set_job_id(job->id());
    request.mutable_model()->add_layer_elements(100);
    request.mutable_model()->set_dtype(v1::DTYPE_BF16);
    request.mutable_model()->mutable_adam()->set_lr(1e-3);
    request.mutable_model()->mutable_adam()->set_beta1(0.9);
    request.mutable_model()->mutable_adam()->set_beta2(0.999);
    return request;
  };
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
    absl::Status status = (*client)->RegisterModel(request).status();
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_FALSE(status.message().empty());
  }
  // After all that (the refused ones gave their slots back), a spec that
  // needs most of the arena registers on the same data plane.
  v1::RegisterModelRequest big = good();
  // 200 KiB gradient + 200 KiB weights + 400 KiB fp32 staging.
  big.mutable_model()->set_layer_elements(0, 100 * 1024);
  EXPECT_TRUE((*client)->RegisterModel(big).ok()) << daemon_->Log();
}

TEST_F(TrainingTest, MalformedRingEntriesFailOneByOneAndHurtNothing) {
  auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
  ASSERT_TRUE(client.ok());
  v1::JobSpec spec;
  spec.set_name("fuzzed");
  spec.set_host_pool_bytes(4 << 20);
  auto job = (*client)->CreateJob(spec);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE((*client)->AttachJob(job->id()).ok());
  auto plane =
      DataPlane::Open((*client)->hello().data_socket_path(), job->id());
  ASSERT_TRUE(plane.ok()) << plane.status();
  v1::RegisterModelRequest request;
  request.set_job_id(job->id());
  request.mutable_model()->add_layer_elements(64);
  request.mutable_model()->set_dtype(v1::DTYPE_FP32);
  request.mutable_model()->mutable_adam()->set_lr(1e-3);
  request.mutable_model()->mutable_adam()->set_beta1(0.9);
  request.mutable_model()->mutable_adam()->set_beta2(0.999);
  auto registered = (*client)->RegisterModel(request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  (*plane)->SetErrorText(registered->error_text_offset(),
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
    if (i % 2 == 1) entry.op = static_cast<uint16_t>(1 + next() % 10);
    auto completion = (*plane)->Call(entry, absl::Seconds(60));
    ASSERT_FALSE(completion.ok()) << "entry " << i << " was accepted";
    EXPECT_NE(completion.status().message(), "(no text)");
  }
  // The daemon still serves this job correctly, and everyone else.
  float* staging = reinterpret_cast<float*>((*plane)->arena() +
                                            registered->staging_offset());
  for (int i = 0; i < 64; ++i) staging[i] = 1.0f;
  SubmissionEntry init{};
  init.op = static_cast<uint16_t>(RingOp::kInitWeights);
  init.slot_offset = registered->staging_offset();
  init.length = 64 * 4;
  EXPECT_TRUE((*plane)->Call(init, absl::Seconds(60)).ok());
  EXPECT_TRUE((*client)->GetStatus().ok());
}

}  // namespace
}  // namespace lohan::testing
