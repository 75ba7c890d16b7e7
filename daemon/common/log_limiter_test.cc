#include "daemon/common/log_limiter.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(LogLimiter, LetsABurstThroughPerWindowAndCountsTheRest) {
  LogLimiter limiter(2, absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(limiter.Admit("refused", t0), 0u);
  EXPECT_EQ(limiter.Admit("refused", t0), 0u);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(limiter.Admit("refused", t0 + absl::Seconds(1)), std::nullopt);
  }
  // Another kind of line has its own window.
  EXPECT_EQ(limiter.Admit("other", t0 + absl::Seconds(1)), 0u);
  // The next window's first line says how many were held back.
  EXPECT_EQ(limiter.Admit("refused", t0 + absl::Seconds(10)), 1000u);
  EXPECT_EQ(limiter.Admit("refused", t0 + absl::Seconds(10)), 0u);
  EXPECT_EQ(limiter.Admit("refused", t0 + absl::Seconds(11)), std::nullopt);
}

}  // namespace
}  // namespace lohan
