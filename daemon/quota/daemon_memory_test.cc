#include "daemon/quota/daemon_memory.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing::HasSubstr;

TEST(DaemonMemoryTest, RefusesWhatWouldPassTheQuotaNamingIt) {
  EXPECT_TRUE(FitsDaemonMemory(7, 100, 900, 1000, "x").ok());
  absl::Status s = FitsDaemonMemory(7, 101, 900, 1000, "job j-1's model");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("job j-1's model needs 101 B of lohand's memory; uid "
                        "7's jobs and plans hold 900 B"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("[quotas] daemon_memory"));
  // Already over (a quota lowered since): nothing more, not even 0 bytes'
  // worth of a wrap-around.
  EXPECT_FALSE(FitsDaemonMemory(7, 0, 1001, 1000, "x").ok());
  EXPECT_FALSE(FitsDaemonMemory(7, UINT64_MAX, 1, 1000, "x").ok());
}

TEST(DaemonMemoryTest, TheDefaultIsASixteenthOfTheMachineAtLeast256MiB) {
  EXPECT_EQ(DefaultDaemonMemoryLimit(uint64_t{256} << 30), uint64_t{16} << 30);
  EXPECT_EQ(DefaultDaemonMemoryLimit(uint64_t{1} << 30), uint64_t{256} << 20);
  EXPECT_GT(PlanBytesEstimate(65536, 4), uint64_t{65536} * 4 * 10);
}

}  // namespace
}  // namespace lohan
