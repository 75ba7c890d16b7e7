// TrainingSteps against a fake daemon in this process
// (fake_daemon_test_util.h): what each step puts on the ring, and what the
// daemon's answers do to the count, the loss scale and the step in
// progress. (tests/python drives both plugins, which use it, against the
// real lohand.)
#include "client/training_steps.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include "client/data_plane.h"
#include "client/fake_daemon_test_util.h"
#include "client/model_channel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/lohan.pb.h"
#include "proto/training_steps.pb.h"
#include "wire/ring_entry.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kLayerBytes = 4096;  // fp32: 1024 elements
// How long a call that must be blocked is given to (wrongly) finish.
constexpr auto kBlocked = std::chrono::milliseconds(200);

// `layers` of kLayerBytes in `slots` gradient and weight buffers each
// (layer i in buffer i % slots), after the fake daemon's rings.
v1::RegisterModelResponse Registration(uint32_t layers, uint32_t slots,
                                       uint64_t iteration) {
  v1::RegisterModelResponse registration;
  const uint64_t weights = FakeDaemon::kFreeOffset + slots * kLayerBytes;
  for (uint32_t i = 0; i < layers; ++i) {
    v1::LayerSlots* layer = registration.add_layers();
    layer->set_grad_offset(FakeDaemon::kFreeOffset + (i % slots) * kLayerBytes);
    layer->set_weight_offset(weights + (i % slots) * kLayerBytes);
    layer->set_bytes(kLayerBytes);
    registration.add_layer_initialized(true);
  }
  registration.set_staging_offset(weights + slots * kLayerBytes);
  registration.set_staging_bytes(kLayerBytes);
  registration.set_iteration(iteration);
  registration.set_error_text_offset(FakeDaemon::kErrorOffset);
  registration.set_error_text_bytes(FakeDaemon::kErrorBytes);
  registration.set_grad_slots(slots);
  registration.set_weight_slots(slots);
  return registration;
}

v1::ModelSpec Spec(uint32_t layers) {
  v1::ModelSpec spec;
  for (uint32_t i = 0; i < layers; ++i) {
    spec.add_layer_elements(kLayerBytes / 4);
  }
  spec.set_dtype(v1::DTYPE_FP32);
  return spec;
}

v1::TrainingStepsOptions Options(double lr = 0.01) {
  v1::TrainingStepsOptions options;
  options.set_lr(lr);
  options.mutable_loss_scaling()->set_scale(1.0);
  return options;
}

v1::TrainingStepsOptions Dynamic(double scale, uint32_t growth_interval) {
  v1::TrainingStepsOptions options = Options();
  v1::LossScaling* scaling = options.mutable_loss_scaling();
  scaling->set_dynamic(true);
  scaling->set_scale(scale);
  scaling->set_growth_interval(growth_interval);
  return options;
}

// A fake daemon, a channel over its plane and the steps over that.
struct Rig {
  explicit Rig(v1::TrainingStepsOptions options = Options(),
               uint32_t layers = 2, uint32_t slots = 2, uint64_t iteration = 0)
      : plane(daemon.Plane()),
        channel(*plane, callbacks, Registration(layers, slots, iteration),
                Spec(layers)),
        steps(*TrainingSteps::Create(channel, options)) {}

  SubmissionEntry Next() {
    std::vector<SubmissionEntry> taken = daemon.Take(1);
    EXPECT_EQ(taken.size(), 1u);
    return taken.empty() ? SubmissionEntry{} : taken[0];
  }

  // Begins a step (at `lr` when given); the daemon accepts. The entry.
  SubmissionEntry Begin(std::optional<double> lr = std::nullopt) {
    auto begun =
        std::async(std::launch::async, [&] { return steps->Begin(lr); });
    const SubmissionEntry entry = Next();
    EXPECT_EQ(static_cast<RingOp>(entry.op), RingOp::kIterBegin);
    daemon.Answer(entry, 0);
    EXPECT_TRUE(begun.get().ok());
    return entry;
  }

  // Ends the step; the daemon answers with `flags` (and norm 3).
  absl::StatusOr<TrainingSteps::Outcome> End(
      uint32_t flags, std::optional<double> sum_squares = std::nullopt,
      SubmissionEntry* sent = nullptr) {
    auto ended =
        std::async(std::launch::async, [&] { return steps->End(sum_squares); });
    const SubmissionEntry entry = Next();
    EXPECT_EQ(static_cast<RingOp>(entry.op), RingOp::kIterEnd);
    if (sent != nullptr) *sent = entry;
    const double norm = 3.0;
    uint64_t bits = 0;
    std::memcpy(&bits, &norm, sizeof(bits));
    daemon.Answer(entry, bits, flags);
    return ended.get();
  }

  FakeDaemon daemon;
  std::unique_ptr<DataPlane> plane;
  std::atomic<int64_t> callbacks{0};
  ModelChannel channel;
  std::unique_ptr<TrainingSteps> steps;
};

TEST(TrainingSteps, CountsCommittedStepsFromTheRegistration) {
  Rig rig(Options(0.5), /*layers=*/2, /*slots=*/2, /*iteration=*/5);
  EXPECT_EQ(rig.steps->committed(), 5u);
  SubmissionEntry begin = rig.Begin();
  EXPECT_EQ(begin.lr, 0.5);
  EXPECT_EQ(begin.grad_scale, 1.0f);
  EXPECT_TRUE(rig.steps->active());
  absl::StatusOr<TrainingSteps::Outcome> ended = rig.End(kIterEndClipped);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->global_norm, 3.0);
  EXPECT_TRUE(ended->clipped);
  EXPECT_FALSE(rig.steps->active());
  EXPECT_EQ(rig.steps->committed(), 6u);

  // A skipped step does not count; the rate given at a begin stays.
  begin = rig.Begin(0.25);
  EXPECT_EQ(begin.lr, 0.25);
  ended = rig.End(kIterEndSkipped | kIterEndNonfinite);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(ended->skipped);
  EXPECT_EQ(rig.steps->committed(), 6u);
  EXPECT_EQ(rig.steps->learning_rate(), 0.25);
  EXPECT_EQ(rig.Begin().lr, 0.25);
}

TEST(TrainingSteps, DynamicLossScalingHalvesOnASkipAndGrowsAfterTheInterval) {
  Rig rig(Dynamic(1024.0, /*growth_interval=*/2));
  EXPECT_EQ(rig.steps->ScaleLoss(), 1024.0);
  EXPECT_EQ(rig.Begin().grad_scale, 1.0f / 1024.0f);
  // The all-ranks sum of squares goes out unscaled as the daemon counts.
  SubmissionEntry end;
  ASSERT_TRUE(rig.End(kIterEndSkipped, 4.0 * 1024 * 1024, &end).ok());
  EXPECT_EQ(end.iter_flags, kIterEndSumSquaresGiven);
  EXPECT_EQ(end.global_sum_squares, 4.0);
  EXPECT_EQ(rig.steps->loss_scaling().scale(), 512.0);

  // A backward that did not scale its loss: the gradients carry none.
  EXPECT_EQ(rig.Begin().grad_scale, 1.0f);
  ASSERT_TRUE(rig.End(0).ok());
  EXPECT_EQ(rig.steps->loss_scaling().good_steps(), 1u);
  rig.steps->ScaleLoss();
  EXPECT_EQ(rig.Begin().grad_scale, 1.0f / 512.0f);
  ASSERT_TRUE(rig.End(0).ok());
  EXPECT_EQ(rig.steps->loss_scaling().scale(), 1024.0);
  EXPECT_EQ(rig.steps->loss_scaling().good_steps(), 0u);

  // Never below 1.
  v1::LossScaling low = rig.steps->loss_scaling();
  low.set_scale(1.0);
  ASSERT_TRUE(rig.steps->SetLossScaling(low).ok());
  rig.Begin();
  ASSERT_TRUE(rig.End(kIterEndSkipped).ok());
  EXPECT_EQ(rig.steps->loss_scaling().scale(), 1.0);
}

TEST(TrainingSteps, AResumedDynamicScaleGoesOnAndAStaticOneStays) {
  v1::TrainingStepsOptions options = Dynamic(65536.0, 2000);
  options.mutable_resumed()->set_scale(256.0);
  options.mutable_resumed()->set_good_steps(7);
  Rig dynamic(options);
  EXPECT_EQ(dynamic.steps->loss_scaling().scale(), 256.0);
  EXPECT_EQ(dynamic.steps->loss_scaling().good_steps(), 7u);

  options = Options();
  options.mutable_loss_scaling()->set_scale(8.0);
  options.mutable_resumed()->set_scale(256.0);
  Rig fixed(options);
  EXPECT_EQ(fixed.steps->loss_scaling().scale(), 8.0);
}

TEST(TrainingSteps, ASharedGradientBufferIsClaimedOnceTheDaemonHasTakenIt) {
  Rig rig(Options(), /*layers=*/2, /*slots=*/1);
  rig.Begin();
  ASSERT_TRUE(rig.steps->ClaimGradBuffer(1).ok());  // nothing in flight
  ASSERT_TRUE(rig.steps->GradReady(1).ok());
  const SubmissionEntry first = rig.Next();
  EXPECT_EQ(static_cast<RingOp>(first.op), RingOp::kGradReady);
  EXPECT_EQ(first.layer, 1u);

  // Layer 0 shares the buffer: claiming it waits for layer 1's GRAD_READY.
  auto claimed = std::async(std::launch::async,
                            [&] { return rig.steps->ClaimGradBuffer(0); });
  EXPECT_EQ(claimed.wait_for(kBlocked), std::future_status::timeout);
  rig.daemon.Answer(first, 0);
  EXPECT_TRUE(claimed.get().ok());
  ASSERT_TRUE(rig.steps->GradReady(0).ok());
  rig.daemon.Answer(rig.Next(), 0);
  ASSERT_TRUE(rig.End(0).ok());
}

// Hand-overs that need no claim (copies from a GPU, which the data plane
// orders behind each other) queue up on a shared buffer without waiting;
// a claim then waits for all of them.
TEST(TrainingSteps, HandOversQueueOnASharedBufferUntilItIsClaimed) {
  Rig rig(Options(), /*layers=*/3, /*slots=*/1);
  rig.Begin();
  ASSERT_TRUE(rig.steps->GradReady(2).ok());
  auto second =
      std::async(std::launch::async, [&] { return rig.steps->GradReady(1); });
  ASSERT_EQ(second.wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  ASSERT_TRUE(second.get().ok());
  std::vector<SubmissionEntry> gradients = rig.daemon.Take(2);
  ASSERT_EQ(gradients.size(), 2u);
  auto claimed = std::async(std::launch::async,
                            [&] { return rig.steps->ClaimGradBuffer(0); });
  rig.daemon.Answer(gradients[0], 0);
  EXPECT_EQ(claimed.wait_for(kBlocked), std::future_status::timeout);
  rig.daemon.Answer(gradients[1], 0);
  EXPECT_TRUE(claimed.get().ok());
  ASSERT_TRUE(rig.steps->GradReady(0).ok());
  rig.daemon.Answer(rig.Next(), 0);
  ASSERT_TRUE(rig.End(0).ok());
}

TEST(TrainingSteps, EndWaitsForEveryHandOverFirst) {
  Rig rig;
  rig.Begin();
  ASSERT_TRUE(rig.steps->GradReady(0).ok());
  const SubmissionEntry gradient = rig.Next();
  const uint64_t served = rig.daemon.served();
  auto ended = std::async(std::launch::async, [&] { return rig.steps->End(); });
  EXPECT_EQ(ended.wait_for(kBlocked), std::future_status::timeout);
  EXPECT_EQ(rig.daemon.served(), served);  // no ITER_END yet
  rig.daemon.Answer(gradient, 0);
  const SubmissionEntry end = rig.Next();
  EXPECT_EQ(static_cast<RingOp>(end.op), RingOp::kIterEnd);
  rig.daemon.Answer(end, 0);
  EXPECT_TRUE(ended.get().ok());
}

TEST(TrainingSteps, AFailedHandOverThrowsTheStepAwayAndIsReported) {
  Rig rig(Dynamic(4.0, 1));
  rig.steps->ScaleLoss();
  rig.Begin();
  ASSERT_TRUE(rig.steps->GradReady(0).ok());
  ASSERT_TRUE(rig.steps->GradReady(1).ok());
  auto ended = std::async(std::launch::async, [&] { return rig.steps->End(); });
  std::vector<SubmissionEntry> gradients = rig.daemon.Take(2);
  ASSERT_EQ(gradients.size(), 2u);
  rig.daemon.Fail(gradients[0], absl::StatusCode::kDataLoss, "bad gradient");
  rig.daemon.Answer(gradients[1], 0);
  const SubmissionEntry abort = rig.Next();
  EXPECT_EQ(static_cast<RingOp>(abort.op), RingOp::kIterAbort);
  rig.daemon.Answer(abort, 0);
  absl::StatusOr<TrainingSteps::Outcome> outcome = ended.get();
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(outcome.status().message(), HasSubstr("bad gradient"));
  EXPECT_FALSE(rig.steps->active());
  EXPECT_EQ(rig.steps->committed(), 0u);
  EXPECT_EQ(rig.steps->loss_scaling().scale(), 4.0);  // no step happened
  // The next step starts clean: unscaled, numbered on.
  EXPECT_EQ(rig.Begin().grad_scale, 1.0f);
}

TEST(TrainingSteps, ARefusedEndLeavesNoStepAndCountsNothing) {
  Rig rig;
  rig.Begin();
  auto ended = std::async(std::launch::async, [&] { return rig.steps->End(); });
  rig.daemon.Fail(rig.Next(), absl::StatusCode::kInternal, "update failed");
  EXPECT_EQ(ended.get().status().code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(rig.steps->active());
  EXPECT_EQ(rig.steps->committed(), 0u);
}

TEST(TrainingSteps, DiscardAbortsTheStepAndIsANoOpBetweenSteps) {
  Rig rig;
  const uint64_t served = rig.daemon.served();
  EXPECT_TRUE(rig.steps->Discard().ok());
  EXPECT_EQ(rig.daemon.served(), served);
  rig.Begin();
  ASSERT_TRUE(rig.steps->GradReady(0).ok());
  auto discarded =
      std::async(std::launch::async, [&] { return rig.steps->Discard(); });
  rig.daemon.Answer(rig.Next(), 0);  // the gradient lands first
  const SubmissionEntry abort = rig.Next();
  EXPECT_EQ(static_cast<RingOp>(abort.op), RingOp::kIterAbort);
  rig.daemon.Fail(abort, absl::StatusCode::kUnavailable, "daemon stopping");
  EXPECT_EQ(discarded.get().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(rig.steps->active());
}

TEST(TrainingSteps, CallsOutOfOrderOrOutOfRangeAreRefusedWithNothingSent) {
  Rig rig;
  const uint64_t served = rig.daemon.served();
  absl::Status outside = rig.steps->GradReady(0);
  EXPECT_EQ(outside.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(outside.message(), HasSubstr("begin it first"));
  EXPECT_EQ(rig.steps->End().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rig.steps->Begin(-1.0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.steps->Begin(std::nan("")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(rig.steps->active());
  EXPECT_EQ(rig.daemon.served(), served);
  rig.Begin();
  EXPECT_EQ(rig.steps->GradReady(9).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.steps->ClaimGradBuffer(9).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TrainingSteps, BadOptionsAreRefusedNamingTheField) {
  FakeDaemon daemon;
  std::unique_ptr<DataPlane> plane = daemon.Plane();
  std::atomic<int64_t> callbacks{0};
  ModelChannel channel(*plane, callbacks, Registration(2, 2, 0), Spec(2));
  v1::TrainingStepsOptions options = Options(-0.1);
  absl::Status refused = TrainingSteps::Create(channel, options).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("learning rate"));

  options = Options();
  options.mutable_loss_scaling()->set_scale(0.0);
  refused = TrainingSteps::Create(channel, options).status();
  EXPECT_THAT(refused.message(), HasSubstr("loss_scaling.scale"));

  refused = TrainingSteps::Create(channel, Dynamic(2.0, 0)).status();
  EXPECT_THAT(refused.message(), HasSubstr("growth_interval"));
}

}  // namespace
}  // namespace lohan
