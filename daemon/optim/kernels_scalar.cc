// Baseline x86-64 kernels: one float at a time, the same operations as the
// SIMD paths (see kernels.h), with half.h's conversions.

#include <cmath>

#include "daemon/optim/half.h"
#include "daemon/optim/kernel_generic_inl.h"
#include "daemon/optim/kernel_table.h"

namespace lohan::optim_internal {
namespace {

struct Scalar {
  using F = float;
  using Acc = double;
  static constexpr bool kSoftwarePrefetch = false;
  static constexpr std::size_t kWidth = 1;

  static F Set(float x) { return x; }
  static F LoadF32(const float* p) { return *p; }
  static F LoadBf16(const uint16_t* p) { return Bf16ToFloat(*p); }
  static F LoadFp16(const uint16_t* p) { return Fp16ToFloat(*p); }
  static void StoreF32(float* p, F x) { *p = x; }
  static void StoreBf16(uint16_t* p, F x) { *p = FloatToBf16(x); }
  static void StoreFp16(uint16_t* p, F x) { *p = FloatToFp16(x); }
  static bool StreamAligned(const void*) { return false; }
  static void StreamBf16(uint16_t* p, F x) { StoreBf16(p, x); }
  static void StreamFp16(uint16_t* p, F x) { StoreFp16(p, x); }
  static void StreamFence() {}
  static F Mul(F a, F b) { return a * b; }
  static F Div(F a, F b) { return a / b; }
  static F Add(F a, F b) { return a + b; }
  static F Sqrt(F a) { return std::sqrt(a); }
  static F Fma(F a, F b, F c) { return std::fma(a, b, c); }
  static F Max(F a, F b) { return a > b ? a : b; }  // x86 MAXPS semantics
  static Acc AccZero() { return 0.0; }
  static void AccSq(Acc& acc, F x) {
    const double d = x;
    acc += d * d;  // the product is exact in double
  }
  static double AccReduce(const Acc& acc) { return acc; }
};

}  // namespace

const KernelTable& ScalarKernels() {
  static const KernelTable table = generic::MakeTable<Scalar>("scalar");
  return table;
}

}  // namespace lohan::optim_internal
