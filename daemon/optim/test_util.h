#ifndef LOHAN_DAEMON_OPTIM_TEST_UTIL_H_
#define LOHAN_DAEMON_OPTIM_TEST_UTIL_H_

// Test-only helpers for daemon/optim: float64 reference optimizers, random
// data, and the list of kernel tables this CPU can run.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "daemon/optim/adam.h"
#include "daemon/optim/half.h"
#include "daemon/optim/isa.h"
#include "daemon/optim/kernels.h"
#include "daemon/optim/sgd.h"
#include "gtest/gtest.h"

namespace lohan::optim_test {

#define LOHAN_SKIP_IF_CPU_LACKS(isa)                             \
  if (!::lohan::CpuSupportsIsa(isa))                             \
  GTEST_SKIP() << "this CPU lacks the " << ::lohan::IsaName(isa) \
               << " path; not tested here"

inline std::vector<float> RandomFloats(std::size_t n, uint32_t seed,
                                       float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Positive values (second moments).
inline std::vector<float> RandomPositive(std::size_t n, uint32_t seed,
                                         float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A gradient stored in `dtype`, with its exact float values.
struct TestGrad {
  DType dtype = DType::kFloat32;
  std::vector<float> f32;      // used when dtype is kFloat32
  std::vector<uint16_t> half;  // used otherwise
  std::vector<double> values;  // the stored values, exactly

  const void* data() const {
    return dtype == DType::kFloat32 ? static_cast<const void*>(f32.data())
                                    : static_cast<const void*>(half.data());
  }
};

inline TestGrad MakeGrad(const std::vector<float>& src, DType dtype) {
  TestGrad g;
  g.dtype = dtype;
  g.values.resize(src.size());
  if (dtype == DType::kFloat32) {
    g.f32 = src;
    for (std::size_t i = 0; i < src.size(); ++i) g.values[i] = src[i];
  } else {
    g.half.resize(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) {
      if (dtype == DType::kBFloat16) {
        g.half[i] = FloatToBf16(src[i]);
        g.values[i] = Bf16ToFloat(g.half[i]);
      } else {
        g.half[i] = FloatToFp16(src[i]);
        g.values[i] = Fp16ToFloat(g.half[i]);
      }
    }
  }
  return g;
}

// Adam/AdamW in float64, the formula of adam.h.
struct RefAdam {
  std::vector<double> w, m, v, vmax;
  // Magnitudes the float rounding errors scale with: max |w| seen, and m's
  // recurrence over |g| (m itself can cancel to near 0).
  std::vector<double> w_mag, m_mag;
  int64_t step = 0;

  void Step(const AdamOptions& o, const std::vector<double>& grad) {
    step += 1;
    const double t = static_cast<double>(step);
    const double bc1 = o.bias_correction ? 1.0 - std::pow(o.beta1, t) : 1.0;
    const double bc2 = o.bias_correction ? 1.0 - std::pow(o.beta2, t) : 1.0;
    const double step_size = o.lr / bc1;
    const double bc2_sqrt = std::sqrt(bc2);
    if (w_mag.empty()) {
      w_mag.resize(w.size());
      m_mag.resize(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) {
        w_mag[i] = std::abs(w[i]);
        m_mag[i] = std::abs(m[i]);
      }
    }
    for (std::size_t i = 0; i < w.size(); ++i) {
      double g = grad[i];
      if (o.decoupled_weight_decay) {
        w[i] *= 1.0 - o.lr * o.weight_decay;
      } else {
        g += o.weight_decay * w[i];
      }
      m[i] = o.beta1 * m[i] + (1.0 - o.beta1) * g;
      m_mag[i] = o.beta1 * m_mag[i] + (1.0 - o.beta1) * std::abs(g);
      v[i] = o.beta2 * v[i] + (1.0 - o.beta2) * g * g;
      double vv = v[i];
      if (o.amsgrad) {
        vmax[i] = std::max(vmax[i], v[i]);
        vv = vmax[i];
      }
      const double denom = std::sqrt(vv) / bc2_sqrt + o.eps;
      w[i] -= step_size * m[i] / denom;
      w_mag[i] = std::max(w_mag[i], std::abs(w[i]));
    }
  }
};

// SGD in float64, the formula of sgd.h, with the magnitudes float rounding
// errors scale with (max |w| seen; the momentum recurrence over |g|).
struct RefSgd {
  std::vector<double> w, buf, w_mag, g_mag;
  int64_t step = 0;

  void Step(const SgdOptions& o, const std::vector<double>& grad) {
    if (w_mag.empty()) {
      w_mag.resize(w.size());
      g_mag.assign(w.size(), 0.0);
      for (std::size_t i = 0; i < w.size(); ++i) w_mag[i] = std::abs(w[i]);
    }
    for (std::size_t i = 0; i < w.size(); ++i) {
      double g = grad[i] + o.weight_decay * w[i];
      const double mag = std::abs(grad[i]) + o.weight_decay * std::abs(w[i]);
      if (o.momentum != 0.0) {
        buf[i] = step == 0 ? g : o.momentum * buf[i] + (1.0 - o.dampening) * g;
        g_mag[i] = step == 0 ? mag : o.momentum * g_mag[i] + mag;
        g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
      } else {
        g_mag[i] = mag;
      }
      w[i] -= o.lr * g;
      w_mag[i] = std::max(w_mag[i], std::abs(w[i]));
    }
    step += 1;
  }
};

inline std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline std::vector<double> Scaled(const std::vector<double>& v, double s) {
  std::vector<double> out(v);
  for (double& x : out) x *= s;
  return out;
}

// Bitwise equality of two float vectors; returns the first differing index
// or -1.
inline long FirstBitDifference(const void* a, const void* b, std::size_t n,
                               std::size_t elem_size) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(pa + i * elem_size, pb + i * elem_size, elem_size) != 0) {
      return static_cast<long>(i);
    }
  }
  return -1;
}

inline const std::vector<Isa>& AllIsas() {
  static const std::vector<Isa> isas = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};
  return isas;
}

inline std::string IsaTestName(const testing::TestParamInfo<Isa>& info) {
  return std::string(IsaName(info.param));
}

}  // namespace lohan::optim_test

#endif  // LOHAN_DAEMON_OPTIM_TEST_UTIL_H_
