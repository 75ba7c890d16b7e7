#include "layout/byte_size.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(ParseByteSize, AcceptsPlainAndUnits) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("64KiB"), 64u * 1024);
  EXPECT_EQ(*ParseByteSize("8 GiB"), 8ull << 30);
  EXPECT_EQ(*ParseByteSize("1.5TiB"), 3ull << 39);
  EXPECT_EQ(*ParseByteSize("512MB"), 512000000u);
  EXPECT_EQ(*ParseByteSize("12b"), 12u);
  EXPECT_EQ(*ParseByteSize(" 2gib "), 2ull << 30);
}

TEST(ParseByteSize, RejectsGarbage) {
  for (const char* bad : {"", "GiB", "-1GiB", "+3", "1.2.3MiB", "12 parsecs",
                          "nan", "inf", "0x10"}) {
    auto parsed = ParseByteSize(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
  }
  EXPECT_EQ(ParseByteSize("99999999999TiB").status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(FormatByteSize, PicksLargestUnit) {
  EXPECT_EQ(FormatByteSize(512), "512 B");
  EXPECT_EQ(FormatByteSize(8ull << 30), "8.0 GiB");
  EXPECT_EQ(FormatByteSize(1536), "1.5 KiB");
}

}  // namespace
}  // namespace lohan
