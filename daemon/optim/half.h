#ifndef LOHAN_DAEMON_OPTIM_HALF_H_
#define LOHAN_DAEMON_OPTIM_HALF_H_

// Scalar conversions between fp32 and the two 16-bit float formats the
// optimizer reads (gradients, moments) and writes (weight copies).
//
// float -> bf16 / fp16 round to nearest, ties to even, keep subnormals, and
// turn every NaN into a quiet NaN of the same sign with the payload truncated
// (what x86's VCVTNEPS2BF16 and VCVTPS2PH do with NaN). Overflow gives inf.
// bf16 / fp16 -> float is exact.
//
// These are the definition the SIMD paths are tested against bit for bit.

#include <cstdint>
#include <cstring>

namespace lohan {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: truncate, set the quiet bit.
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  const uint32_t rounding_bias = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding_bias) >> 16);
}

inline float Bf16ToFloat(uint16_t h) {
  return BitsToFloat(static_cast<uint32_t>(h) << 16);
}

inline uint16_t FloatToFp16(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) {  // NaN: quiet, payload truncated to 10 bits.
    return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x03FFu));
  }
  if (ax >= 0x477FF000u) {  // >= 65520 (incl. inf) rounds to inf.
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (ax >= 0x38800000u) {  // Normal fp16 (>= 2^-14).
    ax += 0x0FFFu + ((ax >> 13) & 1u);
    ax -= (127u - 15u) << 23;
    return static_cast<uint16_t>(sign | (ax >> 13));
  }
  if (ax <= 0x33000000u) {  // <= 2^-25 (ties to even: 0).
    return static_cast<uint16_t>(sign);
  }
  // Subnormal fp16: units of 2^-24, from a normal float.
  const uint32_t exponent = ax >> 23;  // 102..112
  const uint32_t mantissa = (ax & 0x007FFFFFu) | 0x00800000u;
  const uint32_t shift = 126u - exponent;  // 14..24
  uint32_t result = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x03FFu;
  if (exponent == 0x1Fu) {  // inf / NaN (NaN kept, quieted like VCVTPH2PS).
    const uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
    return BitsToFloat(sign | 0x7F800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace lohan

#endif  // LOHAN_DAEMON_OPTIM_HALF_H_
