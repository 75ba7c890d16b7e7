#include "layout/model_layout.h"

#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

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

using Ranges = std::vector<GroupRange>;

TEST(ModelLayoutTest, GroupRangesAreSortedPerLayerAndChecked) {
  ModelLayout l = Layout();  // {2500, 1000, 37}
  ASSERT_TRUE(AddElementGroup(NoWeightDecayGroup(),
                              {{2, 30, 37}, {0, 900, 1200}, {0, 10, 20}}, l)
                  .ok());
  ASSERT_TRUE(AddElementGroup(ElementGroup{"param_groups[0]", 0.1, 0.5},
                              {{0, 20, 30}, {2, 0, 30}}, l)
                  .ok());
  ASSERT_EQ(l.groups.size(), 2u);
  EXPECT_EQ(l.groups[1].lr_scale, 0.1);
  ASSERT_EQ(l.group_ranges.size(), 3u);
  EXPECT_EQ(l.group_ranges[0],
            (Ranges{{10, 20, 0}, {20, 30, 1}, {900, 1200, 0}}));
  EXPECT_TRUE(l.group_ranges[1].empty());
  EXPECT_EQ(l.group_ranges[2], (Ranges{{0, 30, 1}, {30, 37, 0}}));
  EXPECT_TRUE(ValidateLayout(l).ok());
  // Not part of the fingerprint.
  EXPECT_EQ(LayoutFingerprint(l), LayoutFingerprint(Layout()));
  // A group without ranges trains nothing and needs no per-layer lists.
  ModelLayout empty = Layout();
  ASSERT_TRUE(AddElementGroup(NoWeightDecayGroup(), {}, empty).ok());
  EXPECT_TRUE(empty.group_ranges.empty());
  EXPECT_TRUE(ValidateLayout(empty).ok());

  ModelLayout out_of_range = Layout();
  absl::Status s = AddElementGroup(NoWeightDecayGroup(), {{0, 0, 1}, {3, 0, 1}},
                                   out_of_range);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "no_weight_decay range 1 (layer 3, [0, 1)): the model has 3 "
            "layers");
  EXPECT_TRUE(out_of_range.groups.empty());  // nothing added

  struct Case {
    std::vector<LayerRange> no_decay;
    std::vector<LayerRange> scaled;
    ElementGroup scaled_group;
    const char* message;
  };
  const ElementGroup kScaled{"param_groups[0]", 2.0, 0.0};
  const Case cases[] = {
      {{{1, 5, 5}},
       {},
       kScaled,
       "model layout: no_weight_decay range [5, 5) of layer 1 is empty "
       "(begin must be < end)"},
      {{{1, 6, 5}},
       {},
       kScaled,
       "model layout: no_weight_decay range [6, 5) of layer 1 is empty "
       "(begin must be < end)"},
      {{{2, 0, 38}},
       {},
       kScaled,
       "model layout: no_weight_decay range [0, 38) of layer 2 ends past "
       "the layer's 37 elements"},
      {{{0, 100, 200}, {0, 199, 300}},
       {},
       kScaled,
       "model layout: no_weight_decay range [199, 300) of layer 0 overlaps "
       "[100, 200)"},
      {{{0, 100, 200}, {0, 100, 150}},
       {},
       kScaled,
       "model layout: no_weight_decay range [100, 200) of layer 0 overlaps "
       "[100, 150)"},
      // Across groups: an element is in one group at most.
      {{{0, 100, 200}},
       {{0, 150, 160}},
       kScaled,
       "model layout: param_groups[0] range [150, 160) of layer 0 overlaps "
       "[100, 200) (no_weight_decay)"},
      {{},
       {{0, 1, 2}},
       ElementGroup{"param_groups[0]", -1.0, 0.0},
       "model layout: param_groups[0] has lr_scale -1 and weight_decay 0; "
       "both must be finite and >= 0"},
      {{},
       {{0, 1, 2}},
       ElementGroup{"param_groups[0]", 1.0, std::nan("")},
       "model layout: param_groups[0] has lr_scale 1 and weight_decay nan; "
       "both must be finite and >= 0"},
  };
  for (const Case& c : cases) {
    ModelLayout bad = Layout();
    ASSERT_TRUE(AddElementGroup(NoWeightDecayGroup(), c.no_decay, bad).ok());
    ASSERT_TRUE(AddElementGroup(c.scaled_group, c.scaled, bad).ok());
    s = ValidateLayout(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), c.message);
  }
  // Built by hand: unsorted, not one entry per layer, an unknown group.
  ModelLayout bad = Layout();
  bad.groups = {NoWeightDecayGroup()};
  bad.group_ranges = {Ranges{{50, 60, 0}, {10, 20, 0}}, {}, {}};
  EXPECT_EQ(ValidateLayout(bad).message(),
            "model layout: no_weight_decay range [10, 20) of layer 0 comes "
            "before [50, 60): a layer's ranges must be sorted");
  bad.group_ranges = {Ranges{{10, 20, 0}}};
  EXPECT_EQ(ValidateLayout(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.group_ranges = {Ranges{{10, 20, 1}}, {}, {}};
  EXPECT_EQ(ValidateLayout(bad).message(),
            "model layout: range [10, 20) of layer 0 names group 1 of 1");
  // Touching ranges are fine.
  ModelLayout touching = Layout();
  ASSERT_TRUE(AddElementGroup(NoWeightDecayGroup(), {{0, 20, 30}, {0, 10, 20}},
                              touching)
                  .ok());
  ASSERT_TRUE(AddElementGroup(kScaled, {{0, 30, 40}}, touching).ok());
  EXPECT_TRUE(ValidateLayout(touching).ok());
}

using P = std::vector<std::tuple<uint64_t, uint64_t, int>>;

P Pieces(const StateLayout& s, size_t layer, size_t chunk) {
  P out;
  for (const StateLayout::Piece& p : s.ChunkPieces(layer, chunk)) {
    out.emplace_back(p.begin, p.count, p.group);
  }
  return out;
}

TEST(ModelLayoutTest, ChunksAreCutAtGroupBoundaries) {
  ModelLayout l = Layout();  // {2500, 1000, 37}, chunks of 1000.
  // Without ranges: every chunk is one piece of no group.
  StateLayout plain(l);
  EXPECT_EQ(Pieces(plain, 0, 2), (P{{0, 500, -1}}));
  EXPECT_EQ(Pieces(plain, 2, 0), (P{{0, 37, -1}}));

  const std::vector<LayerRange> no_decay = {
      // Layer 0: at its start, inside chunk 0, across 0|1, touching
      // [1500, 1600) (merged), then covering chunk 2 to the layer's end.
      {0, 0, 10},
      {0, 100, 200},
      {0, 900, 1500},
      {0, 1500, 1600},
      {0, 2000, 2500},
      // Layer 2: all of it.
      {2, 0, 37}};
  // Touching no-decay ranges of layer 0: never merged with them.
  const std::vector<LayerRange> scaled = {{0, 10, 20}, {0, 1600, 1700}};
  ASSERT_TRUE(AddElementGroup(NoWeightDecayGroup(), no_decay, l).ok());
  ASSERT_TRUE(
      AddElementGroup(ElementGroup{"param_groups[0]", 0.5, 0.0}, scaled, l)
          .ok());
  ASSERT_TRUE(ValidateLayout(l).ok());
  StateLayout s(l);
  EXPECT_EQ(Pieces(s, 0, 0), (P{{0, 10, 0},
                                {10, 10, 1},
                                {20, 80, -1},
                                {100, 100, 0},
                                {200, 700, -1},
                                {900, 100, 0}}));
  EXPECT_EQ(Pieces(s, 0, 1), (P{{0, 600, 0}, {600, 100, 1}, {700, 300, -1}}));
  EXPECT_EQ(Pieces(s, 0, 2), (P{{0, 500, 0}}));
  EXPECT_EQ(Pieces(s, 1, 0), (P{{0, 1000, -1}}));
  EXPECT_EQ(Pieces(s, 2, 0), (P{{0, 37, 0}}));
  EXPECT_EQ(s.group(1).lr_scale, 0.5);
}

}  // namespace
}  // namespace lohan
