#ifndef LOHAN_LAYOUT_MODEL_LAYOUT_H_
#define LOHAN_LAYOUT_MODEL_LAYOUT_H_

// What a job's model looks like to the update pipeline, and how its
// optimizer states are cut into chunks and laid out in the store.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "layout/adam_options.h"
#include "layout/dtype.h"

namespace lohan {

// Elements trained with their own learning rate and weight decay, as
// torch's param groups: lr x lr_scale, and this weight_decay in place of
// the job's (AdamW's decoupled decay or Adam's L2 term); betas, eps, the
// step, clipping and grad_scale as for the rest. `name` labels its ranges
// in errors ("no_weight_decay", "param_groups[1]").
struct ElementGroup {
  std::string name;
  double lr_scale = 1.0;
  double weight_decay = 0.0;
};

// The elements [begin, end) of a layer, in group `group` (an index into
// ModelLayout::groups).
struct GroupRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint32_t group = 0;
  bool operator==(const GroupRange&) const = default;
};

// The usual fine-tuning group: biases and norm weights without decay.
ElementGroup NoWeightDecayGroup();

// Parameters per stored chunk when the client does not choose (ModelSpec
// chunk_elements 0).
inline constexpr uint64_t kDefaultChunkElements = uint64_t{4} << 20;

// A job's model: layers, each one flat vector of parameters (the client
// flattens a layer's tensors in a fixed order), and how they are trained.
struct ModelLayout {
  // Parameters per layer, each > 0. Layer indices are positions here.
  std::vector<uint64_t> layer_elements;
  // Parameters per stored chunk (the unit read, updated and written);
  // the last chunk of a layer may be shorter. > 0.
  uint64_t chunk_elements = kDefaultChunkElements;
  // Element type of the gradients the client submits: any DType.
  DType grad_dtype = DType::kBFloat16;
  // Element type of the 16-bit weight copy written for the next forward:
  // kBFloat16 or kFloat16.
  DType weight16_dtype = DType::kBFloat16;
  AdamOptions adam;
  // kFloat32, or kBFloat16 to halve the moments' bytes (see adam.h).
  DType moment_dtype = DType::kFloat32;
  // Element groups with their own lr and weight decay (ElementGroup), and
  // where their elements are: group_ranges is empty (no groups) or has one
  // entry per layer, that layer's ranges sorted by begin, not overlapping,
  // whatever their groups. Elements in no range are trained with `adam`.
  // AddElementGroup builds both from ranges in any order.
  std::vector<ElementGroup> groups;
  std::vector<std::vector<GroupRange>> group_ranges;
};

// INVALID_ARGUMENT naming the first problem (no layers, empty layer, zero
// chunk size, dtypes not allowed, more than 2^20 chunks in a layer; a group
// whose lr_scale or weight_decay is negative or not finite; a group range
// that is empty, ends past its layer, overlaps the one before it (of any
// group) or comes before it, or names no group; group_ranges with neither 0
// nor one entry per layer). Adam's scalar options are checked by
// AdamUpdater::Step.
absl::Status ValidateLayout(const ModelLayout& layout);

// Elements [begin, end) of layer `layer`.
struct LayerRange {
  uint32_t layer = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Adds `group` to layout.groups and its `ranges` (any order) to
// layout.group_ranges, kept sorted per layer. INVALID_ARGUMENT naming the
// first range whose layer is out of range (layout.layer_elements must be
// set); nothing is added then. The other checks are ValidateLayout's. A
// group with no ranges is added all the same (it trains nothing).
absl::Status AddElementGroup(ElementGroup group,
                             const std::vector<LayerRange>& ranges,
                             ModelLayout& layout);

// A 64-bit hash of what decides the stored states' shape: layer sizes,
// chunk size, moment dtype and AMSGrad. Learning rate, betas, weight decay
// (and the element groups), gradient and weight dtypes may change between
// runs of a job; these may not.
uint64_t LayoutFingerprint(const ModelLayout& layout);

// One of the Adam moments in a chunk's state (torch's optimizer state
// names); the values are the wire's (RingStatePart).
enum class StatePart {
  kExpAvg = 1,
  kExpAvgSq = 2,
  kMaxExpAvgSq = 3,  // AMSGrad only
};

// Where a layout's chunks are and how one chunk's state is laid out in its
// store tensor: [fp32 weight | exp_avg | exp_avg_sq | max_exp_avg_sq if
// AMSGrad], each `count` elements, moments in moment_dtype.
// Immutable, thread-compatible.
class StateLayout {
 public:
  // REQUIRES: ValidateLayout(layout).ok().
  explicit StateLayout(const ModelLayout& layout);

  size_t num_layers() const { return layer_elements_.size(); }
  uint64_t layer_elements(size_t layer) const { return layer_elements_[layer]; }
  size_t num_chunks(size_t layer) const;
  size_t total_chunks() const { return total_chunks_; }
  // First parameter of the chunk within its layer, and its length.
  uint64_t chunk_begin(size_t chunk) const { return chunk * chunk_elements_; }
  uint64_t chunk_count(size_t layer, size_t chunk) const;

  static constexpr int32_t kNoGroup = -1;
  // A run of a chunk's elements updated alike: `count` elements from
  // `begin` (relative to the chunk's first element), in element group
  // `group` (kNoGroup: the job's own options).
  struct Piece {
    uint64_t begin = 0;
    uint64_t count = 0;
    int32_t group = kNoGroup;
  };
  // The chunk cut at the boundaries of the layout's group ranges that fall
  // inside it, in element order, adjacent runs of one group merged: one
  // piece (the whole chunk, no group) when no range touches it, one piece
  // of a group when its ranges cover it.
  std::vector<Piece> ChunkPieces(size_t layer, size_t chunk) const;
  // REQUIRES: 0 <= index < the layout's groups.
  const ElementGroup& group(int32_t index) const { return groups_[index]; }

  // Bytes of the state tensor of a chunk of `count` parameters.
  uint64_t state_bytes(uint64_t count) const {
    return StateBytes(count, moment_size_, amsgrad_);
  }
  // The same for a layout whose moments take `moment_size` bytes each
  // (DTypeSize(ModelLayout::moment_dtype)), three of them with AMSGrad.
  static uint64_t StateBytes(uint64_t count, size_t moment_size, bool amsgrad) {
    return count * (4 + (amsgrad ? 3 : 2) * moment_size);
  }
  // The most parameters in one chunk, over all layers.
  uint64_t max_chunk_count() const;
  // The largest state_bytes over all chunks.
  uint64_t max_state_bytes() const { return state_bytes(max_chunk_count()); }
  size_t moment_size() const { return moment_size_; }
  bool amsgrad() const { return amsgrad_; }
  // Byte offsets inside a chunk's state.
  uint64_t exp_avg_offset(uint64_t count) const { return 4 * count; }
  uint64_t exp_avg_sq_offset(uint64_t count) const {
    return 4 * count + moment_size_ * count;
  }
  uint64_t max_exp_avg_sq_offset(uint64_t count) const {
    return 4 * count + 2 * moment_size_ * count;
  }
  // REQUIRES: `part` is one of StatePart's values (kMaxExpAvgSq: amsgrad()).
  uint64_t moment_offset(StatePart part, uint64_t count) const {
    return 4 * count + (static_cast<uint64_t>(part) - 1) * moment_size_ * count;
  }

  // Store tensor names: "layer.000003.chunk.000012" and "meta".
  static std::string ChunkName(size_t layer, size_t chunk);
  static std::string MetaName();
  // A chunk's committed 16-bit weight copy when the pipeline streams them
  // (PipelineOptions::stream_weight16): "weight16.layer.000003.chunk.000012".
  static std::string Weight16Name(size_t layer, size_t chunk);
  // A chunk's gradient of the iteration in progress when the pipeline
  // streams gradients: "scratch.grad.layer.000003.chunk.000012". Every
  // tensor whose name starts with kScratchPrefix is per-iteration scratch:
  // never committed, and deleted wherever it is found outside an iteration.
  static std::string GradScratchName(size_t layer, size_t chunk);
  static constexpr char kScratchPrefix[] = "scratch.";

 private:
  std::vector<uint64_t> layer_elements_;
  std::vector<ElementGroup> groups_;
  // ModelLayout::group_ranges (empty, or one entry per layer).
  std::vector<std::vector<GroupRange>> group_ranges_;
  uint64_t chunk_elements_;
  size_t moment_size_;
  bool amsgrad_;
  size_t total_chunks_ = 0;
};

}  // namespace lohan

#endif  // LOHAN_LAYOUT_MODEL_LAYOUT_H_
