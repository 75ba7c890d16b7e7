#include "daemon/config/config.h"

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<DaemonConfig> Parse(absl::string_view text) {
  return ParseConfigToml(text, "test.toml", DefaultConfig());
}

TEST(DefaultConfig, IsTheDeployedFile) {
  // deploy/lohand.toml is both the documented defaults and the built-in ones.
  std::ifstream file("deploy/lohand.toml");
  ASSERT_TRUE(file) << "deploy/lohand.toml missing from runfiles";
  std::stringstream text;
  text << file.rdbuf();
  absl::StatusOr<DaemonConfig> from_file =
      ParseConfigToml(text.str(), "deploy/lohand.toml", DaemonConfig{});
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  DaemonConfig defaults = DefaultConfig();
  EXPECT_EQ(from_file->socket_path, defaults.socket_path);
  EXPECT_EQ(defaults.socket_path, "/run/lohan/lohand.sock");
  EXPECT_EQ(defaults.state_dir, "/var/lib/lohan");
  EXPECT_EQ(defaults.log_level, "info");
  EXPECT_EQ(defaults.ssd_paths,
            std::vector<std::string>{"/var/lib/lohan/ssd0"});
  EXPECT_EQ(defaults.host_pool_bytes, 4ull << 30);
  EXPECT_EQ(defaults.ring_entries, 1024u);
  EXPECT_EQ(defaults.optimizer_threads, 0u);
  EXPECT_EQ(defaults.optimizer_isa, "auto");
  EXPECT_EQ(defaults.optimizer_tuning, "auto");
  EXPECT_EQ(defaults.optimizer_read_ahead_bytes, std::nullopt);  // "auto"
  EXPECT_EQ(defaults.state_tier_bytes, std::nullopt);            // "auto"
  EXPECT_EQ(defaults.ssd_capacity_bytes, 64ull << 30);
  EXPECT_EQ(defaults.stripe_unit_bytes, 1u << 20);
  EXPECT_EQ(defaults.block_size, 4096u);
  EXPECT_EQ(defaults.queue_depth, 32u);
  EXPECT_EQ(defaults.gate_unit_bytes, 0u);
  EXPECT_EQ(GateUnitBytes(defaults), uint64_t{8} << 20);
  EXPECT_FALSE(defaults.allow_buffered_io);
  EXPECT_EQ(defaults.profile_probe_bytes, uint64_t{256} << 20);
  EXPECT_EQ(defaults.control_idle_timeout_seconds, 600u);
  EXPECT_EQ(defaults.quota_defaults, (UserLimits{.jobs = 64,
                                                 .data_planes = 16,
                                                 .control_connections = 64,
                                                 .host_pool_bytes = 0,
                                                 .ssd_bytes = 0,
                                                 .weight = 1}));
  EXPECT_TRUE(defaults.quota_users.empty());
  EXPECT_TRUE(ValidateConfig(defaults).ok());
}

TEST(ParseConfigToml, QuotasForEveryoneAndForOneUser) {
  absl::StatusOr<DaemonConfig> config = ParseConfigToml(
      "[quotas.user.alice]\nssd = \"4TiB\"\njobs = 200\n"
      "[quotas]\nssd = \"1TiB\"\nhost_pool = 1073741824\n"
      "[quotas.user.bob]\ndata_planes = 0\nweight = 3\n"
      "state_tier = \"2GiB\"\n",
      "test.toml", DefaultConfig());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->quota_defaults.ssd_bytes, 1ull << 40);
  EXPECT_EQ(config->quota_defaults.host_pool_bytes, 1ull << 30);
  EXPECT_EQ(config->quota_defaults.jobs, 64u);  // kept from the default
  ASSERT_EQ(config->quota_users.size(), 2u);
  const UserLimits alice =
      config->quota_users.at("alice").Over(config->quota_defaults);
  EXPECT_EQ(alice.ssd_bytes, 4ull << 40);
  EXPECT_EQ(alice.jobs, 200u);
  EXPECT_EQ(alice.host_pool_bytes, 1ull << 30);  // the section order is free
  const UserLimits bob =
      config->quota_users.at("bob").Over(config->quota_defaults);
  EXPECT_EQ(bob.data_planes, 0u);
  EXPECT_EQ(bob.weight, 3u);
  EXPECT_EQ(alice.weight, 1u);
  EXPECT_EQ(bob.ssd_bytes, 1ull << 40);
  EXPECT_EQ(bob.state_tier_bytes, 2ull << 30);
  EXPECT_EQ(alice.state_tier_bytes, 0u);
}

TEST(ParseConfigToml, OverridesOnlyGivenKeys) {
  absl::StatusOr<DaemonConfig> config = Parse(R"(
[daemon]
socket = "/tmp/x.sock"
[store]
ssd_paths = ["/a", "/b", "/c"]
[pool]
host_pool_size = 1048576
[optimizer]
threads = 3
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->socket_path, "/tmp/x.sock");
  EXPECT_EQ(config->state_dir, "/var/lib/lohan");
  EXPECT_EQ(config->ssd_paths.size(), 3u);
  EXPECT_EQ(config->host_pool_bytes, 1048576u);
  EXPECT_EQ(config->optimizer_threads, 3u);
}

TEST(ParseConfigToml, StoreAndOptimizerKeys) {
  absl::StatusOr<DaemonConfig> config = Parse(R"(
[store]
capacity_per_ssd = "2 TiB"
stripe_unit = 262144
block_size = 512
queue_depth = 128
gate_unit = "16MiB"
allow_buffered_io = true
[optimizer]
isa = "avx2"
read_ahead = 0
tuning = "prefetch=256,stream=off,chunks=8"
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ssd_capacity_bytes, 2ull << 40);
  EXPECT_EQ(config->stripe_unit_bytes, 262144u);
  EXPECT_EQ(config->block_size, 512u);
  EXPECT_EQ(config->queue_depth, 128u);
  EXPECT_EQ(GateUnitBytes(*config), uint64_t{16} << 20);
  EXPECT_TRUE(config->allow_buffered_io);
  EXPECT_EQ(config->optimizer_isa, "avx2");
  EXPECT_EQ(config->optimizer_read_ahead_bytes, 0u);
  absl::StatusOr<DaemonConfig> sized =
      ParseConfigToml("[optimizer]\nread_ahead = \"3GiB\"\n", "t", *config);
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_EQ(sized->optimizer_read_ahead_bytes, 3ull << 30);
  absl::StatusOr<DaemonConfig> automatic =
      ParseConfigToml("[optimizer]\nread_ahead = \"auto\"\n", "t", *sized);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->optimizer_read_ahead_bytes, std::nullopt);
  absl::StatusOr<DaemonConfig> plenty =
      ParseConfigToml("[optimizer]\nread_ahead = \"plenty\"\n", "t", *sized);
  EXPECT_THAT(std::string(plenty.status().message()),
              HasSubstr("use a size, 0 (no read-ahead) or \"auto\""));
  EXPECT_EQ(config->optimizer_tuning, "prefetch=256,stream=off,chunks=8");
  EXPECT_TRUE(ValidateConfig(*config).ok());
}

// The gate's default unit keeps every SSD busy through a part: four stripe
// rows, never under 8 MiB.
TEST(GateUnitBytes, DefaultGrowsWithTheStripeRow) {
  DaemonConfig config = DefaultConfig();
  config.ssd_paths = {"/a", "/b", "/c", "/d"};
  config.stripe_unit_bytes = 4 << 20;
  EXPECT_EQ(GateUnitBytes(config), uint64_t{64} << 20);
  config.stripe_unit_bytes = 256 << 10;
  EXPECT_EQ(GateUnitBytes(config), uint64_t{8} << 20);
}

TEST(ParseConfigToml, SizeWithUnits) {
  absl::StatusOr<DaemonConfig> config =
      Parse("[pool]\nhost_pool_size = \"512 MiB\"\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->host_pool_bytes, 512ull << 20);
}

TEST(ParseConfigToml, StateTierIsASizeZeroOrAuto) {
  absl::StatusOr<DaemonConfig> config =
      Parse("[pool]\nstate_tier = \"16GiB\"\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->state_tier_bytes, 16ull << 30);
  config = Parse("[pool]\nstate_tier = 0\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->state_tier_bytes, 0u);
  config = Parse("[pool]\nstate_tier = \"auto\"\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->state_tier_bytes, std::nullopt);
}

struct BadCase {
  const char* text;
  const char* expected_in_message;
};

class ParseConfigRefuses : public ::testing::TestWithParam<BadCase> {};

TEST_P(ParseConfigRefuses, NamingTheKey) {
  absl::StatusOr<DaemonConfig> config = Parse(GetParam().text);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()),
              HasSubstr(GetParam().expected_in_message));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("test.toml:"));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ParseConfigRefuses,
    ::testing::Values(
        BadCase{"[daemon]\nsockett = \"/x\"\n", "unknown key 'daemon.sockett'"},
        BadCase{"[deamon]\nsocket = \"/x\"\n", "unknown key 'deamon.socket'"},
        BadCase{"top_level = 1\n", "unknown key 'top_level'"},
        BadCase{"[daemon]\nsocket = 5\n", "'daemon.socket' must be a string"},
        BadCase{"[store]\nssd_paths = \"/one\"\n",
                "'store.ssd_paths' must be an array of strings"},
        BadCase{"[store]\nssd_paths = [\"/a\", 3]\n",
                "'store.ssd_paths' must be an array of strings"},
        BadCase{"[pool]\nhost_pool_size = \"lots\"\n",
                "'pool.host_pool_size': 'lots' is not a byte size"},
        BadCase{"[pool]\nhost_pool_size = -4\n", "pool.host_pool_size"},
        BadCase{"[pool]\nhost_pool_size = 1.5\n", "pool.host_pool_size"},
        BadCase{"[pool]\nring_entries = 12\n",
                "'pool.ring_entries' must be a power of two from 8 to 1024"},
        BadCase{"[pool]\nring_entries = 4\n", "'pool.ring_entries'"},
        BadCase{"[optimizer]\nthreads = -1\n", "'optimizer.threads' must be"},
        BadCase{"[pool]\nstate_tier = \"most\"\n",
                "use a size, 0 (no tier) or \"auto\""},
        BadCase{"[pool]\nstate_tier = -1\n", "pool.state_tier"},
        BadCase{"[pool]\ncommit_interval = 0\n",
                "'pool.commit_interval' must be an integer from 1 to 1000000"},
        BadCase{"[quotas]\nstate_tier = \"lots\"\n", "quotas.state_tier"},
        BadCase{"[pool]\nstate_tierr = 0\n", "unknown key 'pool.state_tierr'"},
        BadCase{"[optimizer]\nread_ahead = \"plenty\"\n",
                "'optimizer.read_ahead': 'plenty' is not a byte size"},
        BadCase{"[optimizer]\nthreads = \"4\"\n", "'optimizer.threads'"},
        BadCase{"[store]\nqueue_depth = 0\n",
                "'store.queue_depth' must be an integer from 1 to 1024"},
        BadCase{"[store]\nblock_size = 100\n",
                "'store.block_size' must be an integer from 512"},
        BadCase{"[store]\nprofile_probe = \"some\"\n",
                "'store.profile_probe': 'some' is not a byte size"},
        BadCase{"[store]\nallow_buffered_io = \"yes\"\n",
                "'store.allow_buffered_io' must be true or false"},
        BadCase{"[store]\ncapacity_per_ssd = \"big\"\n",
                "'store.capacity_per_ssd': 'big' is not a byte size"},
        BadCase{"[store]\ngate_unit = \"parts\"\n",
                "'store.gate_unit': 'parts' is not a byte size"},
        BadCase{"[store]\ngate_unit = -8\n", "'store.gate_unit'"},
        BadCase{"[quotas]\nsdd = 1\n", "unknown key 'quotas.sdd'"},
        BadCase{"[quotas]\nweight = 0\n",
                "'quotas.weight' must be an integer from 1 to 1000"},
        BadCase{"[quotas]\njobs = -1\n", "'quotas.jobs' must be a count"},
        BadCase{"[quotas]\nssd = \"much\"\n", "'quotas.ssd': 'much'"},
        BadCase{"[quotas]\nuser = 3\n", "'quotas.user' must be tables"},
        BadCase{"[quotas.user.alice]\njob = 3\n",
                "unknown key 'quotas.user.alice.job'"},
        BadCase{"[quotas.user]\nalice = 3\n",
                "'quotas.user.alice' must be a table"},
        BadCase{"[quotas]\nreclaim_interval = \"-1s\"\n",
                "'quotas.reclaim_interval' must be a duration from \"0s\" "
                "(none) to \"24h\""},
        BadCase{"[quotas]\nreclaim_interval = 10\n",
                "'quotas.reclaim_interval' must be a duration"},
        BadCase{"[quotas]\nreclaim_grace = \"25h\"\n",
                "'quotas.reclaim_grace' must be a duration from \"0s\""},
        BadCase{"[quotas]\nregrow_after = \"-2s\"\n",
                "'quotas.regrow_after' must be a duration from \"0s\""},
        BadCase{"[quotas]\nreclaim_grace = \"soon\"\n",
                "test.toml:2: key 'quotas.reclaim_grace'"},
        BadCase{"[quotas.user.alice]\nreclaim_grace = \"1m\"\n",
                "unknown key 'quotas.user.alice.reclaim_grace'"},
        BadCase{"[daemon]\ncontrol_idle_timeout = 0\n",
                "'daemon.control_idle_timeout' must be an integer from 1"},
        BadCase{"[jobs]\nkeep_ended = \"-1s\"\n",
                "key 'jobs.keep_ended' must be \"0s\" (ended jobs are "
                "deleted by hand only) or a duration from \"1s\" to "
                "\"3650d\""},
        BadCase{"[jobs]\nkeep_ended = \"-3d\"\n", "'jobs.keep_ended'"},
        BadCase{"[jobs]\nkeep_ended = \"a week\"\n", "'jobs.keep_ended'"},
        BadCase{"[jobs]\nkeep_ended = \"d\"\n", "'jobs.keep_ended'"},
        BadCase{"[jobs]\nkeep_ended = 7\n", "'jobs.keep_ended'"},
        BadCase{"[jobs]\nkeep_ended = \"500ms\"\n", "'jobs.keep_ended'"},
        BadCase{"[jobs]\nkeep_ended = \"3651d\"\n", "'jobs.keep_ended'"},
        BadCase{"[jobs]\nkeep_ended = \"99999999999999999d\"\n",
                "'jobs.keep_ended'"},
        BadCase{"[jobs]\nkeep_ended = \"inf\"\n", "'jobs.keep_ended'"},
        BadCase{"[jobs]\nkeep_ender = \"7d\"\n",
                "unknown key 'jobs.keep_ender'"},
        BadCase{"[metrics]\ninterval = \"500ms\"\n",
                "'metrics.interval' must be a duration from \"1s\" to "
                "\"1h\""},
        BadCase{"[metrics]\ninterval = \"2h\"\n", "'metrics.interval'"},
        BadCase{"[metrics]\ninterval = 15\n", "'metrics.interval'"},
        BadCase{"[metrics]\ntextfile = 1\n",
                "'metrics.textfile' must be a string"},
        BadCase{"[metrics]\ntext_file = \"/x.prom\"\n",
                "unknown key 'metrics.text_file'"},
        BadCase{"[daemon\nsocket = 1\n", "not valid TOML"}));

// [metrics]: off by default (deploy/lohand.toml), every 15 s.
TEST(ParseConfigToml, Metrics) {
  const DaemonConfig defaults = DefaultConfig();
  EXPECT_EQ(defaults.metrics_textfile, "");
  EXPECT_EQ(defaults.metrics_interval, absl::Seconds(15));
  absl::StatusOr<DaemonConfig> config = Parse(
      "[metrics]\ntextfile = "
      "\"/var/lib/node_exporter/textfile_collector/lohan.prom\"\n"
      "interval = \"1m\"\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->metrics_textfile,
            "/var/lib/node_exporter/textfile_collector/lohan.prom");
  EXPECT_EQ(config->metrics_interval, absl::Minutes(1));
  EXPECT_TRUE(ValidateConfig(*config).ok()) << ValidateConfig(*config);
}

// The reclaim limits: daemon-wide [quotas] keys, their defaults in the
// embedded deploy/lohand.toml.
TEST(ParseConfigToml, ReclaimLimits) {
  const DaemonConfig defaults = DefaultConfig();
  EXPECT_EQ(defaults.reclaim_interval, absl::Minutes(1));
  EXPECT_EQ(defaults.reclaim_grace, absl::Minutes(15));
  EXPECT_EQ(defaults.regrow_after, absl::Seconds(30));
  absl::StatusOr<DaemonConfig> config = Parse(
      "[quotas]\nreclaim_interval = \"1h\"\nreclaim_grace = \"0s\"\n"
      "regrow_after = \"2s\"\njobs = 3\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->reclaim_interval, absl::Hours(1));
  EXPECT_EQ(config->reclaim_grace, absl::ZeroDuration());
  EXPECT_EQ(config->regrow_after, absl::Seconds(2));
  EXPECT_EQ(config->quota_defaults.jobs, 3u);
}

// [jobs] keep_ended: 7 days by default (deploy/lohand.toml), whole days
// or any duration, "0s" for never.
TEST(ParseConfigToml, KeepEnded) {
  EXPECT_EQ(DefaultConfig().keep_ended, absl::Hours(24 * 7));
  for (const auto& [text, expected] :
       std::vector<std::pair<std::string, absl::Duration>>{
           {"0s", absl::ZeroDuration()},
           {"2s", absl::Seconds(2)},
           {"36h", absl::Hours(36)},
           {"1d", absl::Hours(24)},
           {"3650d", absl::Hours(24 * 3650)}}) {
    absl::StatusOr<DaemonConfig> config =
        Parse(absl::StrCat("[jobs]\nkeep_ended = \"", text, "\"\n"));
    ASSERT_TRUE(config.ok()) << text << ": " << config.status();
    EXPECT_EQ(config->keep_ended, expected) << text;
  }
}

TEST(ParseConfigToml, DurabilityByStepsOrByTime) {
  // The default: "auto", by time, stretched to keep the durable writes'
  // share.
  EXPECT_EQ(DefaultConfig().commit_interval, 0u);
  EXPECT_EQ(DefaultConfig().durable_every, absl::Seconds(60));
  EXPECT_EQ(DefaultConfig().durable_write_share, 0.1);
  // A stated duration is exact (no share)...
  absl::StatusOr<DaemonConfig> timed =
      Parse("[pool]\ndurable_every = \"10m\"\n");
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_EQ(timed->durable_every, absl::Minutes(10));
  EXPECT_EQ(timed->commit_interval, 0u);
  EXPECT_EQ(timed->durable_write_share, 0.0);
  // ...one that gives steps replaces an earlier file's time...
  absl::StatusOr<DaemonConfig> steps =
      ParseConfigToml("[pool]\ncommit_interval = 4\n", "later.toml", *timed);
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(steps->commit_interval, 4u);
  EXPECT_EQ(steps->durable_every, absl::ZeroDuration());
  EXPECT_EQ(steps->durable_write_share, 0.0);
  // ...and "auto" brings the default back over it.
  absl::StatusOr<DaemonConfig> automatic = ParseConfigToml(
      "[pool]\ndurable_every = \"auto\"\n", "last.toml", *steps);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->commit_interval, 0u);
  EXPECT_EQ(automatic->durable_every, absl::Seconds(60));
  EXPECT_EQ(automatic->durable_write_share, 0.1);
  // One file, both forms: refused, naming both keys.
  absl::StatusOr<DaemonConfig> both =
      Parse("[pool]\ncommit_interval = 4\ndurable_every = \"1h\"\n");
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(both.status().message(),
              HasSubstr("keys 'pool.commit_interval' and "
                        "'pool.durable_every' both set"));
  for (const char* bad :
       {"\"0s\"", "\"-5m\"", "\"169h\"", "\"soon\"", "\"Auto\"", "600"}) {
    absl::StatusOr<DaemonConfig> refused =
        Parse(absl::StrCat("[pool]\ndurable_every = ", bad, "\n"));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr("'pool.durable_every'"))
        << bad;
  }
}

TEST(ParseConfigToml, ErrorCarriesLineNumber) {
  absl::StatusOr<DaemonConfig> config =
      Parse("[daemon]\nlog_level = \"info\"\n\nbogus = 1\n");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("test.toml:4"));
}

TEST(LoadConfigFile, MissingFileIsNotFound) {
  absl::StatusOr<DaemonConfig> config =
      LoadConfigFile("/nonexistent/lohand.toml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(config.status().message()),
              HasSubstr("/nonexistent/lohand.toml"));
}

TEST(ApplyOverrides, FlagsWinOverFile) {
  DaemonConfig config = DefaultConfig();
  ConfigOverrides overrides;
  overrides.socket_path = "/tmp/s.sock";
  overrides.ssd_paths = std::vector<std::string>{"/x", "/y"};
  overrides.host_pool_size = "2GiB";
  overrides.optimizer_threads = 5;
  overrides.log_level = "debug";
  overrides.ssd_capacity = "1GiB";
  overrides.profile_probe = "0";
  overrides.optimizer_tuning = "default";
  overrides.ring_entries = 16;
  overrides.state_tier = "3GiB";
  ASSERT_TRUE(ApplyOverrides(overrides, config).ok());
  EXPECT_EQ(config.state_tier_bytes, 3ull << 30);
  overrides.state_tier = "auto";
  ASSERT_TRUE(ApplyOverrides(overrides, config).ok());
  EXPECT_EQ(config.state_tier_bytes, std::nullopt);
  EXPECT_EQ(config.ring_entries, 16u);
  EXPECT_EQ(config.optimizer_tuning, "default");
  EXPECT_EQ(config.profile_probe_bytes, 0u);
  EXPECT_EQ(config.socket_path, "/tmp/s.sock");
  EXPECT_EQ(config.ssd_paths, (std::vector<std::string>{"/x", "/y"}));
  EXPECT_EQ(config.host_pool_bytes, 2ull << 30);
  EXPECT_EQ(config.optimizer_threads, 5u);
  EXPECT_EQ(config.log_level, "debug");
  EXPECT_EQ(config.ssd_capacity_bytes, 1ull << 30);
  EXPECT_EQ(config.state_dir, "/var/lib/lohan");
}

TEST(ApplyOverrides, BadFlagValuesNameTheFlag) {
  DaemonConfig config = DefaultConfig();
  ConfigOverrides bad_size;
  bad_size.host_pool_size = "12 parsecs";
  EXPECT_THAT(std::string(ApplyOverrides(bad_size, config).message()),
              HasSubstr("--host-pool-size"));
  ConfigOverrides bad_capacity;
  bad_capacity.ssd_capacity = "-1";
  EXPECT_THAT(std::string(ApplyOverrides(bad_capacity, config).message()),
              HasSubstr("--ssd-capacity"));
  ConfigOverrides bad_probe;
  bad_probe.profile_probe = "lots";
  EXPECT_THAT(std::string(ApplyOverrides(bad_probe, config).message()),
              HasSubstr("--profile-probe"));
  ConfigOverrides bad_tier;
  bad_tier.state_tier = "everything";
  EXPECT_THAT(std::string(ApplyOverrides(bad_tier, config).message()),
              HasSubstr("--state-tier"));
  ConfigOverrides bad_ring;
  bad_ring.ring_entries = 24;
  EXPECT_THAT(std::string(ApplyOverrides(bad_ring, config).message()),
              HasSubstr("--ring-entries must be a power of two"));
  ConfigOverrides bad_threads;
  bad_threads.optimizer_threads = -2;
  EXPECT_THAT(std::string(ApplyOverrides(bad_threads, config).message()),
              HasSubstr("--optimizer-threads"));
  ConfigOverrides bad_tuning;
  bad_tuning.optimizer_tuning = "stream=sometimes";
  EXPECT_THAT(std::string(ApplyOverrides(bad_tuning, config).message()),
              HasSubstr("--optimizer-tuning: optimizer tuning: bad field "
                        "\"stream=sometimes\""));
  EXPECT_EQ(config.optimizer_tuning, "auto");
}

TEST(ValidateConfig, RefusesBadValues) {
  auto refused = [](auto mutate, const char* expected) {
    DaemonConfig config = DefaultConfig();
    mutate(config);
    absl::Status status = ValidateConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << expected;
    EXPECT_THAT(std::string(status.message()), HasSubstr(expected));
  };
  refused([](DaemonConfig& c) { c.socket_path = "relative.sock"; },
          "'daemon.socket' must be an absolute path");
  refused([](DaemonConfig& c) { c.socket_path = "/" + std::string(120, 'x'); },
          "a unix socket path holds at most 102");
  refused([](DaemonConfig& c) { c.state_dir = ""; },
          "'daemon.state_dir' must be an absolute path");
  refused([](DaemonConfig& c) { c.log_level = "loud"; },
          "'daemon.log_level' is 'loud'");
  refused([](DaemonConfig& c) { c.ssd_paths.clear(); },
          "'store.ssd_paths' is empty");
  refused(
      [](DaemonConfig& c) {
        c.ssd_paths = {"/a", "/a"};
      },
      "names '/a' more than once");
  refused([](DaemonConfig& c) { c.ssd_paths = {"ssd"}; },
          "'store.ssd_paths' must be an absolute path");
  refused([](DaemonConfig& c) { c.block_size = 3000; },
          "'store.block_size' must be a power of two");
  refused([](DaemonConfig& c) { c.stripe_unit_bytes = 6000; },
          "'store.stripe_unit' must be a positive multiple");
  refused([](DaemonConfig& c) { c.ssd_capacity_bytes = 0; },
          "'store.capacity_per_ssd' must be more than 0");
  refused([](DaemonConfig& c) { c.ssd_capacity_bytes = 4096; },
          "is smaller than one stripe unit");
  refused([](DaemonConfig& c) { c.optimizer_isa = "avx1024"; },
          "'optimizer.isa' is 'avx1024'");
  refused([](DaemonConfig& c) { c.state_tier_updates = "sometimes"; },
          "'pool.state_tier_updates' is 'sometimes'; use one of: in_place, "
          "copy");
  refused([](DaemonConfig& c) { c.optimizer_tuning = "fast"; },
          "'optimizer.tuning': optimizer tuning: bad field \"fast\"");
  refused([](DaemonConfig& c) { c.optimizer_tuning = "chunks=0"; },
          "use auto (timed at the first start) or default");
  refused([](DaemonConfig& c) { c.host_pool_bytes = 0; },
          "'pool.host_pool_size' must be more than 0");
  refused([](DaemonConfig& c) { c.metrics_textfile = "lohan.prom"; },
          "'metrics.textfile' must be an absolute path to a file named "
          "*.prom");
  refused([](DaemonConfig& c) { c.metrics_textfile = "/var/lib/lohan.txt"; },
          "node_exporter's textfile collector reads only those");
  refused([](DaemonConfig& c) { c.metrics_textfile = "/var/lib/.prom"; },
          "got '/var/lib/.prom'");
  refused([](DaemonConfig& c) { c.metrics_textfile = "/var/lib/x.prom/"; },
          "'metrics.textfile'");
  refused(
      [](DaemonConfig& c) {
        c.metrics_textfile = "/var/lib/lohan.prom";
        c.metrics_interval = absl::ZeroDuration();
      },
      "'metrics.interval' must be from 1s to 1h");
}

TEST(EffectiveOptimizerThreads, AutoIsHalfTheCoresAtLeastOne) {
  DaemonConfig config = DefaultConfig();
  EXPECT_EQ(EffectiveOptimizerThreads(config, 16), 8u);
  EXPECT_EQ(EffectiveOptimizerThreads(config, 1), 1u);
  config.optimizer_threads = 3;
  EXPECT_EQ(EffectiveOptimizerThreads(config, 16), 3u);
}

}  // namespace
}  // namespace lohan
