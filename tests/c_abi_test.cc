// The C ABI round trip, through a C program linked against
// liblohan_client.so, against a real daemon.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;

TEST(CAbi, RoundTrip) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  RunResult result = RunCommand({Runfile("tests/c_client/lohan_c_client"),
                                 (*daemon)->socket(), "roundtrip", "c-job"});
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_THAT(result.out,
              HasSubstr("hello: daemon 0.1.0 protocol 1.0 uid " +
                        std::to_string(getuid()) + " jobs-capability 1\n"));
  EXPECT_THAT(result.out, HasSubstr("create: j-000001 name c-job owner " +
                                    std::to_string(getuid()) + " state 1\n"));
  EXPECT_THAT(result.out, HasSubstr("attach: state 2 pid "));
  EXPECT_THAT(result.out, HasSubstr("list: 1 jobs\n"));
  EXPECT_THAT(result.out,
              HasSubstr("delete-while-attached: FAILED_PRECONDITION\n"));
  EXPECT_THAT(result.out, HasSubstr("status: json ok\n"));
  EXPECT_THAT(result.out, HasSubstr("delete: ok\n"));
  EXPECT_THAT(result.out, HasSubstr("null-name: INVALID_ARGUMENT\n"));
  EXPECT_THAT(result.out, HasSubstr("bad-name: INVALID_ARGUMENT\n"));
  EXPECT_THAT(result.out, HasSubstr("null-plane-job: INVALID_ARGUMENT\n"));
  EXPECT_THAT(result.out, HasSubstr("null-model-plane: INVALID_ARGUMENT\n"));
  EXPECT_THAT(result.out, HasSubstr("null-model: INVALID_ARGUMENT\n"));
  // The daemon is still serving after the bad requests.
  RunResult list = RunCommand(
      {Runfile("tests/c_client/lohan_c_client"), (*daemon)->socket(), "list"});
  EXPECT_EQ(list.exit_code, 0) << list.out;
  EXPECT_EQ(list.out, "");
}

TEST(CAbi, NoDaemonIsUnavailableNamingTheSocket) {
  PublicTempDir dir;
  const std::string socket = dir.path() + "/nobody-home.sock";
  RunResult result =
      RunCommand({Runfile("tests/c_client/lohan_c_client"), socket, "list"});
  EXPECT_EQ(result.exit_code, 14);  // LOHAN_UNAVAILABLE
  EXPECT_THAT(
      result.out,
      HasSubstr("connect: UNAVAILABLE: no lohand answers at " + socket));
}

TEST(CAbi, UnknownJobIsNotFound) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  RunResult result = RunCommand({Runfile("tests/c_client/lohan_c_client"),
                                 (*daemon)->socket(), "attach", "j-424242"});
  EXPECT_EQ(result.exit_code, 5);  // LOHAN_NOT_FOUND
  EXPECT_THAT(result.out, HasSubstr("no job 'j-424242'"));
}

}  // namespace
}  // namespace lohan::testing
