#include "daemon/store/crc32c.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lohan {
namespace {

struct Vector {
  std::vector<uint8_t> data;
  uint32_t crc;
};

// RFC 3720 (iSCSI) appendix B.4 vectors plus the classic check value.
std::vector<Vector> KnownVectors() {
  std::vector<Vector> v;
  v.push_back({std::vector<uint8_t>(32, 0x00), 0x8A9136AAu});
  v.push_back({std::vector<uint8_t>(32, 0xFF), 0x62A8AB43u});
  std::vector<uint8_t> up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<uint8_t>(i);
    down[i] = static_cast<uint8_t>(31 - i);
  }
  v.push_back({up, 0x46DD794Eu});
  v.push_back({down, 0x113FDB5Cu});
  const char* check = "123456789";
  v.push_back({std::vector<uint8_t>(check, check + 9), 0xE3069283u});
  return v;
}

TEST(Crc32cTest, KnownVectors) {
  for (const Vector& v : KnownVectors()) {
    EXPECT_EQ(Crc32c(v.data.data(), v.data.size()), v.crc);
    EXPECT_EQ(Crc32cExtendPortable(0, v.data.data(), v.data.size()), v.crc);
  }
  EXPECT_EQ(Crc32c("", 0), 0u);
}

TEST(Crc32cTest, HardwareAndPortableAgreeOnRandomData) {
  std::mt19937_64 rng(42);
  std::vector<uint8_t> buf(70000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t offset : {0, 1, 3, 7}) {
    for (size_t len : {0, 1, 7, 8, 9, 63, 4096, 65537}) {
      EXPECT_EQ(Crc32c(buf.data() + offset, len),
                Crc32cExtendPortable(0, buf.data() + offset, len))
          << offset << " " << len;
    }
  }
}

// The hardware path splits long buffers into three interleaved lanes of
// 4 KiB joined by a shift: lengths either side of each multiple of 12 KiB,
// starts at every alignment, and a running CRC carried into the lanes.
TEST(Crc32cTest, InterleavedLanesMatchThePortableTable) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf((1 << 20) + 64);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const size_t lanes = 3 * 4096;
  for (size_t offset : {0, 1, 5, 8}) {
    for (size_t len : {lanes - 1, lanes, lanes + 1, 2 * lanes - 8, 2 * lanes,
                       2 * lanes + 13, size_t{1} << 20}) {
      for (uint32_t running : {0u, 0xDEADBEEFu}) {
        EXPECT_EQ(Crc32cExtend(running, buf.data() + offset, len),
                  Crc32cExtendPortable(running, buf.data() + offset, len))
            << offset << " " << len << " " << running;
      }
    }
  }
}

TEST(Crc32cTest, ExtendIsConcatenation) {
  const std::string a = "hello, ";
  const std::string b = "world";
  const std::string ab = a + b;
  EXPECT_EQ(Crc32cExtend(Crc32c(a.data(), a.size()), b.data(), b.size()),
            Crc32c(ab.data(), ab.size()));
}

TEST(Crc32cTest, DetectsSingleBitFlip) {
  std::vector<uint8_t> buf(4096, 0x5A);
  const uint32_t before = Crc32c(buf.data(), buf.size());
  buf[1234] ^= 0x10;
  EXPECT_NE(Crc32c(buf.data(), buf.size()), before);
}

}  // namespace
}  // namespace lohan
