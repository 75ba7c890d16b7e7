#include "plan/layout_bytes.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// The daemon's arena for these layers (tests/python/test_plan_memory.py
// compares it with real runs).
TEST(PluginArenaBytes, IsTheArenaTheDaemonSizes) {
  const std::vector<uint64_t> gpt2 = {72192, 128, 49984, 49984};
  EXPECT_EQ(PluginArenaBytes(gpt2, 2, 0, 0), 2097152u);
  EXPECT_EQ(PluginArenaBytes(gpt2, 2, 16 * kMiB, 0), 18874368u);
  EXPECT_EQ(PluginArenaBytes(gpt2, 2, 0, 3), 3145728u);
  std::vector<uint64_t> deep = {24576, 128};
  deep.insert(deep.end(), 6, 49984);
  EXPECT_EQ(PluginArenaBytes(deep, 2, 0, 0), 3145728u);
  EXPECT_EQ(PluginArenaBytes(deep, 2, 0, 4), 2097152u);
  EXPECT_EQ(PluginArenaBytes(deep, 2, 16 * kMiB, 4), 18874368u);
  // As many shared buffers as layers, or more, is the resident layout.
  EXPECT_EQ(PluginArenaBytes({5 * kMiB}, 2, 0, 4), 42991616u);
  EXPECT_EQ(PluginArenaBytes({5 * kMiB}, 2, 0, 0), 42991616u);
}

TEST(PluginStreamBuffers, FourOrOneFewerThanTheLayers) {
  EXPECT_EQ(PluginStreamBuffers(1), 0u);
  EXPECT_EQ(PluginStreamBuffers(2), 1u);
  EXPECT_EQ(PluginStreamBuffers(5), 4u);
  EXPECT_EQ(PluginStreamBuffers(100), 4u);
}

// Two layers of 5000 and 100 parameters (one chunk each): the states are
// 12 bytes a parameter, the meta 64 bytes, each version rounded up to the
// 4 KiB block.
TEST(LayoutBytes, ResidentAndStreamedByHand) {
  absl::StatusOr<JobLayoutBytes> resident =
      LayoutBytes({5000, 100}, false, 0, 4096);
  ASSERT_TRUE(resident.ok()) << resident.status();
  EXPECT_EQ(resident->stream_buffers, 0u);
  EXPECT_EQ(resident->arena_bytes, 2 * kMiB);
  EXPECT_EQ(resident->update_buffer_bytes, 4 * 61440u);
  EXPECT_EQ(resident->ssd_state_bytes, 4096u + 61440 + 4096);
  EXPECT_EQ(resident->ssd_state_tensor_bytes, 64u + 60000 + 1200);
  EXPECT_EQ(resident->ssd_scratch_bytes, 0u);
  EXPECT_EQ(resident->ssd_set_aside_bytes, 2 * 69632u + 5 * 61440);
  EXPECT_EQ(resident->host_bytes(), 2 * kMiB + 4 * 61440);
  EXPECT_EQ(resident->ssd_bytes(), resident->ssd_set_aside_bytes);

  absl::StatusOr<JobLayoutBytes> streamed =
      LayoutBytes({5000, 100}, true, 0, 4096);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(streamed->stream_buffers, 1u);
  EXPECT_EQ(streamed->arena_bytes, 2 * kMiB);
  // A chunk buffer also holds the streamed gradient and 16-bit copy, and
  // eight chunks' 16-bit copies wait for their fetch.
  EXPECT_EQ(streamed->update_buffer_bytes,
            4 * (61440u + 12288 + 12288) + 8 * 12288);
  // The 16-bit copies join the kept tensors, the gradients are scratch.
  EXPECT_EQ(streamed->ssd_state_bytes, 69632u + 12288 + 4096);
  EXPECT_EQ(streamed->ssd_state_tensor_bytes, 61264u + 10000 + 200);
  EXPECT_EQ(streamed->ssd_scratch_bytes, 12288u + 4096);
  // The set-aside holds the streamed gradients too: no other write may
  // take their space while the job trains.
  EXPECT_EQ(streamed->ssd_set_aside_bytes,
            2 * 86016u + 5 * 61440 + streamed->ssd_scratch_bytes);
  EXPECT_EQ(streamed->ssd_bytes(), streamed->ssd_set_aside_bytes);
}

TEST(LayoutBytes, ALayerPastTheChunkIsCutIntoChunks) {
  const uint64_t chunk = uint64_t{4} << 20;  // the daemon's default
  absl::StatusOr<JobLayoutBytes> bytes =
      LayoutBytes({2 * chunk + 1}, true, 0, 4096);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->stream_buffers, 0u);  // one layer: resident
  EXPECT_EQ(bytes->ssd_state_bytes, 4096 + 2 * 12 * chunk + 4096);
  EXPECT_EQ(bytes->update_buffer_bytes, 4 * 12 * chunk);
  EXPECT_EQ(bytes->ssd_set_aside_bytes,
            2 * bytes->ssd_state_bytes + 5 * 12 * chunk);
  // A larger block rounds each small tensor up further.
  absl::StatusOr<JobLayoutBytes> coarse =
      LayoutBytes({2 * chunk + 1}, true, 0, 1 << 20);
  ASSERT_TRUE(coarse.ok()) << coarse.status();
  EXPECT_EQ(coarse->ssd_state_bytes, (1 << 20) + 2 * 12 * chunk + (1 << 20));
}

TEST(LayoutBytes, WhatTheDaemonWouldRefuseIsRefused) {
  EXPECT_THAT(LayoutBytes({10, 0}, false, 0, 4096).status().message(),
              HasSubstr("refuse"));
  EXPECT_THAT(
      LayoutBytes({uint64_t{1} << 60}, false, 0, 4096).status().message(),
      HasSubstr("parameters"));
  EXPECT_THAT(LayoutBytes({10}, false, 0, 3000).status().message(),
              HasSubstr("power of two"));
}

}  // namespace
}  // namespace lohan
