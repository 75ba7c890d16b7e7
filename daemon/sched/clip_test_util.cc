#include "daemon/sched/clip_test_util.h"

#include <cmath>
#include <cstring>
#include <random>

#include "daemon/optim/half.h"

namespace lohan {
namespace clip_test {

StoreOptions SmallStore(testing_util::TempDir& dir) {
  StoreOptions o;
  o.ssd_paths = {dir.Subdir("ssd0"), dir.Subdir("ssd1")};
  o.state_dir = dir.path() + "/state";
  o.stripe_unit = 64 << 10;
  o.queue_depth = 8;
  o.device_capacity_bytes = 16 << 20;
  return o;
}

ModelLayout Layout(DType grad_dtype) {
  ModelLayout layout;
  layout.layer_elements = {2500, 1000, 37, 4097};
  layout.chunk_elements = 1000;
  layout.grad_dtype = grad_dtype;
  layout.weight16_dtype = DType::kBFloat16;
  layout.adam.lr = 1e-2;
  layout.adam.weight_decay = 0.1;
  return layout;
}

Gradients MakeGradients(const ModelLayout& layout, uint32_t seed,
                        float grad_scale, int nan_layer) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.1f);
  const size_t size = layout.grad_dtype == DType::kFloat32 ? 4 : 2;
  Gradients g;
  std::vector<std::vector<double>> chunk_sums(layout.layer_elements.size());
  for (size_t l = 0; l < layout.layer_elements.size(); ++l) {
    const uint64_t n = layout.layer_elements[l];
    g.bytes.emplace_back(n * size);
    for (uint64_t i = 0; i < n; ++i) {
      float x = dist(rng);
      if (size == 4) {
        std::memcpy(&g.bytes[l][4 * i], &x, 4);
      } else {
        const uint16_t h = layout.grad_dtype == DType::kBFloat16
                               ? FloatToBf16(x)
                               : FloatToFp16(x);
        std::memcpy(&g.bytes[l][2 * i], &h, 2);
        x = layout.grad_dtype == DType::kBFloat16 ? Bf16ToFloat(h)
                                                  : Fp16ToFloat(h);
      }
      if (i % layout.chunk_elements == 0) chunk_sums[l].push_back(0.0);
      const double scaled = static_cast<double>(x * grad_scale);
      chunk_sums[l].back() += scaled * scaled;
    }
  }
  if (nan_layer >= 0) {
    // 0xffff is a NaN in bf16 and fp16, and half of an fp32 NaN's bytes.
    g.bytes[nan_layer][6] = 0xff;
    g.bytes[nan_layer][7] = 0xff;
  }
  double running = 0.0;
  for (size_t j = 0; j < chunk_sums.size(); ++j) {
    for (double s : chunk_sums[chunk_sums.size() - 1 - j]) {
      running += s;
      g.cumulative.push_back(running);
    }
  }
  return g;
}

double LimitCrossingAt(const ModelLayout& layout, uint32_t seed, size_t chunk,
                       float grad_scale) {
  const Gradients g = MakeGradients(layout, seed, grad_scale, -1);
  const double before = chunk == 0 ? 0.0 : g.cumulative[chunk - 1];
  return std::sqrt((before + g.cumulative[chunk]) / 2);
}

}  // namespace clip_test
}  // namespace lohan
