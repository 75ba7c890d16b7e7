#include "daemon/config/trusted_path.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing::HasSubstr;

class TrustedPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string templ =
        std::string(tmp != nullptr ? tmp : "/tmp") + "/trusted-XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    root_ = templ;
    ASSERT_EQ(chmod(root_.c_str(), 0755), 0);
    // The test's own directories above must pass for the cases to mean
    // anything.
    ASSERT_TRUE(CheckTrustedDirectory(root_, geteuid(), "k").ok())
        << CheckTrustedDirectory(root_, geteuid(), "k");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string Dir(const std::string& name, mode_t mode) {
    const std::string path = root_ + "/" + name;
    EXPECT_EQ(mkdir(path.c_str(), 0700), 0) << path;
    EXPECT_EQ(chmod(path.c_str(), mode), 0) << path;
    return path;
  }

  std::string root_;
};

TEST_F(TrustedPathTest, AnOwnedDirectoryWritableByNoOneElseIsTrusted) {
  EXPECT_TRUE(CheckTrustedDirectory(Dir("a", 0700), geteuid(), "k").ok());
  EXPECT_TRUE(CheckTrustedDirectory(Dir("b", 0755), geteuid(), "k").ok());
}

TEST_F(TrustedPathTest, ADirectoryOthersCanWriteIsRefusedNamingTheFix) {
  const std::string open = Dir("open", 0777);
  absl::Status s = CheckTrustedDirectory(open, geteuid(), "daemon.state_dir");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("key 'daemon.state_dir'"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(open + " is writable by others (mode 0777)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("chmod go-w " + open));
  s = CheckTrustedDirectory(Dir("group", 0775), geteuid(), "k");
  EXPECT_THAT(std::string(s.message()), HasSubstr("writable by its group"));
  // Sticky or not, the directory lohand keeps files in must be its own.
  s = CheckTrustedDirectory(Dir("sticky", 01777), geteuid(), "k");
  EXPECT_FALSE(s.ok());
}

TEST_F(TrustedPathTest,
       ADirectoryAboveThatOthersCanWriteIsRefusedUnlessSticky) {
  const std::string open = Dir("open", 0777);
  ASSERT_EQ(mkdir((open + "/state").c_str(), 0700), 0);
  absl::Status s = CheckTrustedDirectory(open + "/state", geteuid(), "k");
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(open + ", above " + open +
                        "/state, is writable by "
                        "others (mode 0777) and not sticky"));
  const std::string sticky = Dir("sticky", 01777);
  ASSERT_EQ(mkdir((sticky + "/state").c_str(), 0700), 0);
  EXPECT_TRUE(CheckTrustedDirectory(sticky + "/state", geteuid(), "k").ok());
}

TEST_F(TrustedPathTest, ASymlinkIsJudgedByWhereItLeads) {
  const std::string open = Dir("open", 0777);
  ASSERT_EQ(symlink(open.c_str(), (root_ + "/link").c_str()), 0);
  absl::Status s = CheckTrustedDirectory(root_ + "/link", geteuid(), "k");
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(root_ + "/link (" + open + ") is writable"));
}

TEST_F(TrustedPathTest, AnotherUsersDirectoryIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  const std::string theirs = Dir("theirs", 0700);
  ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
  absl::Status s = CheckTrustedDirectory(theirs, 0, "store.ssd_paths");
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("is owned by uid 65534, neither root nor lohand's"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("chown root " + theirs));
}

TEST_F(TrustedPathTest, MissingDirectoriesAreJudgedWhereTheyWouldBeMade) {
  EXPECT_EQ(CheckTrustedDirectory(root_ + "/none", geteuid(), "k").code(),
            absl::StatusCode::kFailedPrecondition);
  DaemonConfig config;
  config.socket_path = Dir("run", 0755) + "/lohand.sock";
  config.state_dir = root_ + "/state/not/yet";
  config.ssd_paths = {Dir("ssd0", 0700)};
  EXPECT_TRUE(CheckTrustedPaths(config, geteuid()).ok())
      << CheckTrustedPaths(config, geteuid());
  config.state_dir = Dir("open", 0777) + "/state";
  absl::Status s = CheckTrustedPaths(config, geteuid());
  EXPECT_THAT(std::string(s.message()), HasSubstr("key 'daemon.state_dir'"));
  config.state_dir = root_;
  config.ssd_paths.push_back(Dir("open-ssd", 0777));
  s = CheckTrustedPaths(config, geteuid());
  EXPECT_THAT(std::string(s.message()), HasSubstr("key 'store.ssd_paths'"));
}

// lohand, as root, rewrites the metrics file by rename: a directory another
// user may write would let them swap in what node_exporter reads, or race
// the rename. lohand does not make node_exporter's directory: it must be
// there.
TEST_F(TrustedPathTest, TheMetricsDirectoryMustBeTrustedAndExist) {
  DaemonConfig config;
  config.socket_path = Dir("run", 0755) + "/lohand.sock";
  config.state_dir = Dir("state", 0700);
  config.ssd_paths = {Dir("ssd0", 0700)};
  config.metrics_textfile = Dir("textfile", 0755) + "/lohan.prom";
  EXPECT_TRUE(CheckTrustedPaths(config, geteuid()).ok())
      << CheckTrustedPaths(config, geteuid());
  const std::string open = Dir("open-textfile", 0777);
  config.metrics_textfile = open + "/lohan.prom";
  absl::Status s = CheckTrustedPaths(config, geteuid());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("key 'metrics.textfile'"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(open + " is writable by others (mode 0777)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("chmod go-w " + open));
  // Sticky (as /tmp) is not enough for the directory itself.
  ASSERT_EQ(chmod(open.c_str(), 01777), 0);
  EXPECT_THAT(std::string(CheckTrustedPaths(config, geteuid()).message()),
              HasSubstr("key 'metrics.textfile'"));
  config.metrics_textfile = root_ + "/missing/lohan.prom";
  s = CheckTrustedPaths(config, geteuid());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("key 'metrics.textfile': " + root_ +
                        "/missing: No such file or directory"));
  config.metrics_textfile = "";
  EXPECT_TRUE(CheckTrustedPaths(config, geteuid()).ok());
}

}  // namespace
}  // namespace lohan
