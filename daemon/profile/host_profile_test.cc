#include "daemon/profile/host_profile.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "daemon/store/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class HostProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto updater = AdamUpdater::Create(nullptr, std::nullopt);
    ASSERT_TRUE(updater.ok()) << updater.status();
    updater_.emplace(*updater);
    options_.ssd_paths = {dir_.Subdir("ssd0"), dir_.Subdir("ssd1")};
    options_.probe_bytes = uint64_t{8} << 20;
    options_.queue_depth = 8;
    options_.updater = &*updater_;
    options_.optimizer_threads = 3;
  }

  testing_util::TempDir dir_;
  std::optional<AdamUpdater> updater_;
  ProfileOptions options_;
};

TEST_F(HostProfileTest, MeasuresEachSsdTheArrayMemoryAndTheOptimizer) {
  // A store's data file beside the probe is left exactly as it was.
  const std::string data = options_.ssd_paths[0] + "/lohan.data";
  std::ofstream(data) << "the store's bytes";
  absl::StatusOr<v1::HostProfile> profile = MeasureHost(options_);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->ssds_size(), 2);
  for (const v1::SsdProfile& ssd : profile->ssds()) {
    EXPECT_GT(ssd.read_bytes_per_second(), 0) << ssd.path();
    EXPECT_GT(ssd.write_bytes_per_second(), 0) << ssd.path();
    EXPECT_FALSE(Exists(ssd.path() + "/lohan.probe"));
  }
  EXPECT_GT(profile->array_read_bytes_per_second(), 0);
  EXPECT_GT(profile->array_write_bytes_per_second(), 0);
  EXPECT_GT(profile->memcpy_bytes_per_second(), 0);
  EXPECT_GT(profile->optimizer_parameters_per_second_per_thread(), 0);
  EXPECT_EQ(profile->optimizer_threads(), 3u);
  EXPECT_GT(profile->free_host_bytes(), 0u);
  EXPECT_EQ(profile->key(), ProfileKey(options_));
  EXPECT_EQ(Contents(data), "the store's bytes");
}

TEST_F(HostProfileTest, IsCachedUntilWhatItWasMeasuredForChanges) {
  const std::string state = dir_.Subdir("state");
  bool measured = false;
  absl::StatusOr<v1::HostProfile> first =
      LoadOrMeasureHost(state, options_, false, &measured);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(measured);
  absl::StatusOr<v1::HostProfile> again =
      LoadOrMeasureHost(state, options_, false, &measured);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(measured);
  EXPECT_EQ(again->SerializeAsString(), first->SerializeAsString());
  // Asked to, or with another SSD set: measured again.
  ASSERT_TRUE(LoadOrMeasureHost(state, options_, true, &measured).ok());
  EXPECT_TRUE(measured);
  options_.ssd_paths.pop_back();
  absl::StatusOr<v1::HostProfile> fewer =
      LoadOrMeasureHost(state, options_, false, &measured);
  ASSERT_TRUE(fewer.ok());
  EXPECT_TRUE(measured);
  EXPECT_EQ(fewer->ssds_size(), 1);
  // A probe left by a daemon killed while measuring goes, even when the
  // profile is taken from the cache.
  const std::string stale = options_.ssd_paths[0] + "/lohan.probe";
  std::ofstream(stale) << "half a probe";
  ASSERT_TRUE(LoadOrMeasureHost(state, options_, false, &measured).ok());
  EXPECT_FALSE(measured);
  EXPECT_FALSE(Exists(stale));
  // A damaged cache is measured over, not trusted.
  std::ofstream(state + "/host_profile.pb") << "garbage";
  ASSERT_TRUE(LoadOrMeasureHost(state, options_, false, &measured).ok());
  EXPECT_TRUE(measured);
}

TEST_F(HostProfileTest, APathThatIsNotADirectoryIsNotMeasured) {
  const std::string file = dir_.path() + "/plain";
  std::ofstream(file) << "x";
  options_.ssd_paths = {file};
  absl::StatusOr<v1::HostProfile> profile = MeasureHost(options_);
  EXPECT_TRUE(absl::IsFailedPrecondition(profile.status()));
  EXPECT_THAT(profile.status().message(), HasSubstr(file));
  // Without SSDs to measure, the rest still is.
  options_.probe_bytes = 0;
  profile = MeasureHost(options_);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->ssds_size(), 0);
  EXPECT_GT(profile->memcpy_bytes_per_second(), 0);
}

}  // namespace
}  // namespace lohan
