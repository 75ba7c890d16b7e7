#include "daemon/session/arena_layout.h"

#include "daemon/session/job_session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/ring.h"
#include "wire/ring_entry.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

uint64_t Bytes(std::vector<uint64_t> layers, uint64_t activations,
               uint64_t buffers, uint64_t element_bytes = 2) {
  return ArenaBytes(ArenaShape{.layer_elements = std::move(layers),
                               .element_bytes = element_bytes,
                               .activation_bytes = activations,
                               .grad_buffers = buffers,
                               .weight_buffers = buffers});
}

v1::ModelSpec Spec(std::vector<uint64_t> layers, uint32_t slots,
                   v1::ArenaFit fit) {
  v1::ModelSpec spec;
  for (uint64_t n : layers) spec.add_layer_elements(n);
  spec.set_dtype(v1::DTYPE_BF16);
  spec.set_grad_slots(slots);
  spec.set_weight_slots(slots);
  spec.set_arena_fit(fit);
  return spec;
}

// Worked by hand: GPT-2-like layers in bf16, each slot rounded to 4 KiB.
TEST(ArenaBytes, SlotsStagingActivationsAndControlInWholeMiB) {
  const std::vector<uint64_t> gpt2 = {72192, 128, 49984, 49984};
  // Buffers 2 x (144384 + 4096 + 98304 + 98304), staging 290816: under
  // 1 MiB with the control allowance on top, so 2 MiB.
  EXPECT_EQ(Bytes(gpt2, 0, 0), 2 * kMiB);
  EXPECT_EQ(Bytes(gpt2, 16 * kMiB, 0), 18 * kMiB);
  // Three shared buffers of the largest layer (144384 bytes) per kind.
  EXPECT_EQ(Bytes(gpt2, 0, 3), 3 * kMiB);
  std::vector<uint64_t> deep = {24576, 128};
  deep.insert(deep.end(), 6, 49984);
  EXPECT_EQ(Bytes(deep, 0, 0), 3 * kMiB);
  EXPECT_EQ(Bytes(deep, 0, 4), 2 * kMiB);
  EXPECT_EQ(Bytes(deep, 16 * kMiB, 4), 18 * kMiB);
  // As many shared buffers as layers, or more, is one per layer.
  EXPECT_EQ(Bytes({5 * kMiB}, 0, 4), 41 * kMiB);
  EXPECT_EQ(Bytes({5 * kMiB}, 0, 0), 41 * kMiB);
  // fp32: 4 bytes a gradient element.
  EXPECT_EQ(Bytes({kMiB}, 0, 0, 4), 13 * kMiB);
}

TEST(ArenaBytes, ControlAllowanceHoldsTheRingsAndTheLargestTables) {
  const uint64_t ring = RingBytes(JobSession::kRingCapacity, kRingEntryBytes);
  auto slot = [](uint64_t bytes) {
    return (bytes + kArenaSlotUnit - 1) / kArenaSlotUnit * kArenaSlotUnit;
  };
  // Both rings and the error texts.
  EXPECT_LE(2 * slot(ring) + slot(JobSession::kErrorTextBytes),
            kArenaControlBytes);
}

TEST(ShapeOf, TakesTheSpecsBuffersAndElementSize) {
  v1::ModelSpec spec = Spec({10, 20}, 1, v1::ARENA_FIT_AS_GIVEN);
  spec.set_weight_slots(0);
  spec.set_activation_bytes(5000);
  const ArenaShape shape = ShapeOf(spec);
  EXPECT_EQ(shape.layer_elements, (std::vector<uint64_t>{10, 20}));
  EXPECT_EQ(shape.element_bytes, 2u);
  EXPECT_EQ(shape.activation_bytes, 5000u);
  EXPECT_EQ(shape.grad_buffers, 1u);
  EXPECT_EQ(shape.weight_buffers, 0u);
  spec.set_dtype(v1::DTYPE_FP32);
  EXPECT_EQ(ShapeOf(spec).element_bytes, 4u);
}

TEST(ChooseArena, AsGivenIgnoresTheLimit) {
  const std::vector<uint64_t> layers(8, kMiB);
  absl::StatusOr<ArenaChoice> choice = ChooseArena(
      Spec(layers, 2, v1::ARENA_FIT_AS_GIVEN), ArenaLimit{.bytes = kMiB});
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->arena_bytes, Bytes(layers, 0, 2));
  EXPECT_EQ(choice->grad_buffers, 2u);
  EXPECT_EQ(choice->weight_buffers, 2u);
  EXPECT_EQ(choice->resident_arena_bytes, Bytes(layers, 0, 0));
}

TEST(ChooseArena, MostTakesResidentWhenItFitsElseTheMostSharedBuffers) {
  const std::vector<uint64_t> layers(8, kMiB);
  const uint64_t resident = Bytes(layers, 0, 0);
  const v1::ModelSpec spec = Spec(layers, 4, v1::ARENA_FIT_MOST);
  absl::StatusOr<ArenaChoice> roomy =
      ChooseArena(spec, ArenaLimit{.bytes = resident});
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  EXPECT_EQ(roomy->arena_bytes, resident);
  EXPECT_EQ(roomy->grad_buffers, 0u);
  // Room for three shared buffers of each, not four, and not for a weight
  // buffer per layer beside one shared gradient buffer.
  const uint64_t three = Bytes(layers, 0, 3);
  ASSERT_LT(three, ArenaBytes(ArenaShape{.layer_elements = layers,
                                         .element_bytes = 2,
                                         .grad_buffers = 1,
                                         .weight_buffers = 0}));
  ASSERT_LT(three, Bytes(layers, 0, 4));
  absl::StatusOr<ArenaChoice> tight =
      ChooseArena(spec, ArenaLimit{.bytes = three});
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_EQ(tight->arena_bytes, three);
  EXPECT_EQ(tight->grad_buffers, 3u);
  EXPECT_EQ(tight->weight_buffers, 3u);
  EXPECT_EQ(tight->resident_arena_bytes, resident);
}

// Between the two: a weight buffer per layer and the most shared gradient
// buffers that fit, before weights stream too.
TEST(ChooseArena, MostKeepsWeightsResidentWhenOnlyGradientsNeedToStream) {
  const std::vector<uint64_t> layers(8, kMiB);
  const v1::ModelSpec spec = Spec(layers, 4, v1::ARENA_FIT_MOST);
  const auto mixed = [&](uint64_t grad_buffers) {
    return ArenaBytes(ArenaShape{.layer_elements = layers,
                                 .element_bytes = 2,
                                 .grad_buffers = grad_buffers,
                                 .weight_buffers = 0});
  };
  ASSERT_LT(mixed(2), mixed(3));
  ASSERT_LT(mixed(4), Bytes(layers, 0, 0));
  absl::StatusOr<ArenaChoice> four =
      ChooseArena(spec, ArenaLimit{.bytes = mixed(4)});
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->arena_bytes, mixed(4));
  EXPECT_EQ(four->grad_buffers, 4u);
  EXPECT_EQ(four->weight_buffers, 0u);
  absl::StatusOr<ArenaChoice> two =
      ChooseArena(spec, ArenaLimit{.bytes = mixed(3) - 1});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->arena_bytes, mixed(2));
  EXPECT_EQ(two->grad_buffers, 2u);
  EXPECT_EQ(two->weight_buffers, 0u);
}

TEST(ChooseArena, MostSaysWhatItNeedsWhenNothingFits) {
  const std::vector<uint64_t> layers(8, kMiB);
  v1::ModelSpec spec = Spec(layers, 4, v1::ARENA_FIT_MOST);
  spec.set_activation_bytes(3 * kMiB);
  absl::StatusOr<ArenaChoice> none =
      ChooseArena(spec, ArenaLimit{.bytes = kMiB,
                                   .what = "the whole host pool",
                                   .remedy = "start lohand with a larger one"});
  ASSERT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string text(none.status().message());
  EXPECT_THAT(text, HasSubstr(absl::StrCat(
                        "needs ", Bytes(layers, 3 * kMiB, 0) >> 20, " MiB")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(
                        "at least ", Bytes(layers, 3 * kMiB, 1) >> 20,
                        " MiB streaming through one shared buffer")));
  EXPECT_THAT(text, HasSubstr("the whole host pool is 1 MiB: start lohand"));
  EXPECT_THAT(text, HasSubstr("smaller activation area (3 MiB of it)"));
  // One layer cannot stream: it says so.
  absl::StatusOr<ArenaChoice> single = ChooseArena(
      Spec({8 * kMiB}, 4, v1::ARENA_FIT_MOST), ArenaLimit{.bytes = kMiB});
  ASSERT_EQ(single.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(single.status().message(), HasSubstr("cannot stream"));
}

// The least arena is ChooseArena's last choice: what it takes at that
// limit, and nothing below it.
TEST(SmallestArena, OneSharedBufferOfEachOrTheLayoutAsGiven) {
  const std::vector<uint64_t> layers(8, kMiB);
  const v1::ModelSpec most = Spec(layers, 4, v1::ARENA_FIT_MOST);
  const uint64_t floor = SmallestArena(most);
  EXPECT_EQ(floor, Bytes(layers, 0, 1));
  absl::StatusOr<ArenaChoice> at = ChooseArena(most, {.bytes = floor});
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->arena_bytes, floor);
  EXPECT_EQ(at->grad_buffers, 1u);
  EXPECT_FALSE(ChooseArena(most, {.bytes = floor - 1}).ok());
  EXPECT_EQ(SmallestArena(Spec(layers, 0, v1::ARENA_FIT_MOST)),
            Bytes(layers, 0, 0));
  EXPECT_EQ(SmallestArena(Spec({8 * kMiB}, 4, v1::ARENA_FIT_MOST)),
            Bytes({8 * kMiB}, 0, 0));
  EXPECT_EQ(SmallestArena(Spec(layers, 4, v1::ARENA_FIT_AS_GIVEN)),
            Bytes(layers, 0, 4));
}

// What a job keeps of its model sizes the same arenas, and nothing else.
TEST(ArenaFieldsOf, SizesAsTheWholeSpecDoes) {
  v1::ModelSpec spec =
      Spec(std::vector<uint64_t>(8, kMiB), 4, v1::ARENA_FIT_MOST);
  spec.set_activation_bytes(3 * kMiB);
  spec.mutable_adam()->set_lr(1e-3);
  spec.add_param_groups()->set_name("no_weight_decay");
  const v1::ModelSpec kept = ArenaFieldsOf(spec);
  EXPECT_FALSE(kept.has_adam());
  EXPECT_EQ(kept.param_groups_size(), 0);
  EXPECT_EQ(SmallestArena(kept), SmallestArena(spec));
  for (uint64_t limit : {uint64_t{0}, 20 * kMiB, 14 * kMiB}) {
    absl::StatusOr<ArenaChoice> a = ChooseArena(spec, {.bytes = limit});
    absl::StatusOr<ArenaChoice> b = ChooseArena(kept, {.bytes = limit});
    ASSERT_TRUE(a.ok() && b.ok()) << limit;
    EXPECT_EQ(a->arena_bytes, b->arena_bytes);
    EXPECT_EQ(a->grad_buffers, b->grad_buffers);
  }
}

TEST(SizeJobArena, WithinTheSmallerOfPoolAndQuotaNamingIt) {
  const std::vector<uint64_t> layers(8, kMiB);
  const v1::ModelSpec spec = Spec(layers, 4, v1::ARENA_FIT_MOST);
  const uint64_t three = Bytes(layers, 0, 3);
  absl::StatusOr<v1::ArenaSizing> by_quota =
      SizeJobArena(spec, 1234, 100 * kMiB, three);
  ASSERT_TRUE(by_quota.ok()) << by_quota.status();
  EXPECT_EQ(by_quota->arena_bytes(), three);
  EXPECT_EQ(by_quota->stream_buffers(), 3u);
  EXPECT_EQ(by_quota->resident_arena_bytes(), Bytes(layers, 0, 0));
  absl::StatusOr<v1::ArenaSizing> unlimited = SizeJobArena(spec, 1234, 0, 0);
  ASSERT_TRUE(unlimited.ok());
  EXPECT_EQ(unlimited->stream_buffers(), 0u);
  absl::Status quota = SizeJobArena(spec, 1234, 100 * kMiB, kMiB).status();
  EXPECT_EQ(quota.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(quota.message(), HasSubstr("uid 1234's quota ([quotas] "
                                         "host_pool) is 1 MiB"));
  absl::Status pool = SizeJobArena(spec, 1234, kMiB, 100 * kMiB).status();
  EXPECT_THAT(pool.message(), HasSubstr("the whole host pool is 1 MiB"));
  EXPECT_THAT(pool.message(), HasSubstr("--host-pool-size"));
}

}  // namespace
}  // namespace lohan
