// ModelChannel against a fake daemon in this process
// (fake_daemon_test_util.h): which entries each call puts on the ring, and
// what the daemon's answers become. (tests/ drives the real lohand through
// the C ABI.)
#include "client/model_channel.h"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <vector>

#include "client/cuda_driver.h"
#include "client/data_plane.h"
#include "client/fake_daemon_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/lohan.pb.h"
#include "tests/fake_cuda/fake_driver_path.h"
#include "wire/ring_entry.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kLayerBytes = 4096;  // fp16: 2048 elements
constexpr uint64_t kElements = kLayerBytes / 2;
constexpr uint64_t kActivationBytes = 16 << 10;
constexpr absl::Duration kLong = absl::Seconds(30);
// How long a call that must be blocked is given to (wrongly) finish.
constexpr auto kBlocked = std::chrono::milliseconds(200);

// Where the fake registration puts things, after the fake daemon's rings.
constexpr uint64_t kGradBase = FakeDaemon::kFreeOffset;
uint64_t WeightBase(uint32_t slots) { return kGradBase + slots * kLayerBytes; }
uint64_t StagingOffset(uint32_t slots) {
  return WeightBase(slots) + slots * kLayerBytes;
}
uint64_t ActivationOffset(uint32_t slots) {
  return StagingOffset(slots) + kElements * 4;
}

v1::ModelSpec Spec(uint32_t layers) {
  v1::ModelSpec spec;
  for (uint32_t i = 0; i < layers; ++i) spec.add_layer_elements(kElements);
  spec.set_dtype(v1::DTYPE_FP16);
  spec.set_activation_bytes(kActivationBytes);
  return spec;
}

// What lohand would answer for Spec(layers) with `slots` gradient and
// weight buffers (slots == layers: resident; fewer: streamed, layer i in
// buffer i % slots).
v1::RegisterModelResponse Registration(uint32_t layers, uint32_t slots,
                                       uint64_t iteration = 0) {
  v1::RegisterModelResponse registration;
  for (uint32_t i = 0; i < layers; ++i) {
    v1::LayerSlots* layer = registration.add_layers();
    layer->set_grad_offset(kGradBase + (i % slots) * kLayerBytes);
    layer->set_weight_offset(WeightBase(slots) + (i % slots) * kLayerBytes);
    layer->set_bytes(kLayerBytes);
    registration.add_layer_initialized(i % 2 == 1);
  }
  registration.set_staging_offset(StagingOffset(slots));
  registration.set_staging_bytes(kElements * 4);
  registration.set_iteration(iteration);
  registration.set_error_text_offset(FakeDaemon::kErrorOffset);
  registration.set_error_text_bytes(FakeDaemon::kErrorBytes);
  registration.set_activation_offset(ActivationOffset(slots));
  registration.set_activation_bytes(kActivationBytes);
  registration.set_grad_slots(slots);
  registration.set_weight_slots(slots);
  return registration;
}

// A fake daemon, its data plane and a channel over it.
struct Rig {
  explicit Rig(uint32_t layers = 4, uint32_t slots = 4, uint64_t iteration = 0)
      : plane(daemon.Plane()),
        channel(*plane, callbacks, Registration(layers, slots, iteration),
                Spec(layers)) {}

  FakeDaemon daemon;
  std::unique_ptr<DataPlane> plane;
  std::atomic<int64_t> callbacks{0};
  ModelChannel channel;

  // The one submission the call under test made.
  SubmissionEntry Next() {
    std::vector<SubmissionEntry> taken = daemon.Take(1);
    EXPECT_EQ(taken.size(), 1u);
    return taken.empty() ? SubmissionEntry{} : taken[0];
  }
};

template <typename F>
auto InBackground(F call) {
  return std::async(std::launch::async, std::move(call));
}

RingOp OpOf(const SubmissionEntry& entry) {
  return static_cast<RingOp>(entry.op);
}

// Begins an iteration, checking it carries `expected`; the daemon accepts.
void Begin(Rig& rig, uint64_t expected) {
  auto begun = InBackground([&] { return rig.channel.IterBegin(); });
  const SubmissionEntry entry = rig.Next();
  EXPECT_EQ(OpOf(entry), RingOp::kIterBegin);
  EXPECT_EQ(entry.iteration, expected);
  rig.daemon.Answer(entry, 0);
  EXPECT_TRUE(begun.get().ok());
}

TEST(ModelChannel, IterationsAreNumberedOnFromTheRegistration) {
  Rig rig(/*layers=*/4, /*slots=*/4, /*iteration=*/7);
  Begin(rig, 7);

  auto ended = InBackground([&] { return rig.channel.IterEnd(); });
  SubmissionEntry end = rig.Next();
  EXPECT_EQ(OpOf(end), RingOp::kIterEnd);
  EXPECT_EQ(end.iteration, 7u);
  const double norm = 2.5;
  uint64_t bits = 0;
  std::memcpy(&bits, &norm, sizeof(bits));
  rig.daemon.Answer(end, bits, kIterEndClipped);
  absl::StatusOr<ModelChannel::IterEndResult> result = ended.get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->global_norm, 2.5);
  EXPECT_TRUE(result->clipped);
  EXPECT_FALSE(result->skipped);

  Begin(rig, 8);
  auto aborted = InBackground([&] { return rig.channel.IterAbort(); });
  SubmissionEntry abort = rig.Next();
  EXPECT_EQ(OpOf(abort), RingOp::kIterAbort);
  EXPECT_EQ(abort.iteration, 8u);
  rig.daemon.Answer(abort, 0);
  EXPECT_TRUE(aborted.get().ok());

  Begin(rig, 9);
  // A begun iteration that the daemon fails to end is over all the same.
  ended = InBackground([&] { return rig.channel.IterEnd(); });
  rig.daemon.Fail(rig.Next(), absl::StatusCode::kInternal, "update failed");
  EXPECT_EQ(ended.get().status().code(), absl::StatusCode::kInternal);
  Begin(rig, 10);
  // The registration's iteration is what the daemon said then.
  EXPECT_EQ(rig.channel.iteration(), 7u);
}

TEST(ModelChannel, ARefusedBeginOrEndDoesNotMoveTheNumber) {
  Rig rig(/*layers=*/4, /*slots=*/4, /*iteration=*/3);
  auto begun = InBackground([&] { return rig.channel.IterBegin(); });
  SubmissionEntry begin = rig.Next();
  EXPECT_EQ(begin.iteration, 3u);
  rig.daemon.Fail(begin, absl::StatusCode::kFailedPrecondition,
                  "weights not initialized");
  EXPECT_EQ(begun.get().code(), absl::StatusCode::kFailedPrecondition);

  // No iteration begun: this end is refused and moves nothing.
  auto ended = InBackground([&] { return rig.channel.IterEnd(); });
  SubmissionEntry end = rig.Next();
  EXPECT_EQ(end.iteration, 3u);
  rig.daemon.Fail(end, absl::StatusCode::kFailedPrecondition,
                  "no iteration begun");
  EXPECT_EQ(ended.get().status().code(), absl::StatusCode::kFailedPrecondition);

  Begin(rig, 3);
}

TEST(ModelChannel, BeginCarriesScaleAndRateOnlyWhenGiven) {
  Rig rig;
  auto begun = InBackground([&] { return rig.channel.IterBegin(); });
  SubmissionEntry plain = rig.Next();
  EXPECT_EQ(plain.grad_scale, 0.0f);
  EXPECT_EQ(plain.iter_flags & kIterBeginLrGiven, 0);
  rig.daemon.Answer(plain, 0);
  ASSERT_TRUE(begun.get().ok());
  auto aborted = InBackground([&] { return rig.channel.IterAbort(); });
  rig.daemon.Answer(rig.Next(), 0);
  ASSERT_TRUE(aborted.get().ok());

  begun = InBackground([&] { return rig.channel.IterBegin(1024.0f, 0.0); });
  SubmissionEntry scaled = rig.Next();
  EXPECT_EQ(scaled.iteration, 1u);
  EXPECT_EQ(scaled.grad_scale, 1024.0f);
  EXPECT_EQ(scaled.lr, 0.0);
  EXPECT_NE(scaled.iter_flags & kIterBeginLrGiven, 0);
  rig.daemon.Answer(scaled, 0);
  EXPECT_TRUE(begun.get().ok());
}

TEST(ModelChannel, EndCarriesTheGlobalSumOfSquaresOnlyWhenGiven) {
  Rig rig;
  Begin(rig, 0);
  // Unflagged and zero without one.
  auto ended = InBackground([&] { return rig.channel.IterEnd(); });
  SubmissionEntry plain = rig.Next();
  EXPECT_EQ(OpOf(plain), RingOp::kIterEnd);
  EXPECT_EQ(plain.iter_flags, 0);
  uint64_t bits;
  std::memcpy(&bits, &plain.global_sum_squares, sizeof(bits));
  EXPECT_EQ(bits, 0u);
  rig.daemon.Answer(plain, 0);
  ASSERT_TRUE(ended.get().ok());

  // Given: the flag and the value's exact bits (zero and a NaN with its
  // sign bit set, what inf - inf gives, included); the completion's norm
  // and flags come back as without it.
  const double nan = -std::numeric_limits<double>::quiet_NaN();
  uint64_t iteration = 1;
  for (double given : {6.25, 0.0, nan}) {
    Begin(rig, iteration);
    ended = InBackground([&] { return rig.channel.IterEnd(given); });
    SubmissionEntry end = rig.Next();
    EXPECT_EQ(OpOf(end), RingOp::kIterEnd);
    EXPECT_EQ(end.iteration, iteration);
    EXPECT_EQ(end.iter_flags, kIterEndSumSquaresGiven);
    EXPECT_EQ(0, std::memcmp(&end.global_sum_squares, &given, sizeof(given)))
        << given;
    const double norm = std::sqrt(given);
    std::memcpy(&bits, &norm, sizeof(bits));
    rig.daemon.Answer(end, bits,
                      std::isnan(given) ? kIterEndSkipped | kIterEndNonfinite
                                        : kIterEndClipped);
    absl::StatusOr<ModelChannel::IterEndResult> result = ended.get();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(0, std::memcmp(&result->global_norm, &norm, sizeof(norm)));
    EXPECT_EQ(result->clipped, !std::isnan(given));
    EXPECT_EQ(result->skipped, std::isnan(given));
    ++iteration;
  }

  // Negative (-0.0 too): refused here, nothing submitted, the iteration
  // still in progress (the next end carries its number).
  Begin(rig, iteration);
  const uint64_t served = rig.daemon.served();
  for (double negative :
       {-1.0, -0.0, -std::numeric_limits<double>::infinity()}) {
    absl::StatusOr<ModelChannel::IterEndResult> refused =
        rig.channel.IterEnd(negative);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr("negative"));
  }
  EXPECT_EQ(rig.daemon.served(), served);
  ended = InBackground([&] { return rig.channel.IterEnd(1.0); });
  SubmissionEntry end = rig.Next();
  EXPECT_EQ(end.iteration, iteration);
  EXPECT_EQ(end.global_sum_squares, 1.0);
  rig.daemon.Answer(end, 0);
  EXPECT_TRUE(ended.get().ok());
}

// Ends the iteration begun; the daemon answers with `arena_asked`.
absl::StatusOr<ModelChannel::IterEndResult> EndAsking(Rig& rig,
                                                      uint64_t arena_asked) {
  auto ended = InBackground([&] { return rig.channel.IterEnd(); });
  const SubmissionEntry end = rig.Next();
  EXPECT_EQ(OpOf(end), RingOp::kIterEnd);
  rig.daemon.Answer(end, 0, 0, arena_asked);
  return ended.get();
}

TEST(ModelChannel, AnEndsAskForAnotherArenaIsKeptUntilTheNextEnd) {
  Rig rig;
  EXPECT_EQ(rig.channel.arena_asked(), 0u);
  Begin(rig, 0);
  absl::StatusOr<ModelChannel::IterEndResult> asked = EndAsking(rig, 6 << 20);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->arena_asked, uint64_t{6} << 20);
  EXPECT_EQ(rig.channel.arena_asked(), uint64_t{6} << 20);
  // Not followed: the next iteration knows it still...
  Begin(rig, 1);
  EXPECT_EQ(rig.channel.arena_asked(), uint64_t{6} << 20);
  // ...until an end asks nothing.
  absl::StatusOr<ModelChannel::IterEndResult> quiet = EndAsking(rig, 0);
  ASSERT_TRUE(quiet.ok()) << quiet.status();
  EXPECT_EQ(quiet->arena_asked, 0u);
  EXPECT_EQ(rig.channel.arena_asked(), 0u);

  // A failed end asked nothing either.
  Begin(rig, 2);
  ASSERT_TRUE(EndAsking(rig, 8 << 20).ok());
  Begin(rig, 3);
  auto ended = InBackground([&] { return rig.channel.IterEnd(); });
  rig.daemon.Fail(rig.Next(), absl::StatusCode::kInternal, "update failed");
  EXPECT_FALSE(ended.get().ok());
  EXPECT_EQ(rig.channel.arena_asked(), 0u);
}

TEST(ModelChannel, WithoutAPlaneEveryCallSaysSoAndNothingIsSubmitted) {
  Rig rig;
  rig.channel.DetachPlane();
  EXPECT_EQ(rig.channel.plane(), nullptr);
  EXPECT_EQ(rig.channel.staging(), nullptr);
  EXPECT_EQ(rig.channel.staging_bytes(), 0u);
  EXPECT_EQ(rig.channel.activation_area(), nullptr);
  EXPECT_EQ(rig.channel.activation_bytes(), 0u);
  // The model's own shape is still known.
  EXPECT_EQ(rig.channel.layers(), 4u);
  EXPECT_EQ(*rig.channel.LayerBytes(3), kLayerBytes);

  std::vector<uint8_t> host(kLayerBytes);
  const std::vector<absl::Status> refused = {
      rig.channel.GradBuffer(0).status(),
      rig.channel.WeightBuffer(0).status(),
      rig.channel.IterBegin(),
      rig.channel.IterEnd().status(),
      rig.channel.IterEnd(1.0).status(),
      rig.channel.IterAbort(),
      rig.channel.AwaitCommitted().status(),
      rig.channel.ReleasePreviousCommit(),
      rig.channel.FetchParams(0),
      rig.channel.GradReady(0),
      rig.channel.SubmitFetchParams(0).status(),
      rig.channel.SubmitGradReady(0).status(),
      rig.channel.GradReadyFromHost(0, host.data(), kLayerBytes).status(),
      rig.channel.WeightsToHost(0, host.data(), kLayerBytes),
      rig.channel.GradReadyFromDevice(0, 0, host.data(), kLayerBytes, nullptr)
          .status(),
      rig.channel.WeightsToDevice(0, 0, host.data(), kLayerBytes, nullptr),
      rig.channel.InitWeights(0),
      rig.channel.ReadWeights(0),
      rig.channel.ReadState(0, RingStatePart::kExpAvg),
      rig.channel.InitState(0, RingStatePart::kExpAvgSq),
      rig.channel.ActPut(1, 0, 64),
      rig.channel.ActGet(1, 0, 64),
      rig.channel.ActFree(1),
      rig.channel.SubmitActPut(1, 0, 64).status(),
      rig.channel.SubmitActGet(1, 0, 64).status(),
      rig.channel.SubmitActFree(1).status(),
      rig.channel.SubmitActPutFromDevice(1, 0, 64, 0, host.data(), nullptr)
          .status(),
      rig.channel.Wait(1, kLong),
      rig.channel.Poll(1).status(),
  };
  for (size_t i = 0; i < refused.size(); ++i) {
    EXPECT_EQ(refused[i].code(), absl::StatusCode::kFailedPrecondition) << i;
    EXPECT_THAT(refused[i].message(), HasSubstr("the job has no data plane"))
        << i;
  }
  // A layer out of range is still that.
  EXPECT_EQ(rig.channel.GradBuffer(9).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.daemon.served(), 0u);
}

TEST(ModelChannel, AttachPlaneTakesTheNewPlanesRegistration) {
  Rig rig(/*layers=*/4, /*slots=*/4, /*iteration=*/0);
  Begin(rig, 0);
  ASSERT_TRUE(EndAsking(rig, 2 << 20).ok());
  EXPECT_EQ(rig.channel.AttachPlane(*rig.plane, Registration(4, 4, 1)).code(),
            absl::StatusCode::kFailedPrecondition);  // it has one

  rig.channel.DetachPlane();
  FakeDaemon other;
  std::unique_ptr<DataPlane> plane = other.Plane();
  // A registration of another model is refused, nothing taken.
  EXPECT_EQ(rig.channel.AttachPlane(*plane, Registration(3, 3, 1)).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(rig.channel.plane(), nullptr);

  ASSERT_TRUE(rig.channel.AttachPlane(*plane, Registration(4, 2, 1)).ok());
  EXPECT_EQ(rig.channel.plane(), plane.get());
  EXPECT_EQ(rig.channel.arena_asked(), 0u);
  EXPECT_EQ(rig.channel.grad_slots(), 2u);
  EXPECT_EQ(rig.channel.iteration(), 1u);
  EXPECT_EQ(*rig.channel.GradBuffer(3),
            plane->arena() + kGradBase + kLayerBytes);
  EXPECT_EQ(rig.channel.staging(),
            reinterpret_cast<float*>(plane->arena() + StagingOffset(2)));
  EXPECT_EQ(rig.channel.activation_bytes(), kActivationBytes);

  // Requests go to the new plane, numbered from its registration.
  auto begun = InBackground([&] { return rig.channel.IterBegin(); });
  const SubmissionEntry begin = other.Take(1).at(0);
  EXPECT_EQ(OpOf(begin), RingOp::kIterBegin);
  EXPECT_EQ(begin.iteration, 1u);
  other.Answer(begin, 0);
  EXPECT_TRUE(begun.get().ok());
  EXPECT_EQ(rig.daemon.served(), 2u);  // the first plane's begin and end
}

TEST(ModelChannel, ALayerOutOfRangeIsInvalidAndNothingIsSubmitted) {
  Rig rig(/*layers=*/4);
  auto out_of_range = [](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message(), "layer out of range");
  };
  uint8_t bytes[kLayerBytes] = {};
  out_of_range(rig.channel.FetchParams(4));
  out_of_range(rig.channel.GradReady(4));
  out_of_range(rig.channel.SubmitFetchParams(4).status());
  out_of_range(rig.channel.SubmitGradReady(99).status());
  out_of_range(rig.channel.InitWeights(4));
  out_of_range(rig.channel.ReadWeights(4));
  out_of_range(rig.channel.ReadState(4, RingStatePart::kExpAvg));
  out_of_range(rig.channel.InitState(4, RingStatePart::kExpAvgSq));
  out_of_range(rig.channel.GradReadyFromHost(4, bytes, kLayerBytes).status());
  out_of_range(rig.channel.WeightsToHost(4, bytes, kLayerBytes));
  out_of_range(rig.channel.GradBuffer(4).status());
  out_of_range(rig.channel.WeightBuffer(4).status());
  out_of_range(rig.channel.LayerBytes(4).status());
  EXPECT_FALSE(rig.channel.layer_initialized(4));
  EXPECT_TRUE(rig.channel.layer_initialized(3));
  EXPECT_FALSE(rig.channel.layer_initialized(2));

  // The first submission the daemon sees is the valid one after them.
  absl::StatusOr<ModelChannel::Ticket> ticket = rig.channel.SubmitGradReady(3);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  SubmissionEntry entry = rig.Next();
  EXPECT_EQ(OpOf(entry), RingOp::kGradReady);
  EXPECT_EQ(entry.layer, 3u);
  rig.daemon.Answer(entry, 0);
  EXPECT_TRUE(rig.channel.Wait(*ticket, kLong).ok());
  EXPECT_EQ(rig.daemon.served(), 1u);
}

TEST(ModelChannel, ASizeThatIsNotTheLayersIsInvalid) {
  Rig rig;
  uint8_t bytes[kLayerBytes] = {};
  absl::Status gradient =
      rig.channel.GradReadyFromHost(1, bytes, kLayerBytes - 1).status();
  EXPECT_EQ(gradient.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gradient.message(), "layer 1 has 4096 bytes of gradient, not 4095");
  absl::Status weights = rig.channel.WeightsToHost(2, bytes, 1);
  EXPECT_EQ(weights.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(weights.message(), "layer 2 has 4096 bytes of weights, not 1");
}

TEST(ModelChannel, StreamedLayoutsUseBufferLayerModK) {
  Rig rig(/*layers=*/4, /*slots=*/2);
  EXPECT_EQ(rig.channel.grad_slots(), 2u);
  for (uint32_t layer = 0; layer < 4; ++layer) {
    EXPECT_EQ(*rig.channel.GradBuffer(layer),
              rig.plane->arena() + kGradBase + (layer % 2) * kLayerBytes);
    EXPECT_EQ(*rig.channel.WeightBuffer(layer),
              rig.plane->arena() + WeightBase(2) + (layer % 2) * kLayerBytes);
    EXPECT_EQ(*rig.channel.LayerBytes(layer), kLayerBytes);
  }
  absl::StatusOr<ModelChannel::Ticket> fetch = rig.channel.SubmitFetchParams(3);
  ASSERT_TRUE(fetch.ok()) << fetch.status();
  SubmissionEntry entry = rig.Next();
  EXPECT_EQ(OpOf(entry), RingOp::kFetchParams);
  EXPECT_EQ(entry.layer, 3u);
  EXPECT_EQ(entry.slot_offset, WeightBase(2) + kLayerBytes);
  EXPECT_EQ(entry.length, kLayerBytes);
  rig.daemon.Answer(entry, 0);
  EXPECT_TRUE(rig.channel.Wait(*fetch, kLong).ok());
}

TEST(ModelChannel, AGradientIntoASharedBufferWaitsForTheOneBefore) {
  Rig rig(/*layers=*/4, /*slots=*/2);
  std::vector<uint8_t> first(kLayerBytes, 0xa1), second(kLayerBytes, 0xb2);
  absl::StatusOr<ModelChannel::Ticket> t0 =
      rig.channel.GradReadyFromHost(0, first.data(), kLayerBytes);
  ASSERT_TRUE(t0.ok()) << t0.status();
  SubmissionEntry e0 = rig.Next();
  EXPECT_EQ(e0.slot_offset, kGradBase);
  EXPECT_EQ(e0.dtype, static_cast<uint16_t>(RingDtype::kFp16));
  EXPECT_EQ(rig.daemon.base()[kGradBase], 0xa1);

  // Layer 2 shares buffer 0: its copy must wait for layer 0's GRAD_READY.
  auto t2 = InBackground([&] {
    return rig.channel.GradReadyFromHost(2, second.data(), kLayerBytes);
  });
  EXPECT_EQ(t2.wait_for(kBlocked), std::future_status::timeout);
  EXPECT_EQ(rig.daemon.base()[kGradBase + kLayerBytes - 1], 0xa1);
  rig.daemon.Answer(e0, 0);
  absl::StatusOr<ModelChannel::Ticket> second_ticket = t2.get();
  ASSERT_TRUE(second_ticket.ok()) << second_ticket.status();
  SubmissionEntry e2 = rig.Next();
  EXPECT_EQ(e2.layer, 2u);
  EXPECT_EQ(e2.slot_offset, kGradBase);
  EXPECT_EQ(rig.daemon.base()[kGradBase + kLayerBytes - 1], 0xb2);
  rig.daemon.Answer(e2, 0);
  EXPECT_TRUE(rig.channel.Wait(*second_ticket, kLong).ok());
  EXPECT_TRUE(rig.channel.Wait(*t0, kLong).ok());
}

TEST(ModelChannel, WeightsToHostWaitsForTheFetchFillingThem) {
  Rig rig;
  absl::StatusOr<ModelChannel::Ticket> fetch = rig.channel.SubmitFetchParams(1);
  ASSERT_TRUE(fetch.ok()) << fetch.status();
  SubmissionEntry entry = rig.Next();
  std::vector<uint8_t> weights(kLayerBytes, 0);
  auto copied = InBackground([&] {
    return rig.channel.WeightsToHost(1, weights.data(), kLayerBytes);
  });
  EXPECT_EQ(copied.wait_for(kBlocked), std::future_status::timeout);
  std::memset(rig.daemon.base() + entry.slot_offset, 0x5c, kLayerBytes);
  rig.daemon.Answer(entry, 0);
  EXPECT_TRUE(copied.get().ok());
  EXPECT_EQ(weights.front(), 0x5c);
  EXPECT_EQ(weights.back(), 0x5c);
  EXPECT_TRUE(rig.channel.Wait(*fetch, kLong).ok());
}

TEST(ModelChannel, SubmittedRequestsCompleteInAnyOrder) {
  Rig rig;
  std::vector<ModelChannel::Ticket> tickets;
  auto submit = [&](absl::StatusOr<ModelChannel::Ticket> ticket) {
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    tickets.push_back(*ticket);
  };
  submit(rig.channel.SubmitFetchParams(0));
  submit(rig.channel.SubmitGradReady(1));
  submit(rig.channel.SubmitActPut(5, 1024, 512));
  submit(rig.channel.SubmitActFree(5));
  std::vector<SubmissionEntry> entries = rig.daemon.Take(4);
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(OpOf(entries[0]), RingOp::kFetchParams);
  EXPECT_EQ(OpOf(entries[1]), RingOp::kGradReady);
  EXPECT_EQ(OpOf(entries[2]), RingOp::kActPut);
  EXPECT_EQ(entries[2].activation_id, 5u);
  EXPECT_EQ(entries[2].slot_offset, ActivationOffset(4) + 1024);
  EXPECT_EQ(entries[2].length, 512u);
  EXPECT_EQ(OpOf(entries[3]), RingOp::kActFree);
  EXPECT_EQ(entries[3].length, 0u);
  for (int i = 3; i >= 0; --i) rig.daemon.Answer(entries[i], 0);

  for (int i : {2, 0, 3, 1}) {
    EXPECT_TRUE(rig.channel.Wait(tickets[i], kLong).ok()) << i;
  }
  EXPECT_EQ(rig.channel.Wait(tickets[0], kLong).code(),
            absl::StatusCode::kNotFound);
}

TEST(ModelChannel, PollSaysWhenARequestIsDone) {
  Rig rig;
  absl::StatusOr<ModelChannel::Ticket> ticket = rig.channel.SubmitGradReady(0);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  SubmissionEntry entry = rig.Next();
  absl::StatusOr<bool> done = rig.channel.Poll(*ticket);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(*done);
  rig.daemon.Answer(entry, 0);
  const absl::Time deadline = absl::Now() + kLong;
  while (!*done && absl::Now() < deadline) {
    done = rig.channel.Poll(*ticket);
    ASSERT_TRUE(done.ok()) << done.status();
  }
  EXPECT_TRUE(*done);
  EXPECT_TRUE(rig.channel.Wait(*ticket, kLong).ok());
}

TEST(ModelChannel, TheDaemonsErrorTextReachesTheCaller) {
  Rig rig;
  auto read = InBackground([&] { return rig.channel.ReadWeights(1); });
  SubmissionEntry entry = rig.Next();
  EXPECT_EQ(OpOf(entry), RingOp::kReadWeights);
  EXPECT_EQ(entry.slot_offset, StagingOffset(4));
  EXPECT_EQ(entry.length, kElements * 4);
  rig.daemon.Fail(entry, absl::StatusCode::kNotFound,
                  "layer 1 has no weights yet");
  absl::Status status = read.get();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("layer 1 has no weights yet"));

  absl::StatusOr<ModelChannel::Ticket> ticket = rig.channel.SubmitGradReady(2);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  rig.daemon.Fail(rig.Next(), absl::StatusCode::kDataLoss, "the SSD is gone");
  absl::Status waited = rig.channel.Wait(*ticket, kLong);
  EXPECT_EQ(waited.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(waited.message(), HasSubstr("the SSD is gone"));
}

TEST(ModelChannel, StateCallsCarryThePart) {
  Rig rig;
  auto init = InBackground(
      [&] { return rig.channel.InitState(2, RingStatePart::kMaxExpAvgSq); });
  SubmissionEntry entry = rig.Next();
  EXPECT_EQ(OpOf(entry), RingOp::kInitState);
  EXPECT_EQ(entry.layer, 2u);
  EXPECT_EQ(entry.activation_id, 3u);
  EXPECT_EQ(entry.slot_offset, StagingOffset(4));
  rig.daemon.Answer(entry, 0);
  EXPECT_TRUE(init.get().ok());
}

TEST(ModelChannel, ActivationRangesMustLieInTheArea) {
  Rig rig;
  for (auto [offset, length] : {std::pair<uint64_t, uint64_t>{0, 0},
                                {kActivationBytes - 10, 20},
                                {kActivationBytes + 1, 1}}) {
    absl::Status put = rig.channel.ActPut(1, offset, length);
    EXPECT_EQ(put.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(put.message(),
              "activation range outside the model's activation area");
    EXPECT_EQ(rig.channel.SubmitActGet(1, offset, length).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(rig.channel.activation_area(),
            rig.plane->arena() + ActivationOffset(4));
  EXPECT_EQ(rig.channel.activation_bytes(), kActivationBytes);
  auto whole =
      InBackground([&] { return rig.channel.ActGet(1, 0, kActivationBytes); });
  SubmissionEntry entry = rig.Next();
  EXPECT_EQ(OpOf(entry), RingOp::kActGet);
  EXPECT_EQ(entry.length, kActivationBytes);
  rig.daemon.Answer(entry, 0);
  EXPECT_TRUE(whole.get().ok());
}

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA
// The fake driver (tests/fake_cuda): host memory for "device" memory, one
// worker thread per stream, a stream that can be held. Loaded once, before
// the client's first CUDA call.
struct FakeCuda {
  void* (*device_alloc)(int, size_t);
  void (*device_free)(void*);
  CUstream (*stream_create)(int);
  void (*stream_hold)(CUstream, int);
};

const FakeCuda& Fake() {
  static const FakeCuda* const fake = [] {
    setenv(cuda::kDriverLibraryVariable, cuda::FakeDriverPath().c_str(), 1);
    void* library =
        dlopen(cuda::FakeDriverPath().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) std::abort();
    auto find = [library](const char* name) {
      void* found = dlsym(library, name);
      if (found == nullptr) std::abort();
      return found;
    };
    auto* functions = new FakeCuda;  // lives with the process, as `library`
    functions->device_alloc = reinterpret_cast<void* (*)(int, size_t)>(
        find("fake_cuda_device_alloc"));
    functions->device_free =
        reinterpret_cast<void (*)(void*)>(find("fake_cuda_device_free"));
    functions->stream_create =
        reinterpret_cast<CUstream (*)(int)>(find("fake_cuda_stream_create"));
    functions->stream_hold = reinterpret_cast<void (*)(CUstream, int)>(
        find("fake_cuda_stream_hold"));
    return functions;
  }();
  return *fake;
}

// An activation leaves GPU memory without the caller waiting: the ticket
// comes back while the copy has not run, and the ACT_PUT reaches the ring
// only once the copy has put the bytes in the area.
TEST(ModelChannel, AnActivationPutFromTheDeviceIsSubmittedOnceCopied) {
  const FakeCuda& fake = Fake();
  Rig rig;
  constexpr uint64_t kBytes = 8192;
  constexpr uint64_t kOffset = 4096;
  auto* device = static_cast<unsigned char*>(fake.device_alloc(1, kBytes));
  for (uint64_t i = 0; i < kBytes; ++i) {
    device[i] = static_cast<unsigned char>(i * 13 + 5);
  }
  CUstream stream = fake.stream_create(1);
  fake.stream_hold(stream, 1);
  absl::StatusOr<ModelChannel::Ticket> ticket =
      rig.channel.SubmitActPutFromDevice(7, kOffset, kBytes, 1, device, stream);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  absl::StatusOr<bool> done = rig.channel.Poll(*ticket);
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
  const uint8_t* area = rig.channel.activation_area() + kOffset;
  EXPECT_EQ(area[0], 0);  // the held stream has copied nothing yet
  fake.stream_hold(stream, 0);
  const SubmissionEntry entry = rig.Next();
  EXPECT_EQ(OpOf(entry), RingOp::kActPut);
  EXPECT_EQ(entry.activation_id, 7u);
  EXPECT_EQ(entry.slot_offset, ActivationOffset(4) + kOffset);
  EXPECT_EQ(entry.length, kBytes);
  EXPECT_EQ(std::memcmp(area, device, kBytes), 0);
  rig.daemon.Answer(entry, 0);
  EXPECT_TRUE(rig.channel.Wait(*ticket, kLong).ok());
  // Outside the area: refused before anything is enqueued.
  EXPECT_EQ(
      rig.channel
          .SubmitActPutFromDevice(8, kActivationBytes - 1, 2, 1, device, stream)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  fake.device_free(device);
}
#endif  // LOHAN_WITH_CUDA

}  // namespace
}  // namespace lohan
