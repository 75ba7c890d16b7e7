// lohand's paths cannot be turned against it by another local user: a
// socket directory, state directory or SSD directory that another user can
// write (or made) is refused, naming the path and the fix, before lohand
// writes anything there; a symlink planted at `<socket>.lock` leaves its
// target untouched. The planting is done by a real second uid (`nobody`,
// through setpriv); the test skips, saying so, when not run as root.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool Exists(const std::string& path) {
  struct stat info {};
  return lstat(path.c_str(), &info) == 0;
}

class TrustedPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to act as a second uid";
    mkdir((dir_.path() + "/ssd0").c_str(), 0755);
    // A root-owned file the attacker would like lohand to overwrite.
    precious_ = dir_.path() + "/precious";
    std::ofstream(precious_) << "root's data\n";
    chmod(precious_.c_str(), 0644);
  }

  // A directory anyone may write (0777), as /tmp would be without its
  // sticky bit.
  std::string OpenDirectory(const std::string& name) {
    const std::string path = dir_.path() + "/" + name;
    EXPECT_EQ(mkdir(path.c_str(), 0777), 0);
    EXPECT_EQ(chmod(path.c_str(), 0777), 0);
    return path;
  }

  // Runs `script` with /bin/sh as uid and gid 65534.
  void ShellAsNobody(const std::string& script) {
    RunResult r = RunCommand(AsNobody({"/bin/sh", "-c", script}));
    ASSERT_EQ(r.exit_code, 0) << script << ": " << r.err;
  }

  RunResult Lohand(const std::vector<std::string>& args) {
    return RunCommand(DaemonProcess::Command(dir_.path(), args));
  }

  void ExpectRefused(const RunResult& result,
                     const std::vector<std::string>& expected) {
    EXPECT_EQ(result.exit_code, 1) << result.err;
    for (const std::string& text : expected) {
      EXPECT_THAT(result.err, HasSubstr(text));
    }
    EXPECT_EQ(Contents(precious_), "root's data\n");
  }

  PublicTempDir dir_;
  std::string precious_;
};

TEST_F(TrustedPathsTest, ASocketDirectoryOthersCanWriteIsRefused) {
  const std::string open = OpenDirectory("run");
  // Another user plants a symlink where lohand would create its lock.
  ShellAsNobody("ln -s " + precious_ + " " + open + "/lohand.sock.lock");
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, {"--check-config"}}) {
    std::vector<std::string> args = {"--socket", open + "/lohand.sock"};
    args.insert(args.end(), extra.begin(), extra.end());
    ExpectRefused(Lohand(args),
                  {"key 'daemon.socket'", open + " is writable by others",
                   "chmod go-w " + open});
  }
  EXPECT_FALSE(Exists(open + "/lohand.sock"));
  // Once root closes the directory, the symlink still there is never
  // followed: refused, naming it.
  ASSERT_EQ(chmod(open.c_str(), 0755), 0);
  ExpectRefused(Lohand({"--socket", open + "/lohand.sock"}),
                {"socket lock " + open + "/lohand.sock.lock",
                 "it is a symlink: remove it"});
  // A lock file of another user's, likewise.
  ASSERT_EQ(unlink((open + "/lohand.sock.lock").c_str()), 0);
  ASSERT_EQ(chmod(open.c_str(), 0777), 0);
  ShellAsNobody("touch " + open + "/lohand.sock.lock");
  ASSERT_EQ(chmod(open.c_str(), 0755), 0);
  ExpectRefused(Lohand({"--socket", open + "/lohand.sock"}),
                {"is not a plain file of lohand's own (owner uid 65534"});
  // Removed, lohand starts there, its socket any user's to connect to.
  ASSERT_EQ(unlink((open + "/lohand.sock.lock").c_str()), 0);
  auto daemon = DaemonProcess::Start(open);  // its socket open/lohand.sock
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  struct stat info {};
  ASSERT_EQ(stat((open + "/lohand.sock").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0666u);
}

TEST_F(TrustedPathsTest, AStateDirectoryAnotherUserMadeIsRefused) {
  const std::string open = OpenDirectory("shared");
  ShellAsNobody("mkdir -m 0777 " + open + "/state");
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, {"--check-config"}, {"--salvage"}}) {
    std::vector<std::string> args = {"--state-dir", open + "/state"};
    args.insert(args.end(), extra.begin(), extra.end());
    ExpectRefused(Lohand(args), {"key 'daemon.state_dir'",
                                 open + "/state is owned by uid 65534"});
  }
  EXPECT_FALSE(Exists(open + "/state/store"));
  // Root's own directory inside a directory others can write: its name
  // can be swapped from under lohand, refused too.
  ASSERT_EQ(mkdir((open + "/root-state").c_str(), 0700), 0);
  ExpectRefused(Lohand({"--state-dir", open + "/root-state"}),
                {"key 'daemon.state_dir'", open + ", above ",
                 "writable by others (mode 0777) and not sticky"});
}

TEST_F(TrustedPathsTest, AnSsdDirectoryAnotherUserCanWriteIsRefused) {
  const std::string open = OpenDirectory("ssd-open");
  ExpectRefused(Lohand({"--ssd-path", open}),
                {"key 'store.ssd_paths'", open + " is writable by others"});
  EXPECT_FALSE(Exists(open + "/lohan.data"));
  ShellAsNobody("mkdir " + open + "/theirs");
  ASSERT_EQ(chmod(open.c_str(), 0755), 0);
  ExpectRefused(Lohand({"--ssd-path", open + "/theirs"}),
                {"key 'store.ssd_paths'", "is owned by uid 65534"});
  EXPECT_FALSE(Exists(open + "/theirs/lohan.data"));
}

}  // namespace
}  // namespace lohan::testing
