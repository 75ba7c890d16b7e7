// The trainer's host memory: each part from what it depends on, the sum
// at the peak (a load or a save, never both; the arena apart).
#include "plan/trainer_host.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

TrainerHostInputs Inputs() {
  TrainerHostInputs in;
  in.host_activation_bytes = 1000;
  in.largest_ssd_tensor_bytes = 300;
  in.frozen_host_bytes = 50;
  in.largest_parameter = 40;
  in.arena_bytes = 1 << 20;
  return in;
}

TEST(TrainerHostTest, AddsTheParts) {
  const TrainerHostBytes bytes = TrainerHostOf(Inputs());
  EXPECT_EQ(bytes.activations, 1000u);
  EXPECT_EQ(bytes.activation_read, 300u);
  EXPECT_EQ(bytes.frozen_weights, 50u);
  EXPECT_EQ(bytes.checkpoint_load, 0u);   // ranged reads into the arena
  EXPECT_EQ(bytes.checkpoint_save, 80u);  // 40 elements, 16-bit
  EXPECT_EQ(bytes.device, 0u);
  EXPECT_EQ(bytes.total(), 1000u + 300 + 50 + 80);
}

TEST(TrainerHostTest, TheArenaIsReportedNotAdded) {
  TrainerHostInputs in = Inputs();
  const uint64_t total = TrainerHostOf(in).total();
  in.arena_bytes *= 8;
  const TrainerHostBytes bytes = TrainerHostOf(in);
  EXPECT_EQ(bytes.arena_mapped, 8u << 20);
  EXPECT_EQ(bytes.total(), total);
}

TEST(TrainerHostTest, MovesWithEachPart) {
  const uint64_t base = TrainerHostOf(Inputs()).total();
  TrainerHostInputs in = Inputs();
  in.host_activation_bytes += 7;
  EXPECT_EQ(TrainerHostOf(in).total(), base + 7);
  in = Inputs();
  in.largest_ssd_tensor_bytes = 0;  // nothing on the SSDs
  EXPECT_EQ(TrainerHostOf(in).total(), base - 300);
  in = Inputs();
  in.largest_parameter *= 2;
  EXPECT_EQ(TrainerHostOf(in).total(), base + 80);
  in = Inputs();
  in.save_element_bytes = 4;  // an fp32 save_pretrained
  EXPECT_EQ(TrainerHostOf(in).total(), base + 80);
  in = Inputs();
  in.device_in_host_bytes = 5;
  EXPECT_EQ(TrainerHostOf(in).total(), base + 5);
}

}  // namespace
}  // namespace lohan
