// Jobs belong to the uid that created them, as the kernel reports it through
// the socket's peer credentials: root runs the C client as `nobody` with
// setpriv and checks what each side may do.
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kNobody = 65534;
constexpr int kNotFound = 5;

class OwnershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (getuid() != 0) GTEST_SKIP() << "needs root to run a client as nobody";
    // The client and its library must be reachable by nobody, and Bazel's
    // output tree is not: copy both into the public test directory.
    bin_ = dir_.path() + "/bin";
    ASSERT_EQ(mkdir(bin_.c_str(), 0755), 0);
    ASSERT_EQ(RunCommand({"/bin/cp", Runfile("tests/c_client/lohan_c_client"),
                          Runfile("client/liblohan_client.so"), bin_})
                  .exit_code,
              0);
    auto daemon = DaemonProcess::Start(dir_.path());
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
  }

  RunResult AsRoot(const std::vector<std::string>& args) {
    return Client({}, args);
  }

  RunResult AsNobody(const std::vector<std::string>& args) {
    return Client({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                   "--clear-groups"},
                  args);
  }

  RunResult Client(std::vector<std::string> prefix,
                   const std::vector<std::string>& args) {
    prefix.push_back(bin_ + "/lohan_c_client");
    prefix.push_back(daemon_->socket());
    for (const std::string& arg : args) prefix.push_back(arg);
    if (prefix[0][0] != '/') prefix[0] = "/usr/bin/" + prefix[0];
    return RunCommand(prefix, {"LD_LIBRARY_PATH=" + bin_});
  }

  PublicTempDir dir_;
  std::string bin_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(OwnershipTest, OtherUidIsDeniedRootSeesAll) {
  RunResult created = AsRoot({"create", "roots-job"});
  ASSERT_EQ(created.exit_code, 0) << created.out << created.err;
  const std::string root_job(absl::StripAsciiWhitespace(created.out));

  // nobody cannot touch root's job, nor tell it from a missing one...
  RunResult attach = AsNobody({"attach", root_job});
  EXPECT_EQ(attach.exit_code, kNotFound) << attach.out << attach.err;
  EXPECT_THAT(attach.out, HasSubstr("NOT_FOUND"));
  RunResult missing = AsNobody({"attach", "j-999999"});
  std::string as_missing = attach.out;
  as_missing.replace(as_missing.find(root_job), root_job.size(), "j-999999");
  EXPECT_EQ(as_missing, missing.out);
  RunResult remove = AsNobody({"delete", root_job});
  EXPECT_EQ(remove.exit_code, kNotFound) << remove.out;
  // ...nor see it.
  RunResult nobody_list = AsNobody({"list"});
  ASSERT_EQ(nobody_list.exit_code, 0) << nobody_list.out << nobody_list.err;
  EXPECT_EQ(nobody_list.out, "");

  // nobody's own job is owned by nobody's uid, as the kernel says.
  RunResult own = AsNobody({"create", "nobodys-job"});
  ASSERT_EQ(own.exit_code, 0) << own.out << own.err;
  const std::string nobody_job(absl::StripAsciiWhitespace(own.out));
  nobody_list = AsNobody({"list"});
  EXPECT_EQ(nobody_list.out,
            nobody_job + " nobodys-job " + std::to_string(kNobody) + "\n");
  EXPECT_EQ(AsNobody({"attach", nobody_job}).exit_code, 0);

  // Root sees and may act on both.
  RunResult root_list = AsRoot({"list"});
  EXPECT_THAT(root_list.out, HasSubstr(root_job + " roots-job 0\n"));
  EXPECT_THAT(root_list.out, HasSubstr(nobody_job + " nobodys-job " +
                                       std::to_string(kNobody)));
  EXPECT_EQ(AsRoot({"attach", nobody_job}).exit_code, 0);
  EXPECT_EQ(AsRoot({"delete", nobody_job}).exit_code, 0);
  EXPECT_EQ(AsNobody({"list"}).out, "");
}

TEST_F(OwnershipTest, StatusNamesNoOtherUsersJobs) {
  RunResult created = AsRoot({"create", "roots-arena", "8388608"});
  ASSERT_EQ(created.exit_code, 0) << created.out << created.err;
  const std::string root_job(absl::StripAsciiWhitespace(created.out));
  auto holder = BackgroundProcess::Start(
      {bin_ + "/lohan_c_client", daemon_->socket(), "arena-hold", root_job},
      {"LD_LIBRARY_PATH=" + bin_});
  ASSERT_TRUE(holder.ok()) << holder.status();
  // Root sees its arena; nobody sees the pool in use but not whose.
  RunResult root_status = AsRoot({"status"});
  ASSERT_EQ(root_status.exit_code, 0) << root_status.out;
  EXPECT_THAT(root_status.out, HasSubstr("\"job_id\":\"" + root_job));
  RunResult nobody_status = AsNobody({"status"});
  ASSERT_EQ(nobody_status.exit_code, 0) << nobody_status.out;
  EXPECT_THAT(nobody_status.out, HasSubstr("\"used_bytes\":\"8388608\""));
  EXPECT_THAT(nobody_status.out, ::testing::Not(HasSubstr(root_job)));
}

TEST_F(OwnershipTest, SameNameForTwoUsersIsTwoJobs) {
  ASSERT_EQ(AsRoot({"create", "shared-name"}).exit_code, 0);
  RunResult nobody = AsNobody({"create", "shared-name"});
  EXPECT_EQ(nobody.exit_code, 0) << nobody.out;
  RunResult again = AsNobody({"create", "shared-name"});
  EXPECT_EQ(again.exit_code, 6) << again.out;  // ALREADY_EXISTS
  EXPECT_THAT(again.out, HasSubstr("already have a job named 'shared-name'"));
}

}  // namespace
}  // namespace lohan::testing
