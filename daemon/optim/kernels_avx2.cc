// AVX2 + FMA + F16C kernels, 8 floats a vector. Compiled with
// -mavx2 -mfma -mf16c; only reached through KernelsFor() on a CPU that has
// them.

#include <immintrin.h>

#include "daemon/optim/kernel_generic_inl.h"
#include "daemon/optim/kernel_table.h"

namespace lohan::optim_internal {
namespace {

struct Avx2 {
  using F = __m256;
  struct Acc {
    __m256d lo;
    __m256d hi;
  };
  static constexpr bool kSoftwarePrefetch = true;
  static constexpr std::size_t kWidth = 8;

  static F Set(float x) { return _mm256_set1_ps(x); }
  static F LoadF32(const float* p) { return _mm256_loadu_ps(p); }
  static F LoadBf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static F LoadFp16(const uint16_t* p) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void StoreF32(float* p, F x) { _mm256_storeu_ps(p, x); }
  static __m128i Bf16Bits(F x) {
    // Round to nearest even in integers; NaN: truncate and set the quiet bit.
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i lsb =
        _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(bits,
                         _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)),
        16);
    const __m256i nan_value =
        _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    const __m256i is_nan =
        _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i r = _mm256_blendv_epi8(rounded, nan_value, is_nan);
    // Pack the low 16 bits of the 8 lanes (values fit in 16 bits unsigned).
    return _mm_packus_epi32(_mm256_castsi256_si128(r),
                            _mm256_extracti128_si256(r, 1));
  }
  static void StoreBf16(uint16_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), Bf16Bits(x));
  }
  static void StoreFp16(uint16_t* p, F x) {
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(p),
        _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // 8 bf16/fp16 values are 16 bytes: VMOVNTDQ xmm needs 16-byte alignment.
  static bool StreamAligned(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
  }
  static void StreamBf16(uint16_t* p, F x) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), Bf16Bits(x));
  }
  static void StreamFp16(uint16_t* p, F x) {
    _mm_stream_si128(
        reinterpret_cast<__m128i*>(p),
        _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void StreamFence() { _mm_sfence(); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Max(F a, F b) { return _mm256_max_ps(a, b); }
  static Acc AccZero() { return Acc{_mm256_setzero_pd(), _mm256_setzero_pd()}; }
  static void AccSq(Acc& acc, F x) {
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    acc.lo = _mm256_fmadd_pd(lo, lo, acc.lo);
    acc.hi = _mm256_fmadd_pd(hi, hi, acc.hi);
  }
  static double AccReduce(const Acc& acc) {
    alignas(32) double lanes[8];
    _mm256_store_pd(lanes, acc.lo);
    _mm256_store_pd(lanes + 4, acc.hi);
    double sum = 0.0;
    for (double lane : lanes) sum += lane;
    return sum;
  }
};

}  // namespace

const KernelTable& Avx2Kernels() {
  static const KernelTable table = generic::MakeTable<Avx2>("avx2");
  return table;
}

}  // namespace lohan::optim_internal
