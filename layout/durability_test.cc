#include "layout/durability.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(DurableSpacingSeconds, AStatedDurationIsExact) {
  EXPECT_EQ(DurableSpacingSeconds(60.0, 0.0, 0.0), 60.0);
  EXPECT_EQ(DurableSpacingSeconds(60.0, 0.0, 600.0), 60.0);
}

TEST(DurableSpacingSeconds, AutoKeepsTheDurableWritesShare) {
  // Writes that fit a tenth of a minute leave the minute.
  EXPECT_EQ(DurableSpacingSeconds(60.0, 0.1, 0.0), 60.0);
  EXPECT_EQ(DurableSpacingSeconds(60.0, 0.1, 6.0), 60.0);
  // Longer ones stretch it: 30 s of writes, every 300 s.
  EXPECT_DOUBLE_EQ(DurableSpacingSeconds(60.0, 0.1, 30.0), 300.0);
  EXPECT_DOUBLE_EQ(DurableSpacingSeconds(kAutoDurableEverySeconds,
                                         kAutoDurableWriteShare, 12.0),
                   120.0);
}

}  // namespace
}  // namespace lohan
