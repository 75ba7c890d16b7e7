#ifndef LOHAN_DAEMON_OPTIM_KERNELS_AVX512_INL_H_
#define LOHAN_DAEMON_OPTIM_KERNELS_AVX512_INL_H_

// Internal to daemon/optim: the AVX-512 vector traits, included by
// kernels_avx512.cc (F/BW/VL) and kernels_avx512bf16.cc (+AVX512_BF16, with
// LOHAN_OPTIM_AVX512BF16 defined). Include only inside an anonymous
// namespace's translation unit compiled with the matching -m flags.

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace lohan::optim_internal {
namespace {

struct Avx512 {
  using F = __m512;
  struct Acc {
    __m512d lo;
    __m512d hi;
  };
  static constexpr bool kSoftwarePrefetch = true;
  static constexpr std::size_t kWidth = 16;

  static F Set(float x) { return _mm512_set1_ps(x); }
  static F LoadF32(const float* p) { return _mm512_loadu_ps(p); }
  static F LoadBf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static F LoadFp16(const uint16_t* p) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void StoreF32(float* p, F x) { _mm512_storeu_ps(p, x); }

  // Round to nearest even in integers; NaN: truncate and set the quiet bit.
  static __m256i Bf16Integer(F x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb =
        _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(bits,
                         _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)),
        16);
    const __m512i nan_value =
        _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(
        _mm512_mask_mov_epi32(rounded, is_nan, nan_value));
  }

  static __m256i Bf16Bits(F x) {
#ifdef LOHAN_OPTIM_AVX512BF16
    // VCVTNEPS2BF16 rounds to nearest even and quiets NaN like half.h, but
    // flushes subnormal inputs to zero: those (rare) lanes take the integer
    // path so every ISA gives the same bits.
    const __m256bh hw = _mm512_cvtneps_pbh(x);
    __m256i r;
    std::memcpy(&r, &hw, sizeof(r));
    const __m512i bits = _mm512_castps_si512(x);
    const __mmask16 subnormal =
        _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7F800000)) &
        _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x007FFFFF));
    if (subnormal != 0) r = _mm256_mask_mov_epi16(r, subnormal, Bf16Integer(x));
    return r;
#else
    return Bf16Integer(x);
#endif
  }
  static void StoreBf16(uint16_t* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), Bf16Bits(x));
  }
  // 16 bf16/fp16 values are 32 bytes: VMOVNTDQ ymm needs 32-byte alignment.
  static bool StreamAligned(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 31) == 0;
  }
  static void StreamBf16(uint16_t* p, F x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), Bf16Bits(x));
  }
  static void StreamFp16(uint16_t* p, F x) {
    _mm256_stream_si256(
        reinterpret_cast<__m256i*>(p),
        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void StreamFence() { _mm_sfence(); }
  static void StoreFp16(uint16_t* p, F x) {
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(p),
        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Max(F a, F b) { return _mm512_max_ps(a, b); }
  static Acc AccZero() { return Acc{_mm512_setzero_pd(), _mm512_setzero_pd()}; }
  static void AccSq(Acc& acc, F x) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi = _mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    acc.lo = _mm512_fmadd_pd(lo, lo, acc.lo);
    acc.hi = _mm512_fmadd_pd(hi, hi, acc.hi);
  }
  static double AccReduce(const Acc& acc) {
    alignas(64) double lanes[16];
    _mm512_store_pd(lanes, acc.lo);
    _mm512_store_pd(lanes + 8, acc.hi);
    double sum = 0.0;
    for (double lane : lanes) sum += lane;
    return sum;
  }
};

}  // namespace
}  // namespace lohan::optim_internal

#endif  // LOHAN_DAEMON_OPTIM_KERNELS_AVX512_INL_H_
