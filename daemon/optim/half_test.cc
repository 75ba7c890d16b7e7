#include "daemon/optim/half.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "daemon/optim/isa.h"
#include "daemon/optim/kernels.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(Bf16Test, RoundsToNearestEvenOnTies) {
  // 1.0 + half a bf16 ulp (2^-8): tie, 1.0's mantissa is even -> 1.0.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3F808000u)), 0x3F80u);
  // Next bf16 up is odd (0x3F81): its tie rounds up to the even 0x3F82.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3F818000u)), 0x3F82u);
  // Just above / below a tie.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3F808001u)), 0x3F81u);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3F807FFFu)), 0x3F80u);
  // Negative tie.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0xBF808000u)), 0xBF80u);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0xBF818000u)), 0xBF82u);
}

TEST(Bf16Test, SpecialValues) {
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000u);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000u);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7F80u);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xFF80u);
  // The largest float rounds to inf.
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80u);
  // Subnormals are kept, rounded to nearest even.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x00018000u)), 0x0002u);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x00008000u)), 0x0000u);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x00010001u)), 0x0001u);
}

TEST(Bf16Test, NanStaysNanAndIsQuieted) {
  // Quiet NaN.
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::quiet_NaN()), 0x7FC0u);
  // Signalling NaN with payload only in the low bits: must not become inf.
  const uint16_t snan_low = FloatToBf16(BitsToFloat(0x7F800001u));
  EXPECT_EQ(snan_low, 0x7FC0u);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(snan_low)));
  // Sign and high payload are kept.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0xFFA12345u)), 0xFFE1u);
  // A NaN whose rounding would carry must not change (no rounding for NaN).
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x7FFFFFFFu)), 0x7FFFu);
}

TEST(Bf16Test, RoundTripIsExactForEveryBf16) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(FloatToBf16(f), h | 0x40u) << h;
    } else {
      EXPECT_EQ(FloatToBf16(f), h) << h;
    }
  }
}

TEST(Fp16Test, RoundingAndRange) {
  EXPECT_EQ(FloatToFp16(1.0f), 0x3C00u);
  EXPECT_EQ(FloatToFp16(-2.0f), 0xC000u);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7BFFu);
  EXPECT_EQ(FloatToFp16(65519.99f), 0x7BFFu);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7C00u);  // tie to even -> inf
  EXPECT_EQ(FloatToFp16(1e10f), 0x7C00u);
  // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even -> 1.
  EXPECT_EQ(FloatToFp16(1.0f + 0x1p-11f), 0x3C00u);
  EXPECT_EQ(FloatToFp16(1.0f + 3 * 0x1p-11f), 0x3C02u);
  // Subnormals: 2^-24 is the smallest, 2^-25 ties to 0, 3*2^-25 ties to 2.
  EXPECT_EQ(FloatToFp16(0x1p-24f), 0x0001u);
  EXPECT_EQ(FloatToFp16(0x1p-25f), 0x0000u);
  EXPECT_EQ(FloatToFp16(0x1.8p-24f), 0x0002u);
  EXPECT_EQ(FloatToFp16(0x1p-14f), 0x0400u);
  EXPECT_EQ(FloatToFp16(std::numeric_limits<float>::quiet_NaN()) & 0x7E00u,
            0x7E00u);
  EXPECT_EQ(FloatToFp16(BitsToFloat(0x7F800001u)), 0x7E00u);
}

TEST(Fp16Test, RoundTripIsExactForEveryFp16) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(FloatToFp16(f), h | 0x0200u) << h;
    } else {
      EXPECT_EQ(FloatToFp16(f), h) << h;
    }
  }
}

// Float bit patterns that exercise rounding: every exponent with mantissa
// tails at and around the tie points of both formats, plus random bits.
std::vector<float> ConversionInputs() {
  std::vector<uint32_t> bits;
  const uint32_t tails[] = {0x0000, 0x0001,  0x0FFF,  0x1000,  0x1001,
                            0x2000, 0x3000,  0x7FFF,  0x8000,  0x8001,
                            0xFFFF, 0x17FFF, 0x18000, 0x18001, 0x7FFFFF};
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (uint32_t tail : tails) {
        for (uint32_t high : {0u, 0x10000u, 0x2A0000u, 0x7E0000u}) {
          bits.push_back((sign << 31) | (exponent << 23) |
                         ((high | tail) & 0x7FFFFFu));
        }
      }
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) bits.push_back(rng());
  std::vector<float> out;
  out.reserve(bits.size());
  for (uint32_t b : bits) out.push_back(BitsToFloat(b));
  return out;
}

struct TableCase {
  const char* name;
  const optim_internal::KernelTable& (*table)();
  bool (*supported)();
};

class ConversionTableTest : public testing::TestWithParam<TableCase> {};

TEST_P(ConversionTableTest, MatchesScalarBitForBit) {
  if (!GetParam().supported()) {
    GTEST_SKIP() << "this CPU lacks the " << GetParam().name << " path";
  }
  const optim_internal::KernelTable& table = GetParam().table();
  const std::vector<float> in = ConversionInputs();
  std::vector<uint16_t> bf16(in.size()), fp16(in.size());
  table.float_to_bf16(in.data(), bf16.data(), in.size());
  table.float_to_fp16(in.data(), fp16.data(), in.size());
  int mismatches = 0;
  for (std::size_t i = 0; i < in.size() && mismatches < 10; ++i) {
    if (bf16[i] != FloatToBf16(in[i])) {
      ++mismatches;
      ADD_FAILURE() << "bf16 of 0x" << std::hex << FloatBits(in[i])
                    << ": got 0x" << bf16[i] << " want 0x"
                    << FloatToBf16(in[i]);
    }
    if (fp16[i] != FloatToFp16(in[i])) {
      ++mismatches;
      ADD_FAILURE() << "fp16 of 0x" << std::hex << FloatBits(in[i])
                    << ": got 0x" << fp16[i] << " want 0x"
                    << FloatToFp16(in[i]);
    }
  }
  // Every 16-bit pattern back to float.
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000u; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> from_bf16(all.size()), from_fp16(all.size());
  table.bf16_to_float(all.data(), from_bf16.data(), all.size());
  table.fp16_to_float(all.data(), from_fp16.data(), all.size());
  for (uint32_t h = 0; h < 0x10000u && mismatches < 20; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    if (FloatBits(from_bf16[h]) != FloatBits(Bf16ToFloat(x))) {
      ++mismatches;
      ADD_FAILURE() << "bf16 0x" << std::hex << h << " to float";
    }
    if (FloatBits(from_fp16[h]) != FloatBits(Fp16ToFloat(x))) {
      ++mismatches;
      ADD_FAILURE() << "fp16 0x" << std::hex << h << " to float: got 0x"
                    << FloatBits(from_fp16[h]) << " want 0x"
                    << FloatBits(Fp16ToFloat(x));
    }
  }
}

bool Always() { return true; }
bool HasAvx2() { return CpuSupportsIsa(Isa::kAvx2); }
bool HasAvx512() { return CpuSupportsIsa(Isa::kAvx512); }
bool HasAvx512Bf16() { return CpuSupportsAvx512Bf16(); }

INSTANTIATE_TEST_SUITE_P(
    AllTables, ConversionTableTest,
    testing::Values(
        TableCase{"scalar", &optim_internal::ScalarKernels, &Always},
        TableCase{"avx2", &optim_internal::Avx2Kernels, &HasAvx2},
        TableCase{"avx512", &optim_internal::Avx512Kernels, &HasAvx512},
        TableCase{"avx512bf16", &optim_internal::Avx512Bf16Kernels,
                  &HasAvx512Bf16}),
    [](const testing::TestParamInfo<TableCase>& info) {
      return std::string(info.param.name);
    });

}  // namespace
}  // namespace lohan
