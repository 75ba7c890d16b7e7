#include "daemon/common/log_text.h"

#include <string>

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(LogSafeTest, EscapesWhatCouldForgeALineOrDriveATerminal) {
  EXPECT_EQ(LogSafe("job-1.a_b"), "job-1.a_b");
  EXPECT_EQ(LogSafe("x\x1b[31mred\r\nFORGED 2026 info"),
            "x\\x1b[31mred\\r\\nFORGED 2026 info");
  EXPECT_EQ(LogSafe(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(LogSafe("quote'\"\\"), "quote'\"\\\\");
  EXPECT_EQ(LogSafe("\x7f\xff"), "\\x7f\\xff");
  for (int c = 0; c < 256; ++c) {
    const std::string shown = LogSafe(std::string(1, static_cast<char>(c)));
    for (char s : shown) {
      EXPECT_TRUE(s >= 0x20 && s < 0x7f) << "byte " << c;
    }
  }
}

TEST(LogSafeTest, KeepsAtMostTheBytesAsked) {
  EXPECT_EQ(LogSafe(std::string(300, 'a'), 4), "aaaa...");
  EXPECT_EQ(LogSafe(std::string(256, 'a')).size(), 256u);
  EXPECT_EQ(LogSafe(std::string(257, 'a')).size(), 259u);
}

}  // namespace
}  // namespace lohan
