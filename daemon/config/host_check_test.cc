#include "daemon/config/host_check.h"

#include <stdlib.h>
#include <unistd.h>

#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

TEST(CheckPoolFits, RefusesMoreThanAvailable) {
  HostMemory memory{.available_bytes = 8ull << 30,
                    .memlock_limit_bytes = std::numeric_limits<uint64_t>::max(),
                    .has_cap_ipc_lock = true};
  EXPECT_TRUE(CheckPoolFits(4ull << 30, memory).ok());
  absl::Status status = CheckPoolFits(16ull << 30, memory);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("pool.host_pool_size"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("16.0 GiB"));
}

TEST(CheckPoolFits, MemlockLimitAppliesOnlyWithoutCapability) {
  HostMemory memory{.available_bytes = 8ull << 30,
                    .memlock_limit_bytes = 64ull << 20,
                    .has_cap_ipc_lock = false};
  absl::Status status = CheckPoolFits(1ull << 30, memory);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("RLIMIT_MEMLOCK"));
  memory.has_cap_ipc_lock = true;
  EXPECT_TRUE(CheckPoolFits(1ull << 30, memory).ok());
}

TEST(ResolveStateTier, AutoIsHalfOfWhatThePoolReadAheadAndFloorLeave) {
  // "auto", a 4 GiB pool, read-ahead "auto" (an eighth of 32 GiB).
  DaemonConfig config = DefaultConfig();
  HostMemory memory{.available_bytes = 24ull << 30,
                    .total_bytes = 32ull << 30,
                    .memlock_limit_bytes = std::numeric_limits<uint64_t>::max(),
                    .has_cap_ipc_lock = true};
  EXPECT_EQ(StateTierFloorBytes(memory), 2ull << 30);  // a sixteenth
  EXPECT_EQ(ResolveReadAhead(config, memory), 4ull << 30);
  // (24 - 4 - 4 - 2) / 2 GiB.
  EXPECT_EQ(*ResolveStateTier(config, memory), 7ull << 30);
  config.optimizer_read_ahead_bytes = 1ull << 30;  // (24 - 4 - 1 - 2) / 2
  EXPECT_EQ(*ResolveStateTier(config, memory), (17ull << 30) / 2);
  memory.available_bytes = 6ull << 30;  // nothing left: no tier
  EXPECT_EQ(*ResolveStateTier(config, memory), 0u);
  // Without CAP_IPC_LOCK, what RLIMIT_MEMLOCK leaves beside the pool.
  memory.available_bytes = 24ull << 30;
  memory.has_cap_ipc_lock = false;
  memory.memlock_limit_bytes = 5ull << 30;
  EXPECT_EQ(*ResolveStateTier(config, memory), 1ull << 30);
}

TEST(ResolveReadAhead, AutoIsAnEighthOfTheMemoryASizeIsKept) {
  DaemonConfig config = DefaultConfig();
  HostMemory memory{.available_bytes = 2ull << 30,
                    .total_bytes = (24ull << 30) + 12345};
  EXPECT_EQ(ResolveReadAhead(config, memory), 3ull << 30);  // whole MiB
  config.optimizer_read_ahead_bytes = 0;
  EXPECT_EQ(ResolveReadAhead(config, memory), 0u);
  config.optimizer_read_ahead_bytes = 5ull << 30;
  EXPECT_EQ(ResolveReadAhead(config, memory), 5ull << 30);
}

TEST(ResolveStateTier, ASizeThatCannotBeLockedIsRefusedNamingTheKey) {
  DaemonConfig config = DefaultConfig();
  HostMemory memory{.available_bytes = 24ull << 30,
                    .total_bytes = 32ull << 30,
                    .memlock_limit_bytes = std::numeric_limits<uint64_t>::max(),
                    .has_cap_ipc_lock = true};
  config.state_tier_bytes = 16ull << 30;
  EXPECT_EQ(*ResolveStateTier(config, memory), 16ull << 30);
  config.state_tier_bytes = 0;
  EXPECT_EQ(*ResolveStateTier(config, memory), 0u);
  config.state_tier_bytes = 21ull << 30;  // beside the 4 GiB pool: 25
  absl::StatusOr<uint64_t> tier = ResolveStateTier(config, memory);
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tier.status().message()),
              HasSubstr("key 'pool.state_tier' asks for 21.0 GiB"));
  EXPECT_THAT(std::string(tier.status().message()), HasSubstr("\"auto\""));
  config.state_tier_bytes = 2ull << 30;
  memory.has_cap_ipc_lock = false;
  memory.memlock_limit_bytes = 5ull << 30;
  tier = ResolveStateTier(config, memory);
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tier.status().message()),
              HasSubstr("RLIMIT_MEMLOCK"));
}

TEST(ReadHostMemory, SeesThisMachine) {
  HostMemory memory = ReadHostMemory();
  EXPECT_GT(memory.available_bytes, 0u);
  EXPECT_GT(memory.memlock_limit_bytes, 0u);
}

class SsdPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "/ssdXXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  std::string dir_;
};

TEST_F(SsdPathTest, AcceptsWritableDirectory) {
  EXPECT_TRUE(CheckSsdPath(dir_, 1 << 20).ok());
}

TEST_F(SsdPathTest, RefusesCapacityBeyondFreeSpace) {
  absl::Status status = CheckSsdPath(dir_, 1ull << 60);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("key 'store.capacity_per_ssd' asks for 1024.0 PiB"));
  EXPECT_THAT(std::string(status.message()), HasSubstr(dir_));
}

TEST_F(SsdPathTest, RefusesMissingPath) {
  absl::Status status = CheckSsdPath(dir_ + "/absent", 1 << 20);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr(dir_ + "/absent"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("store.ssd_paths"));
}

TEST_F(SsdPathTest, RefusesRegularFile) {
  const std::string file = dir_ + "/plain";
  FILE* f = fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  EXPECT_THAT(std::string(CheckSsdPath(file, 1 << 20).message()),
              HasSubstr("neither a directory nor a block device"));
}

TEST(CheckSsdPath, RefusesUnwritableDirectoryEvenForRoot) {
  // procfs refuses new files to everyone, root included.
  absl::Status status = CheckSsdPath("/proc/self", 1 << 20);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("not writable"));
}

}  // namespace
}  // namespace lohan
