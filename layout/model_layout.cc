#include "layout/model_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "layout/dtype_traits.h"

namespace lohan {
namespace {

constexpr uint64_t kMaxChunksPerLayer = uint64_t{1} << 20;

class Fnv1a {
 public:
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      hash_ ^= (v >> (8 * i)) & 0xff;
      hash_ *= 0x100000001b3ull;
    }
  }
  uint64_t hash() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

bool IsHalf(DType d) { return d == DType::kBFloat16 || d == DType::kFloat16; }

}  // namespace

absl::Status ValidateLayout(const ModelLayout& layout) {
  if (layout.layer_elements.empty()) {
    return absl::InvalidArgumentError("model layout: no layers");
  }
  if (layout.chunk_elements == 0) {
    return absl::InvalidArgumentError("model layout: chunk_elements is 0");
  }
  for (size_t l = 0; l < layout.layer_elements.size(); ++l) {
    const uint64_t n = layout.layer_elements[l];
    if (n == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model layout: layer ", l, " has no parameters"));
    }
    if ((n - 1) / layout.chunk_elements + 1 > kMaxChunksPerLayer) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model layout: layer ", l, " needs more than ", kMaxChunksPerLayer,
          " chunks of ", layout.chunk_elements, " parameters"));
    }
  }
  for (const ElementGroup& group : layout.groups) {
    if (!(group.lr_scale >= 0.0) || !std::isfinite(group.lr_scale) ||
        !(group.weight_decay >= 0.0) || !std::isfinite(group.weight_decay)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model layout: ", group.name, " has lr_scale ",
                       group.lr_scale, " and weight_decay ", group.weight_decay,
                       "; both must be finite and >= 0"));
    }
  }
  if (!layout.group_ranges.empty() &&
      layout.group_ranges.size() != layout.layer_elements.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model layout: group ranges for ", layout.group_ranges.size(),
        " layers, not ", layout.layer_elements.size()));
  }
  for (size_t l = 0; l < layout.group_ranges.size(); ++l) {
    const auto& ranges = layout.group_ranges[l];
    for (size_t i = 0; i < ranges.size(); ++i) {
      const GroupRange& r = ranges[i];
      if (r.group >= layout.groups.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model layout: range [", r.begin, ", ", r.end, ") of layer ", l,
            " names group ", r.group, " of ", layout.groups.size()));
      }
      const std::string name =
          absl::StrCat("model layout: ", layout.groups[r.group].name,
                       " range [", r.begin, ", ", r.end, ") of layer ", l);
      if (r.begin >= r.end) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " is empty (begin must be < end)"));
      }
      if (r.end > layout.layer_elements[l]) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " ends past the layer's ",
                         layout.layer_elements[l], " elements"));
      }
      if (i == 0) continue;
      const GroupRange& prev = ranges[i - 1];
      // Only a range of another group says which it is.
      const std::string other =
          prev.group == r.group || prev.group >= layout.groups.size()
              ? ""
              : absl::StrCat(" (", layout.groups[prev.group].name, ")");
      if (r.begin < prev.begin) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " comes before [", prev.begin, ", ", prev.end,
                         ")", other, ": a layer's ranges must be sorted"));
      }
      if (r.begin < prev.end) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, " overlaps [", prev.begin, ", ", prev.end, ")", other));
      }
    }
  }
  if (DTypeSize(layout.grad_dtype) == 0) {
    return absl::InvalidArgumentError("model layout: unknown gradient dtype");
  }
  if (!IsHalf(layout.weight16_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model layout: the weight copy must be bfloat16 or float16, not ",
        DTypeName(layout.weight16_dtype)));
  }
  if (layout.moment_dtype != DType::kFloat32 &&
      layout.moment_dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        "model layout: moments must be float32 or bfloat16");
  }
  return absl::OkStatus();
}

ElementGroup NoWeightDecayGroup() {
  return ElementGroup{"no_weight_decay", 1.0, 0.0};
}

absl::Status AddElementGroup(ElementGroup group,
                             const std::vector<LayerRange>& ranges,
                             ModelLayout& layout) {
  const size_t layers = layout.layer_elements.size();
  for (size_t i = 0; i < ranges.size(); ++i) {
    const LayerRange& r = ranges[i];
    if (r.layer >= layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          group.name, " range ", i, " (layer ", r.layer, ", [", r.begin, ", ",
          r.end, ")): the model has ", layers, " layers"));
    }
  }
  const auto index = static_cast<uint32_t>(layout.groups.size());
  layout.groups.push_back(std::move(group));
  if (ranges.empty()) return absl::OkStatus();
  if (layout.group_ranges.empty()) layout.group_ranges.resize(layers);
  for (const LayerRange& r : ranges) {
    layout.group_ranges[r.layer].push_back(GroupRange{r.begin, r.end, index});
  }
  for (auto& layer_ranges : layout.group_ranges) {
    std::sort(layer_ranges.begin(), layer_ranges.end(),
              [](const GroupRange& a, const GroupRange& b) {
                return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
              });
  }
  return absl::OkStatus();
}

uint64_t LayoutFingerprint(const ModelLayout& layout) {
  Fnv1a h;
  h.U64(1);  // Format of the chunk states.
  h.U64(layout.layer_elements.size());
  for (uint64_t n : layout.layer_elements) h.U64(n);
  h.U64(layout.chunk_elements);
  h.U64(static_cast<uint64_t>(layout.moment_dtype));
  h.U64(layout.adam.amsgrad ? 1 : 0);
  return h.hash();
}

StateLayout::StateLayout(const ModelLayout& layout)
    : layer_elements_(layout.layer_elements),
      groups_(layout.groups),
      group_ranges_(layout.group_ranges),
      chunk_elements_(layout.chunk_elements),
      moment_size_(DTypeSize(layout.moment_dtype)),
      amsgrad_(layout.adam.amsgrad) {
  for (size_t l = 0; l < layer_elements_.size(); ++l) {
    total_chunks_ += num_chunks(l);
  }
}

size_t StateLayout::num_chunks(size_t layer) const {
  return static_cast<size_t>((layer_elements_[layer] - 1) / chunk_elements_ +
                             1);
}

uint64_t StateLayout::chunk_count(size_t layer, size_t chunk) const {
  const uint64_t begin = chunk_begin(chunk);
  return std::min(chunk_elements_, layer_elements_[layer] - begin);
}

std::vector<StateLayout::Piece> StateLayout::ChunkPieces(size_t layer,
                                                         size_t chunk) const {
  const uint64_t first = chunk_begin(chunk);
  const uint64_t last = first + chunk_count(layer, chunk);
  std::vector<Piece> pieces;
  uint64_t at = first;  // Layer index of the next element to place.
  auto add = [&](uint64_t begin, uint64_t end, int32_t group) {
    if (!pieces.empty() && pieces.back().group == group &&
        first + pieces.back().begin + pieces.back().count == begin) {
      pieces.back().count += end - begin;
    } else {
      pieces.push_back(Piece{begin - first, end - begin, group});
    }
    at = end;
  };
  if (!group_ranges_.empty()) {
    const auto& ranges = group_ranges_[layer];
    // Sorted and disjoint, so their ends are sorted too: the first range
    // ending after the chunk's first element.
    auto it = std::partition_point(
        ranges.begin(), ranges.end(),
        [first](const GroupRange& r) { return r.end <= first; });
    for (; it != ranges.end() && it->begin < last; ++it) {
      const uint64_t begin = std::max(it->begin, first);
      const uint64_t end = std::min(it->end, last);
      if (begin > at) add(at, begin, kNoGroup);
      add(begin, end, static_cast<int32_t>(it->group));
    }
  }
  if (at < last) add(at, last, kNoGroup);
  return pieces;
}

uint64_t StateLayout::max_chunk_count() const {
  uint64_t largest = 0;
  for (uint64_t n : layer_elements_) {
    largest = std::max(largest, std::min(n, chunk_elements_));
  }
  return largest;
}

std::string StateLayout::ChunkName(size_t layer, size_t chunk) {
  char name[64];
  std::snprintf(name, sizeof(name), "layer.%06zu.chunk.%06zu", layer, chunk);
  return name;
}

std::string StateLayout::MetaName() { return "meta"; }

std::string StateLayout::Weight16Name(size_t layer, size_t chunk) {
  return "weight16." + ChunkName(layer, chunk);
}

std::string StateLayout::GradScratchName(size_t layer, size_t chunk) {
  return std::string(kScratchPrefix) + "grad." + ChunkName(layer, chunk);
}

}  // namespace lohan
