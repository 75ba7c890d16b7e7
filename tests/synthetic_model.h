#ifndef LOHAN_TESTS_SYNTHETIC_MODEL_H_
#define LOHAN_TESTS_SYNTHETIC_MODEL_H_

// A synthetic N-layer model shared by the training client (which drives a
// real lohand) and the tests (which compute what the weights must be):
// deterministic initial weights and per-iteration gradients, and a
// float64 reference of torch's AdamW with torch's clip_grad_norm_.

#include <cmath>
#include <cstdint>
#include <vector>

namespace lohan::testing {

struct SyntheticAdam {
  double lr = 1e-2;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// A value in [-1, 1) from a hash of the arguments.
inline double SyntheticValue(uint64_t seed, uint64_t a, uint64_t b,
                             uint64_t c) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (a + 1) * 0xbf58476d1ce4e5b9ull ^
               (b + 1) * 0x94d049bb133111ebull ^
               (c + 7) * 0x2545f4914f6cdd1dull;
  x ^= x >> 31;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

inline float InitialWeight(uint64_t seed, uint64_t layer, uint64_t i) {
  return static_cast<float>(0.5 * SyntheticValue(seed, 1, layer, i));
}

// `scale` lets a test force clipping (large gradients). Odd iterations'
// gradients are 20x larger, so clipping changes their relative size (Adam
// alone is nearly blind to a constant gradient scale).
inline float Gradient(uint64_t seed, uint64_t iteration, uint64_t layer,
                      uint64_t i, double scale) {
  const double swing = iteration % 2 == 1 ? 20.0 : 1.0;
  return static_cast<float>(scale * swing *
                            SyntheticValue(seed, 100 + iteration, layer, i));
}

// The float64 reference: weights per layer after `iterations` AdamW steps
// on gradients `grad(iteration, layer, i)` (already rounded to the dtype the
// client sends), clipping the global norm to max_norm when > 0.
template <typename GradFn>
std::vector<std::vector<double>> ReferenceAdamW(
    const std::vector<uint64_t>& layers, uint64_t seed, int iterations,
    const SyntheticAdam& adam, double max_norm, GradFn grad) {
  std::vector<std::vector<double>> w(layers.size()), m(layers.size()),
      v(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    for (uint64_t i = 0; i < layers[l]; ++i) {
      w[l].push_back(InitialWeight(seed, l, i));
    }
    m[l].assign(layers[l], 0.0);
    v[l].assign(layers[l], 0.0);
  }
  for (int t = 1; t <= iterations; ++t) {
    double sum_squares = 0.0;
    for (size_t l = 0; l < layers.size(); ++l) {
      for (uint64_t i = 0; i < layers[l]; ++i) {
        const double g = grad(t - 1, l, i);
        sum_squares += g * g;
      }
    }
    const double norm = std::sqrt(sum_squares);
    double scale = 1.0;
    if (max_norm > 0.0) scale = std::min(1.0, max_norm / (norm + 1e-6));
    const double bias1 = 1.0 - std::pow(adam.beta1, t);
    const double bias2 = 1.0 - std::pow(adam.beta2, t);
    for (size_t l = 0; l < layers.size(); ++l) {
      for (uint64_t i = 0; i < layers[l]; ++i) {
        const double g = grad(t - 1, l, i) * scale;
        w[l][i] *= 1.0 - adam.lr * adam.weight_decay;
        m[l][i] = adam.beta1 * m[l][i] + (1 - adam.beta1) * g;
        v[l][i] = adam.beta2 * v[l][i] + (1 - adam.beta2) * g * g;
        const double denom = std::sqrt(v[l][i]) / std::sqrt(bias2) + adam.eps;
        w[l][i] -= adam.lr / bias1 * m[l][i] / denom;
      }
    }
  }
  return w;
}

}  // namespace lohan::testing

#endif  // LOHAN_TESTS_SYNTHETIC_MODEL_H_
