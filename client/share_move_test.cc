// MoveDataPlane / FollowShare against fake daemons in this process
// (fake_daemon_test_util.h) and a fake control plane: what is refused with
// nothing done, what a move replaces in place (the plane, the registration,
// the pinning, over the fake CUDA driver), and what a failed move leaves.
// (tests/share_move_test.cc moves a job of a real lohand.)
#include "client/share_move.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/arena_pinning.h"
#include "client/cuda_driver.h"
#include "client/data_plane.h"
#include "client/fake_daemon_test_util.h"
#include "client/model_channel.h"
#include "client/training_steps.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/lohan.pb.h"
#include "proto/training_steps.pb.h"
#include "tests/fake_cuda/fake_driver_path.h"
#include "wire/ring_entry.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kLayers = 4;
constexpr uint64_t kLayerBytes = 4096;  // fp16: 2048 elements
constexpr uint64_t kElements = kLayerBytes / 2;
constexpr uint64_t kAsked = 2 << 20;
constexpr absl::Duration kLong = absl::Seconds(30);

v1::ModelSpec Spec() {
  v1::ModelSpec spec;
  for (uint32_t i = 0; i < kLayers; ++i) spec.add_layer_elements(kElements);
  spec.set_dtype(v1::DTYPE_FP16);
  spec.set_arena_fit(v1::ARENA_FIT_MOST);
  spec.set_grad_slots(kLayers);
  spec.set_weight_slots(kLayers);
  // What a checkpoint's restore or a rank's step back registered with: not
  // what a move registers with again.
  spec.set_initial_iteration(5);
  spec.set_revert_last_commit(true);
  return spec;
}

// What lohand answers for Spec() laid out with `slots` shared buffers of
// each kind (kLayers: one per layer), the job at `iteration`.
v1::RegisterModelResponse Registration(uint32_t slots, uint64_t iteration) {
  v1::RegisterModelResponse registration;
  const uint64_t weights = FakeDaemon::kFreeOffset + slots * kLayerBytes;
  const uint64_t staging = weights + slots * kLayerBytes;
  for (uint32_t i = 0; i < kLayers; ++i) {
    v1::LayerSlots* layer = registration.add_layers();
    layer->set_grad_offset(FakeDaemon::kFreeOffset + (i % slots) * kLayerBytes);
    layer->set_weight_offset(weights + (i % slots) * kLayerBytes);
    layer->set_bytes(kLayerBytes);
    registration.add_layer_initialized(true);
  }
  registration.set_staging_offset(staging);
  registration.set_staging_bytes(kElements * 4);
  registration.set_iteration(iteration);
  registration.set_error_text_offset(FakeDaemon::kErrorOffset);
  registration.set_error_text_bytes(FakeDaemon::kErrorBytes);
  registration.set_grad_slots(slots);
  registration.set_weight_slots(slots);
  return registration;
}

// lohand's control plane for one job: each reopen a new fake daemon's
// plane, each registration `registration`; or the errors set.
class FakeMoveControl : public MoveControl {
 public:
  absl::StatusOr<std::unique_ptr<DataPlane>> ReopenPlane() override {
    ++reopened;
    if (!reopen_error.ok()) return reopen_error;
    daemons.push_back(std::make_unique<FakeDaemon>());
    return daemons.back()->Plane();
  }

  absl::StatusOr<v1::RegisterModelResponse> RegisterModel(
      const v1::ModelSpec& spec) override {
    registered.push_back(spec);
    if (!register_error.ok()) return register_error;
    return registration;
  }

  absl::Status reopen_error;
  absl::Status register_error;
  v1::RegisterModelResponse registration = Registration(2, 1);
  int reopened = 0;
  std::vector<v1::ModelSpec> registered;
  std::vector<std::unique_ptr<FakeDaemon>> daemons;  // the planes' daemons
};

// A fake daemon, its plane, the pinning and a channel over it, as the C
// ABI's handles hold them.
struct Rig {
  Rig()
      : plane(daemon.Plane()),
        pinning(*plane),
        channel(*plane, pinning.callbacks_pending(), Registration(kLayers, 0),
                Spec()) {}

  SubmissionEntry Next() {
    std::vector<SubmissionEntry> taken = daemon.Take(1);
    EXPECT_EQ(taken.size(), 1u);
    return taken.empty() ? SubmissionEntry{} : taken[0];
  }

  void Begin() {
    auto begun =
        std::async(std::launch::async, [&] { return channel.IterBegin(); });
    daemon.Answer(Next(), 0);
    EXPECT_TRUE(begun.get().ok());
  }

  // An iteration whose end asks for `asked` arena bytes.
  void IterationAsking(uint64_t asked) {
    Begin();
    auto ended =
        std::async(std::launch::async, [&] { return channel.IterEnd(); });
    daemon.Answer(Next(), 0, 0, asked);
    EXPECT_TRUE(ended.get().ok());
    EXPECT_EQ(channel.arena_asked(), asked);
  }

  // FollowShare over `control`, the last commit answered `committed`.
  absl::StatusOr<bool> Follow(MoveControl& control,
                              absl::Status committed = absl::OkStatus()) {
    auto followed = std::async(std::launch::async, [&] {
      return FollowShare(control, plane, pinning, channel);
    });
    const SubmissionEntry commit = Next();
    EXPECT_EQ(static_cast<RingOp>(commit.op), RingOp::kIterCommitted);
    if (committed.ok()) {
      daemon.Answer(commit, 1);
    } else {
      daemon.Fail(commit, committed.code(), std::string(committed.message()));
    }
    return followed.get();
  }

  FakeDaemon daemon;
  std::unique_ptr<DataPlane> plane;
  ArenaPinning pinning;
  ModelChannel channel;
};

TEST(FollowShare, NothingAskedIsNothingDone) {
  FakeMoveControl control;
  Rig rig;
  const DataPlane* before = rig.plane.get();
  absl::StatusOr<bool> followed =
      FollowShare(control, rig.plane, rig.pinning, rig.channel);
  ASSERT_TRUE(followed.ok()) << followed.status();
  EXPECT_FALSE(*followed);
  EXPECT_EQ(rig.plane.get(), before);
  EXPECT_EQ(rig.channel.plane(), before);
  EXPECT_EQ(control.reopened, 0);
  EXPECT_EQ(rig.daemon.served(), 0u);
}

TEST(FollowShare, AnAskMovesThePlaneInPlace) {
  FakeMoveControl control;
  Rig rig;
  v1::TrainingStepsOptions options;
  options.set_lr(0.01);
  options.mutable_loss_scaling()->set_scale(1.0);
  absl::StatusOr<std::unique_ptr<TrainingSteps>> steps =
      TrainingSteps::Create(rig.channel, options);
  ASSERT_TRUE(steps.ok()) << steps.status();
  rig.IterationAsking(kAsked);

  absl::StatusOr<bool> followed = rig.Follow(control);
  ASSERT_TRUE(followed.ok()) << followed.status();
  EXPECT_TRUE(*followed);
  ASSERT_EQ(control.daemons.size(), 1u);
  ASSERT_NE(rig.plane, nullptr);
  FakeDaemon& moved_to = *control.daemons[0];
  EXPECT_EQ(rig.channel.plane(), rig.plane.get());
  // Registered again as it was, at the job's committed iteration.
  ASSERT_EQ(control.registered.size(), 1u);
  v1::ModelSpec expected = Spec();
  expected.clear_initial_iteration();
  expected.clear_revert_last_commit();
  EXPECT_EQ(control.registered[0].SerializeAsString(),
            expected.SerializeAsString());
  // The new layout, and nothing asked of it yet.
  EXPECT_EQ(rig.channel.grad_slots(), 2u);
  EXPECT_EQ(*rig.channel.GradBuffer(3),
            rig.plane->arena() + FakeDaemon::kFreeOffset + kLayerBytes);
  EXPECT_EQ(rig.channel.arena_asked(), 0u);
  EXPECT_FALSE(rig.pinning.pinned_device().has_value());

  // The steps over the channel go on, on the new plane, numbered from its
  // registration.
  auto begun =
      std::async(std::launch::async, [&] { return (*steps)->Begin(); });
  const SubmissionEntry begin = moved_to.Take(1).at(0);
  EXPECT_EQ(static_cast<RingOp>(begin.op), RingOp::kIterBegin);
  EXPECT_EQ(begin.iteration, 1u);
  moved_to.Answer(begin, 0);
  EXPECT_TRUE(begun.get().ok());
  EXPECT_EQ(rig.daemon.served(), 3u);  // begin, end, committed
}

TEST(FollowShare, ARefusedMoveLeavesEverythingAsItWas) {
  FakeMoveControl control;
  {
    Rig rig;
    rig.IterationAsking(kAsked);
    rig.Begin();  // in an iteration
    absl::Status refused =
        MoveDataPlane(control, rig.plane, rig.pinning, rig.channel);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.message(), HasSubstr("an iteration is in progress"));
    EXPECT_EQ(rig.channel.plane(), rig.plane.get());
  }
  {
    Rig rig;
    rig.IterationAsking(kAsked);
    absl::StatusOr<ModelChannel::Ticket> ticket =
        rig.channel.SubmitGradReady(0);
    ASSERT_TRUE(ticket.ok());
    absl::StatusOr<bool> refused =
        FollowShare(control, rig.plane, rig.pinning, rig.channel);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(), HasSubstr("waited for"));
    rig.daemon.Answer(rig.Next(), 0);
    EXPECT_TRUE(rig.channel.Wait(*ticket, kLong).ok());
  }
  {
    Rig rig;
    FakeDaemon other;
    std::unique_ptr<DataPlane> other_plane = other.Plane();
    rig.IterationAsking(kAsked);
    absl::StatusOr<bool> refused =
        FollowShare(control, other_plane, rig.pinning, rig.channel);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(rig.channel.plane(), rig.plane.get());
  }
  {
    Rig rig;
    rig.IterationAsking(kAsked);
    absl::StatusOr<bool> refused = rig.Follow(
        control, absl::AbortedError("the last iteration's updates failed"));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kAborted);
    EXPECT_THAT(refused.status().message(),
                HasSubstr("waiting for the last iteration's commit: the last "
                          "iteration's updates failed"));
    EXPECT_EQ(rig.channel.plane(), rig.plane.get());
  }
  EXPECT_EQ(control.reopened, 0);
}

// After a move that closed the old plane and failed: no plane anywhere,
// and every use says so.
void ExpectNoPlane(Rig& rig, FakeMoveControl& control) {
  EXPECT_EQ(rig.plane, nullptr);
  EXPECT_EQ(rig.channel.plane(), nullptr);
  const absl::Status begun = rig.channel.IterBegin();
  EXPECT_EQ(begun.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(begun.message(), HasSubstr("the job has no data plane"));
  EXPECT_EQ(rig.pinning.Register(0, "pinning").code(),
            absl::StatusCode::kFailedPrecondition);
  // Following again (lohand's ask is still the last one) says so too.
  absl::StatusOr<bool> again =
      FollowShare(control, rig.plane, rig.pinning, rig.channel);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(FollowShare, AFailedReopenLeavesTheJobWithoutAPlane) {
  FakeMoveControl control;
  control.reopen_error = absl::UnavailableError("lohand is gone");
  Rig rig;
  rig.IterationAsking(kAsked);
  absl::StatusOr<bool> failed = rig.Follow(control);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.status().message(),
              HasSubstr("opening the data plane again: lohand is gone"));
  EXPECT_TRUE(control.registered.empty());
  ExpectNoPlane(rig, control);
}

TEST(FollowShare, AFailedRegistrationClosesTheNewPlaneToo) {
  FakeMoveControl control;
  control.register_error = absl::ResourceExhaustedError("no layout fits");
  Rig rig;
  rig.IterationAsking(kAsked);
  absl::StatusOr<bool> failed = rig.Follow(control);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(failed.status().message(),
              HasSubstr("registering the model again: no layout fits"));
  EXPECT_EQ(control.reopened, 1);
  ExpectNoPlane(rig, control);
}

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA
// The fake driver (tests/fake_cuda), loaded before the first CUDA call:
// where a range is registered.
using RegisteredFlags = int (*)(const void*);

RegisteredFlags FakeRegisteredFlags() {
  static const RegisteredFlags flags = [] {
    setenv(cuda::kDriverLibraryVariable, cuda::FakeDriverPath().c_str(), 1);
    void* library =
        dlopen(cuda::FakeDriverPath().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) std::abort();
    void* found = dlsym(library, "fake_cuda_registered_flags");
    if (found == nullptr) std::abort();
    return reinterpret_cast<RegisteredFlags>(found);
  }();
  return flags;
}

TEST(FollowShare, APinnedArenaIsPinnedAgainOnItsDevice) {
  const RegisteredFlags registered_flags = FakeRegisteredFlags();
  FakeMoveControl control;
  Rig rig;
  ASSERT_TRUE(rig.pinning.Register(1, "test").ok());
  const uint8_t* old_arena = rig.plane->arena();
  EXPECT_NE(registered_flags(old_arena), -1);
  rig.IterationAsking(kAsked);

  absl::StatusOr<bool> followed = rig.Follow(control);
  ASSERT_TRUE(followed.ok()) << followed.status();
  EXPECT_TRUE(*followed);
  EXPECT_EQ(registered_flags(old_arena), -1);  // unpinned before the unmap
  EXPECT_NE(registered_flags(rig.plane->arena()), -1);
  EXPECT_EQ(rig.pinning.pinned_device(), std::optional<int>(1));
  // Pinned on device 1: another device is refused as before the move.
  EXPECT_EQ(rig.pinning.Register(2, "test").code(),
            absl::StatusCode::kInvalidArgument);
}
#endif  // LOHAN_WITH_CUDA

}  // namespace
}  // namespace lohan
