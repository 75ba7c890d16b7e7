// lohand refuses to start, with a message naming the key or path, on every bad
// config: checked by running the real binary.
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <iterator>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;

class ConfigRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override { mkdir((dir_.path() + "/ssd0").c_str(), 0755); }

  // Runs lohand with the standard test flags, then `args` (later flags win).
  RunResult Lohand(const std::vector<std::string>& args) {
    return RunCommand(DaemonProcess::Command(dir_.path(), args));
  }

  std::string WriteConfig(const std::string& text) {
    const std::string path = dir_.path() + "/lohand.toml";
    std::ofstream(path) << text;
    return path;
  }

  void ExpectRefused(const RunResult& result, const std::string& expected) {
    EXPECT_EQ(result.exit_code, 1) << result.err;
    EXPECT_THAT(result.err, HasSubstr(expected));
    // Refused before binding: no socket left behind.
    struct stat info {};
    EXPECT_NE(stat((dir_.path() + "/lohand.sock").c_str(), &info), 0);
  }

  PublicTempDir dir_;
};

TEST_F(ConfigRefusalTest, UnknownKeyInFile) {
  const std::string config =
      WriteConfig("[daemon]\nlog_level = \"info\"\nsoket = \"/x\"\n");
  ExpectRefused(Lohand({"--config", config}),
                config + ":3: unknown key 'daemon.soket'");
}

TEST_F(ConfigRefusalTest, BadValueInFile) {
  const std::string config = WriteConfig("[optimizer]\nthreads = \"many\"\n");
  ExpectRefused(Lohand({"--config", config}), "'optimizer.threads' must be");
}

TEST_F(ConfigRefusalTest, BadLogLevelInFile) {
  const std::string config = WriteConfig("[daemon]\nlog_level = \"chatty\"\n");
  ExpectRefused(Lohand({"--config", config}), "'daemon.log_level' is 'chatty'");
}

TEST_F(ConfigRefusalTest, QuotaForAUserThatDoesNotExist) {
  const std::string config =
      WriteConfig("[quotas.user.no-such-user-here]\nssd = \"1TiB\"\n");
  ExpectRefused(Lohand({"--config", config}),
                "section [quotas.user.no-such-user-here]: no user named "
                "'no-such-user-here' on this machine");
  // --check-config says the same.
  RunResult checked = Lohand({"--config", config, "--check-config"});
  EXPECT_EQ(checked.exit_code, 1);
  EXPECT_THAT(checked.err, HasSubstr("no user named 'no-such-user-here'"));
}

// [jobs] keep_ended that cannot work: negative, not a duration, beyond ten
// years; each refused at start naming the key, --check-config likewise.
TEST_F(ConfigRefusalTest, KeepEndedThatCannotWork) {
  for (const char* value : {"\"-1s\"", "\"-2d\"", "\"soon\"", "\"7 days\"", "7",
                            "\"100000d\"", "\"inf\"", "\"0.5s\""}) {
    SCOPED_TRACE(value);
    const std::string config =
        WriteConfig(std::string("[jobs]\nkeep_ended = ") + value + "\n");
    ExpectRefused(Lohand({"--config", config}),
                  config +
                      ":2: key 'jobs.keep_ended' must be \"0s\" (ended jobs "
                      "are deleted by hand only) or a duration from \"1s\" "
                      "to \"3650d\"");
    RunResult checked = Lohand({"--config", config, "--check-config"});
    EXPECT_EQ(checked.exit_code, 1);
    EXPECT_THAT(checked.err, HasSubstr("'jobs.keep_ended'"));
  }
}

TEST_F(ConfigRefusalTest, QuotaWeightOutOfRange) {
  const std::string config = WriteConfig("[quotas]\nweight = 5000\n");
  ExpectRefused(Lohand({"--config", config}),
                config +
                    ":2: key 'quotas.weight' must be an integer from 1 "
                    "to 1000");
}

TEST_F(ConfigRefusalTest, ReclaimIntervalOutOfRange) {
  const std::string config =
      WriteConfig("[quotas]\nreclaim_interval = \"48h\"\n");
  ExpectRefused(Lohand({"--config", config}),
                config +
                    ":2: key 'quotas.reclaim_interval' must be a duration "
                    "from \"0s\" (none) to \"24h\"");
}

TEST_F(ConfigRefusalTest, MissingConfigFile) {
  ExpectRefused(Lohand({"--config", dir_.path() + "/absent.toml"}),
                "cannot read config file '" + dir_.path() + "/absent.toml'");
}

TEST_F(ConfigRefusalTest, BadFlagValue) {
  ExpectRefused(Lohand({"--host-pool-size", "a lot"}),
                "flag --host-pool-size: 'a lot' is not a byte size");
  ExpectRefused(Lohand({"--profile-probe", "some"}),
                "flag --profile-probe: 'some' is not a byte size");
}

TEST_F(ConfigRefusalTest, MissingSsdPath) {
  ExpectRefused(Lohand({"--ssd-path", dir_.path() + "/no-such-ssd"}),
                "SSD path '" + dir_.path() + "/no-such-ssd'");
}

TEST_F(ConfigRefusalTest, UnwritableSsdPath) {
  ExpectRefused(
      Lohand({"--ssd-path", "/proc/self"}),
      "SSD path '/proc/self' (key 'store.ssd_paths') is not writable");
}

TEST_F(ConfigRefusalTest, UnwritableSsdPathForUnprivilegedDaemon) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to run lohand as nobody";
  const std::string ssd = dir_.path() + "/readonly-ssd";
  ASSERT_EQ(mkdir(ssd.c_str(), 0555), 0);
  // lohand itself must be reachable by nobody: copy it out of the runfiles.
  const std::string lohand = dir_.path() + "/lohand";
  ASSERT_EQ(
      RunCommand({"/bin/cp", Runfile("daemon/main/lohand"), lohand}).exit_code,
      0);
  RunResult result = RunCommand(
      {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
       lohand, "--socket", dir_.path() + "/n.sock", "--state-dir",
       dir_.path() + "/nstate", "--ssd-path", ssd, "--host-pool-size", "1MiB"});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_THAT(result.err, HasSubstr("SSD path '" + ssd +
                                    "' (key 'store.ssd_paths') is not "
                                    "writable"));
}

TEST_F(ConfigRefusalTest, PoolLargerThanTheMachineCanLock) {
  ExpectRefused(Lohand({"--host-pool-size", "1000TiB"}),
                "key 'pool.host_pool_size' asks for 1000.0 TiB");
}

TEST_F(ConfigRefusalTest, StateTierLargerThanTheMachineCanLock) {
  ExpectRefused(Lohand({"--state-tier", "1000TiB"}),
                "key 'pool.state_tier' asks for 1000.0 TiB");
  ExpectRefused(Lohand({"--state-tier", "most"}),
                "flag --state-tier: 'most' is not a byte size");
  const std::string config = WriteConfig("[pool]\nstate_tier = \"all\"\n");
  ExpectRefused(Lohand({"--config", config}),
                "key 'pool.state_tier': 'all' is not a byte size");
}

TEST_F(ConfigRefusalTest, SsdCapacityLargerThanTheDisk) {
  ExpectRefused(Lohand({"--ssd-capacity", "1000TiB"}),
                "key 'store.capacity_per_ssd' asks for 1000.0 TiB");
}

TEST_F(ConfigRefusalTest, StripeUnitNotAMultipleOfTheBlockSize) {
  const std::string config =
      WriteConfig("[store]\nblock_size = 4096\nstripe_unit = 6000\n");
  ExpectRefused(Lohand({"--config", config}),
                "'store.stripe_unit' must be a positive multiple");
}

TEST_F(ConfigRefusalTest, RelativeSocketPath) {
  ExpectRefused(Lohand({"--socket", "lohand.sock"}),
                "'daemon.socket' must be an absolute path");
}

TEST_F(ConfigRefusalTest, UnknownFlag) {
  RunResult result = Lohand({"--pool", "1GiB"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.err + result.out, HasSubstr("--pool"));
}

TEST_F(ConfigRefusalTest, CheckConfigAcceptsAGoodOne) {
  const std::string config =
      WriteConfig("[daemon]\nlog_level = \"warn\"\n[optimizer]\nthreads = 2\n");
  RunResult result = Lohand({"--config", config, "--check-config"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("configuration OK"));
}

// A damaged store catalog: lohand refuses to start, naming the file and the
// offset and pointing to --salvage, and changes nothing; --salvage rebuilds
// it and reports; then lohand starts.
TEST_F(ConfigRefusalTest, DamagedCatalogIsRefusedUntilSalvaged) {
  {
    absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
        DaemonProcess::Start(dir_.path());
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    EXPECT_EQ((*daemon)->Stop(SIGTERM), 0);
  }
  const std::string catalog = dir_.path() + "/state/store/catalog.log";
  std::string data;
  {
    std::ifstream in(catalog, std::ios::binary);
    data.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(data.size(), 12u);
  data[10] = static_cast<char>(data[10] ^ 0x04);  // the store record
  std::ofstream(catalog, std::ios::binary | std::ios::trunc) << data;
  ExpectRefused(Lohand({}), "is damaged at offset 0");
  EXPECT_THAT(Lohand({}).err, HasSubstr("lohand --salvage"));
  RunResult salvage = Lohand({"--salvage"});
  EXPECT_EQ(salvage.exit_code, 0) << salvage.err;
  EXPECT_THAT(salvage.out, HasSubstr("rebuilt from the configuration"));
  EXPECT_THAT(salvage.out, HasSubstr("catalog.log.damaged-"));
  absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
      DaemonProcess::Start(dir_.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  // Not while a daemon uses the store; and a healthy catalog is left alone.
  RunResult busy = Lohand({"--salvage"});
  EXPECT_EQ(busy.exit_code, 1);
  EXPECT_THAT(busy.err, HasSubstr("is in use by another open store"));
  EXPECT_EQ((*daemon)->Stop(SIGTERM), 0);
  RunResult healthy = Lohand({"--salvage"});
  EXPECT_EQ(healthy.exit_code, 1);
  EXPECT_THAT(healthy.err, HasSubstr("is not damaged"));
  EXPECT_TRUE(DaemonProcess::Start(dir_.path()).ok());
}

}  // namespace
}  // namespace lohan::testing
