#ifndef LOHAN_DAEMON_SCHED_MODEL_LAYOUT_H_
#define LOHAN_DAEMON_SCHED_MODEL_LAYOUT_H_

// What a job's model looks like to the update pipeline, and how its
// optimizer states are cut into chunks and laid out in the store.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "daemon/optim/adam.h"
#include "daemon/optim/dtype.h"

namespace lohan {

// A job's model: layers, each one flat vector of parameters (the client
// flattens a layer's tensors in a fixed order), and how they are trained.
struct ModelLayout {
  // Parameters per layer, each > 0. Layer indices are positions here.
  std::vector<uint64_t> layer_elements;
  // Parameters per stored chunk (the unit read, updated and written);
  // the last chunk of a layer may be shorter. > 0.
  uint64_t chunk_elements = uint64_t{4} << 20;
  // Element type of the gradients the client submits: any DType.
  DType grad_dtype = DType::kBFloat16;
  // Element type of the 16-bit weight copy written for the next forward:
  // kBFloat16 or kFloat16.
  DType weight16_dtype = DType::kBFloat16;
  AdamOptions adam;
  // kFloat32, or kBFloat16 to halve the moments' bytes (see adam.h).
  DType moment_dtype = DType::kFloat32;
  // Elements updated with weight_decay 0 (biases and norm weights, as
  // torch's no-decay param group); every other Adam option as `adam`.
  // Empty: none. Otherwise one entry per layer: that layer's element ranges
  // [first, second), sorted by first, not overlapping (SetNoWeightDecay
  // builds it from ranges in any order).
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> no_weight_decay;
};

// INVALID_ARGUMENT naming the first problem (no layers, empty layer, zero
// chunk size, dtypes not allowed, more than 2^20 chunks in a layer; a
// no_weight_decay range that is empty, ends past its layer, overlaps the
// one before it or comes before it, or a no_weight_decay that has neither
// 0 nor one entry per layer). Adam's scalar options are checked by
// AdamUpdater::Step.
absl::Status ValidateLayout(const ModelLayout& layout);

// Elements [begin, end) of layer `layer`.
struct LayerRange {
  uint32_t layer = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Replaces layout.no_weight_decay with `ranges` (any order), grouped by
// layer and sorted. INVALID_ARGUMENT naming the first range whose layer is
// out of range (layout.layer_elements must be set); the other checks are
// ValidateLayout's.
absl::Status SetNoWeightDecay(const std::vector<LayerRange>& ranges,
                              ModelLayout& layout);

// A 64-bit hash of what decides the stored states' shape: layer sizes,
// chunk size, moment dtype and AMSGrad. Learning rate, betas, weight decay
// (and the no_weight_decay ranges), gradient and weight dtypes may change
// between runs of a job; these may not.
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

  // A run of a chunk's elements updated alike: `count` elements from
  // `begin` (relative to the chunk's first element), without weight decay
  // when `no_weight_decay`.
  struct Piece {
    uint64_t begin = 0;
    uint64_t count = 0;
    bool no_weight_decay = false;
  };
  // The chunk cut at the boundaries of the layout's no_weight_decay ranges
  // that fall inside it, in element order, adjacent exempt runs merged: one
  // piece (the whole chunk, decayed) when no range touches it, one exempt
  // piece when ranges cover it.
  std::vector<Piece> ChunkPieces(size_t layer, size_t chunk) const;

  // Bytes of the state tensor of a chunk of `count` parameters.
  uint64_t state_bytes(uint64_t count) const;
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
  // ModelLayout::no_weight_decay (empty, or one entry per layer).
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> no_weight_decay_;
  uint64_t chunk_elements_;
  size_t moment_size_;
  bool amsgrad_;
  size_t total_chunks_ = 0;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_MODEL_LAYOUT_H_
