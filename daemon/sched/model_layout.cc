#include "daemon/sched/model_layout.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "daemon/optim/optim_types.h"

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

uint64_t StateLayout::state_bytes(uint64_t count) const {
  return count * (4 + (amsgrad_ ? 3 : 2) * moment_size_);
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
