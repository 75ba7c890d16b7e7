// A job of a real lohand moved to a new data plane between iterations
// (client/share_move.h, what lohan_job_follow_share does when lohand asks
// at an ITER_END): the synthetic model trains two iterations, moves, and
// trains two more, its weights then the float64 AdamW reference's after
// four, as if it had not moved (resident and streamed layouts); a move that
// fails once the old plane is closed leaves the job to be opened again, its
// iterations kept; and train_client, which follows lohand's asks through
// the C ABI, moves nowhere while nothing is asked.
#include "client/share_move.h"

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "client/arena_pinning.h"
#include "client/control_client.h"
#include "client/data_plane.h"
#include "client/job_lifecycle.h"
#include "client/model_channel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job_open.pb.h"
#include "proto/lohan.pb.h"
#include "tests/dumped_weights.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"
#include "tests/synthetic_model.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::vector<uint64_t> kLayers = {1000, 5000, 333};
constexpr uint64_t kSeed = 7;
constexpr double kGradScale = 0.01;

// train_client's model (fp32) with `slots` shared buffers of each kind (0:
// one per layer).
v1::ModelSpec Spec(uint32_t slots) {
  v1::ModelSpec spec;
  for (uint64_t n : kLayers) spec.add_layer_elements(n);
  spec.set_dtype(v1::DTYPE_FP32);
  const SyntheticAdam adam;
  spec.mutable_adam()->set_lr(adam.lr);
  spec.mutable_adam()->set_beta1(adam.beta1);
  spec.mutable_adam()->set_beta2(adam.beta2);
  spec.mutable_adam()->set_eps(adam.eps);
  spec.mutable_adam()->set_weight_decay(adam.weight_decay);
  spec.mutable_adam()->set_decoupled_weight_decay(true);
  spec.set_skip_nonfinite(true);
  spec.set_chunk_elements(2048);
  spec.set_grad_slots(slots);
  spec.set_weight_slots(slots);
  return spec;
}

// What the C ABI's handles hold: the plane, its pinning, the model over it
// (destroyed in reverse).
struct Held {
  std::unique_ptr<DataPlane> plane;
  std::unique_ptr<ArenaPinning> pinning;
  std::unique_ptr<ModelChannel> channel;
};

class ShareMoveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start(dir_.path());
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // Creates the job for Spec(slots), opens its plane and registers the
  // model; new layers get the synthetic initial weights.
  void Open(uint32_t slots, Held& held) {
    v1::OpenJobRequest request;
    request.mutable_spec()->set_name("moving");
    *request.mutable_spec()->mutable_model() = Spec(slots);
    absl::StatusOr<OpenedJob> opened = OpenJob(*client_, request);
    ASSERT_TRUE(opened.ok()) << opened.status();
    job_id_ = opened->response.job().id();
    held.plane = std::move(opened->plane);
    Register(slots, held);
    for (uint32_t l = 0; l < kLayers.size(); ++l) {
      if (held.channel->layer_initialized(l)) continue;
      float* staging = held.channel->staging();
      for (uint64_t i = 0; i < kLayers[l]; ++i) {
        staging[i] = InitialWeight(kSeed, l, i);
      }
      ASSERT_TRUE(held.channel->InitWeights(l).ok());
    }
  }

  void Register(uint32_t slots, Held& held) {
    held.pinning = std::make_unique<ArenaPinning>(*held.plane);
    auto channel = ModelChannel::Register(*client_, *held.plane,
                                          held.pinning->callbacks_pending(),
                                          job_id_, Spec(slots));
    ASSERT_TRUE(channel.ok()) << channel.status();
    held.channel = *std::move(channel);
  }

  // `count` iterations as train_client runs them, from the job's
  // `first` one: every buffer pointer taken from the channel each time.
  void Train(ModelChannel& channel, uint64_t first, int count) {
    for (uint64_t step = first; step < first + count; ++step) {
      ASSERT_TRUE(channel.IterBegin().ok());
      for (uint32_t l = 0; l < kLayers.size(); ++l) {
        ASSERT_TRUE(channel.FetchParams(l).ok());
      }
      for (uint32_t l = kLayers.size(); l-- > 0;) {
        absl::StatusOr<uint8_t*> buffer = channel.GradBuffer(l);
        ASSERT_TRUE(buffer.ok()) << buffer.status();
        float* grad = reinterpret_cast<float*>(*buffer);
        for (uint64_t i = 0; i < kLayers[l]; ++i) {
          grad[i] = Gradient(kSeed, step, l, i, kGradScale);
        }
        ASSERT_TRUE(channel.GradReady(l).ok());
      }
      absl::StatusOr<ModelChannel::IterEndResult> ended = channel.IterEnd();
      ASSERT_TRUE(ended.ok()) << ended.status();
    }
  }

  // Dumps the weights as train_client does and checks them against the
  // reference after `iterations`.
  void ExpectWeights(ModelChannel& channel, int iterations) {
    const std::string path = dir_.path() + "/weights";
    {
      std::ofstream out(path, std::ios::binary);
      for (uint32_t l = 0; l < kLayers.size(); ++l) {
        ASSERT_TRUE(channel.FetchParams(l).ok());
        ASSERT_TRUE(channel.ReadWeights(l).ok());
        out.write(reinterpret_cast<const char*>(channel.staging()),
                  kLayers[l] * 4);
        out.write(reinterpret_cast<const char*>(*channel.WeightBuffer(l)),
                  kLayers[l] * 4);
      }
    }
    const absl::Status matches = CheckDumpedWeights(
        path, {.layers = kLayers, .iterations = iterations, .seed = kSeed});
    EXPECT_TRUE(matches.ok()) << matches;
  }

  // How many arenas of the job lohand holds.
  int ArenasOfTheJob() {
    absl::StatusOr<v1::GetStatusResponse> status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status();
    int arenas = 0;
    for (const auto& arena : status->pool().arenas()) {
      arenas += arena.job_id() == job_id_ ? 1 : 0;
    }
    return arenas;
  }

  PublicTempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<ControlClient> client_;
  std::string job_id_;
};

// By the layout's shared buffers (0: one per layer).
class MovedLayoutTest : public ShareMoveTest,
                        public ::testing::WithParamInterface<uint32_t> {};

TEST_P(MovedLayoutTest, AMovedJobTrainsOnAsIfItHadNotMoved) {
  const uint32_t slots = GetParam();
  Held held;
  ASSERT_NO_FATAL_FAILURE(Open(slots, held));
  ASSERT_NO_FATAL_FAILURE(Train(*held.channel, 0, 2));

  // Alone on the pool with its whole arena, the job is asked nothing:
  // following does nothing.
  EXPECT_EQ(held.channel->arena_asked(), 0u);
  const DataPlane* before = held.plane.get();
  absl::StatusOr<bool> followed =
      FollowShare(*client_, job_id_, held.plane, *held.pinning, *held.channel);
  ASSERT_TRUE(followed.ok()) << followed.status();
  EXPECT_FALSE(*followed);
  EXPECT_EQ(held.plane.get(), before);

  // Moved all the same: a new plane, the model registered there at the
  // job's committed iteration.
  std::unique_ptr<MoveControl> control = ControlFor(*client_, job_id_);
  const absl::Status moved =
      MoveDataPlane(*control, held.plane, *held.pinning, *held.channel);
  ASSERT_TRUE(moved.ok()) << moved << daemon_->Log();
  ASSERT_NE(held.plane, nullptr);
  EXPECT_EQ(held.channel->plane(), held.plane.get());
  EXPECT_EQ(held.channel->iteration(), 2u);
  EXPECT_EQ(held.channel->grad_slots(), slots == 0 ? kLayers.size() : slots);
  EXPECT_EQ(ArenasOfTheJob(), 1);

  ASSERT_NO_FATAL_FAILURE(Train(*held.channel, 2, 2));
  ExpectWeights(*held.channel, 4);
}

INSTANTIATE_TEST_SUITE_P(ResidentAndStreamed, MovedLayoutTest,
                         ::testing::Values(0u, 2u));

TEST_F(ShareMoveTest, AFailedMoveLeavesTheJobToBeOpenedAgain) {
  Held held;
  ASSERT_NO_FATAL_FAILURE(Open(0, held));
  ASSERT_NO_FATAL_FAILURE(Train(*held.channel, 0, 2));

  // The new plane cannot be opened (a job lohand does not know): the old
  // one is closed, and what held it says so.
  std::unique_ptr<MoveControl> lost = ControlFor(*client_, "j-999999");
  const absl::Status failed =
      MoveDataPlane(*lost, held.plane, *held.pinning, *held.channel);
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.message(), HasSubstr("opening the data plane again"));
  EXPECT_EQ(held.plane, nullptr);
  const absl::Status begun = held.channel->IterBegin();
  EXPECT_EQ(begun.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(begun.message(), HasSubstr("the job has no data plane"));

  // Opened again, the job is where it was.
  held.channel.reset();
  held.pinning.reset();
  absl::StatusOr<std::unique_ptr<DataPlane>> reopened =
      ReopenDataPlane(*client_, job_id_);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  held.plane = *std::move(reopened);
  ASSERT_NO_FATAL_FAILURE(Register(0, held));
  EXPECT_EQ(held.channel->iteration(), 2u);
  ASSERT_NO_FATAL_FAILURE(Train(*held.channel, 2, 2));
  ExpectWeights(*held.channel, 4);
}

// train_client follows lohand's asks after every iteration
// (lohan_job_follow_share): none here, so it never moves, followed or not.
TEST_F(ShareMoveTest, TrainClientMovesNowhereWhileNothingIsAsked) {
  for (const bool ignore : {false, true}) {
    std::vector<std::string> command = {Runfile("tests/train_client"),
                                        "--socket",
                                        daemon_->socket(),
                                        "--job",
                                        ignore ? "ignoring" : "following",
                                        "--layers",
                                        "1000,5000,333",
                                        "--iterations",
                                        "3",
                                        "--out",
                                        dir_.path() + "/weights"};
    if (ignore) command.push_back("--ignore-share");
    RunResult result = RunCommand(command);
    ASSERT_EQ(result.exit_code, 0)
        << result.out << result.err << daemon_->Log();
    EXPECT_THAT(result.out, HasSubstr("iteration 3 norm"));
    EXPECT_THAT(result.out, Not(HasSubstr("moved")));
    const absl::Status matches =
        CheckDumpedWeights(dir_.path() + "/weights",
                           {.layers = kLayers, .iterations = 3, .seed = kSeed});
    EXPECT_TRUE(matches.ok()) << matches;
  }
}

}  // namespace
}  // namespace lohan::testing
