#include "daemon/sched/model_layout.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

ModelLayout Layout() {
  ModelLayout l;
  l.layer_elements = {2500, 1000, 37};
  l.chunk_elements = 1000;
  return l;
}

TEST(ModelLayoutTest, CutsLayersIntoChunks) {
  ModelLayout layout = Layout();
  ASSERT_TRUE(ValidateLayout(layout).ok());
  StateLayout s(layout);
  EXPECT_EQ(s.num_layers(), 3u);
  EXPECT_EQ(s.num_chunks(0), 3u);
  EXPECT_EQ(s.num_chunks(1), 1u);
  EXPECT_EQ(s.num_chunks(2), 1u);
  EXPECT_EQ(s.total_chunks(), 5u);
  EXPECT_EQ(s.chunk_begin(2), 2000u);
  EXPECT_EQ(s.chunk_count(0, 2), 500u);
  EXPECT_EQ(s.chunk_count(2, 0), 37u);
  EXPECT_EQ(s.state_bytes(10), 10u * 12);
  EXPECT_EQ(s.max_chunk_count(), 1000u);
  EXPECT_EQ(s.max_state_bytes(), 1000u * 12);
  EXPECT_EQ(s.exp_avg_sq_offset(10), 80u);

  layout.moment_dtype = DType::kBFloat16;
  layout.adam.amsgrad = true;
  StateLayout t(layout);
  EXPECT_EQ(t.state_bytes(10), 10u * (4 + 3 * 2));
  EXPECT_EQ(t.exp_avg_offset(10), 40u);
  EXPECT_EQ(t.exp_avg_sq_offset(10), 60u);
  EXPECT_EQ(t.max_exp_avg_sq_offset(10), 80u);
  EXPECT_EQ(StateLayout::ChunkName(3, 12), "layer.000003.chunk.000012");
  EXPECT_EQ(StateLayout::Weight16Name(3, 12),
            "weight16.layer.000003.chunk.000012");
  EXPECT_EQ(StateLayout::GradScratchName(3, 12),
            "scratch.grad.layer.000003.chunk.000012");
  EXPECT_EQ(
      StateLayout::GradScratchName(0, 0).rfind(StateLayout::kScratchPrefix, 0),
      0u);
}

TEST(ModelLayoutTest, FingerprintCoversOnlyTheStatesShape) {
  const ModelLayout base = Layout();
  const uint64_t f = LayoutFingerprint(base);
  ModelLayout same = base;
  same.adam.lr = 0.5;
  same.grad_dtype = DType::kFloat32;
  same.weight16_dtype = DType::kFloat16;
  EXPECT_EQ(LayoutFingerprint(same), f);
  ModelLayout other = base;
  other.layer_elements[2] = 38;
  EXPECT_NE(LayoutFingerprint(other), f);
  other = base;
  other.chunk_elements = 999;
  EXPECT_NE(LayoutFingerprint(other), f);
  other = base;
  other.moment_dtype = DType::kBFloat16;
  EXPECT_NE(LayoutFingerprint(other), f);
  other = base;
  other.adam.amsgrad = true;
  EXPECT_NE(LayoutFingerprint(other), f);
}

TEST(ModelLayoutTest, RejectsBadLayouts) {
  ModelLayout l = Layout();
  l.layer_elements.clear();
  EXPECT_FALSE(ValidateLayout(l).ok());
  l = Layout();
  l.layer_elements[1] = 0;
  EXPECT_FALSE(ValidateLayout(l).ok());
  l = Layout();
  l.chunk_elements = 0;
  EXPECT_FALSE(ValidateLayout(l).ok());
  l = Layout();
  l.chunk_elements = 1;
  l.layer_elements[0] = (uint64_t{1} << 20) + 1;
  EXPECT_FALSE(ValidateLayout(l).ok());
  l = Layout();
  l.weight16_dtype = DType::kFloat32;
  EXPECT_FALSE(ValidateLayout(l).ok());
  l = Layout();
  l.moment_dtype = DType::kFloat16;
  EXPECT_FALSE(ValidateLayout(l).ok());
  l = Layout();
  l.grad_dtype = static_cast<DType>(9);
  EXPECT_FALSE(ValidateLayout(l).ok());
}

}  // namespace
}  // namespace lohan
