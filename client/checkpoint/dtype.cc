#include "client/checkpoint/dtype.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <utility>

namespace lohan::checkpoint {
namespace {

// Safetensors is little-endian, as every host lohan runs on.
static_assert(std::endian::native == std::endian::little);

// Every dtype the safetensors format defines, with its bits per element.
constexpr std::array<std::pair<std::string_view, uint32_t>, 19> kDtypes = {{
    {"BOOL", 8},    {"U8", 8},   {"I8", 8},      {"F8_E5M2", 8}, {"F8_E4M3", 8},
    {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16},    {"F16", 16},    {"BF16", 16},
    {"I32", 32},    {"U32", 32}, {"F32", 32},    {"I64", 64},    {"U64", 64},
    {"F64", 64},    {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6},
}};

// `count` 16-bit values at `in` through `convert` into `out`.
template <float (*convert)(uint16_t)>
void Convert16(const void* in, uint64_t count, float* out) {
  const auto* bytes = static_cast<const unsigned char*>(in);
  for (uint64_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, bytes + 2 * i, 2);
    out[i] = convert(bits);
  }
}

}  // namespace

uint32_t DtypeBits(std::string_view name) {
  for (const auto& [dtype, bits] : kDtypes) {
    if (dtype == name) return bits;
  }
  return 0;
}

bool ReadsAsFloat(std::string_view name) {
  return name == "F32" || name == "BF16" || name == "F16";
}

float Bf16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

float F16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) {  // infinity or NaN: the payload moves up with it
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent != 0) {  // normal: rebias 15 -> 127
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) |
                                (mantissa << 13));
  }
  // Zero or subnormal: mantissa * 2^-24, a normal fp32 (or zero) exactly.
  const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  return sign != 0 ? -magnitude : magnitude;
}

void ConvertToFloat(std::string_view name, const void* in, uint64_t count,
                    float* out) {
  if (name == "BF16") return Convert16<Bf16ToFloat>(in, count, out);
  if (name == "F16") return Convert16<F16ToFloat>(in, count, out);
  std::memcpy(out, in, 4 * count);
}

}  // namespace lohan::checkpoint
