#include "daemon/store/aligned_buffer.h"

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace lohan {
namespace {

bool AllZero(const AlignedBuffer& buffer) {
  for (size_t i = 0; i < buffer.size(); ++i) {
    if (buffer.data()[i] != 0) return false;
  }
  return true;
}

// The VmFlags line of the /proc/self/smaps mapping holding `address`.
std::string FlagsOfMappingHolding(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t want = reinterpret_cast<uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t start = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> start >> dash >> end && dash == '-') {
      inside = start <= want && want < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(AlignedBufferTest, SmallBuffersKeepTheirAlignmentAndAreZeroed) {
  AlignedBuffer buffer(12345, 4096);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % 4096, 0u);
  EXPECT_EQ(buffer.size(), 12345u);
  EXPECT_TRUE(AllZero(buffer));
}

TEST(AlignedBufferTest, LargeBuffersStartOnAHugePageAndAreAdvisedHuge) {
  AlignedBuffer buffer(3 * AlignedBuffer::kHugePageBytes + 4096, 4096);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) %
                AlignedBuffer::kHugePageBytes,
            0u);
  EXPECT_TRUE(AllZero(buffer));
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  if (!thp) GTEST_SKIP() << "this kernel has no transparent huge pages";
  // "hg": the mapping carries MADV_HUGEPAGE, whether or not the kernel
  // found huge pages to back it.
  const std::string flags = FlagsOfMappingHolding(buffer.data());
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
}

// Pages::kSmall: the alignment asked for, no huge-page advice (nothing for
// the kernel to compact memory for when the pages are first touched).
TEST(AlignedBufferTest, SmallPagesAreNotAdvisedHuge) {
  AlignedBuffer buffer(3 * AlignedBuffer::kHugePageBytes + 4096, 4096,
                       AlignedBuffer::Pages::kSmall);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % 4096, 0u);
  EXPECT_TRUE(AllZero(buffer));
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  if (!thp) GTEST_SKIP() << "this kernel has no transparent huge pages";
  const std::string flags = FlagsOfMappingHolding(buffer.data());
  ASSERT_FALSE(flags.empty());
  EXPECT_EQ(flags.find(" hg"), std::string::npos) << flags;
}

TEST(AlignedBufferTest, MovesOwnership) {
  AlignedBuffer a(AlignedBuffer::kHugePageBytes, 512);
  uint8_t* data = a.data();
  AlignedBuffer b(std::move(a));
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(a.data(), nullptr);
  AlignedBuffer c;
  c = std::move(b);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.size(), AlignedBuffer::kHugePageBytes);
}

}  // namespace
}  // namespace lohan
