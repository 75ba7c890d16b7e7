// ClosedStatusFrom against a socket pair: what lohand (the test's end)
// sent before it hung up becomes the status; anything else is the daemon
// lost.
#include "client/plane_closing.h"

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/fd_passing.h"
#include "wire/plane_notice.h"
#include "wire/unique_fd.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

// The client's end of a connection whose daemon sent `frames` (each a
// frame's payload) and `raw` bytes after them, then hung up.
UniqueFd AfterHangUp(const std::vector<std::vector<uint8_t>>& frames,
                     const std::string& raw = "") {
  int ends[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends), 0);
  UniqueFd daemon(ends[0]);
  for (const std::vector<uint8_t>& frame : frames) {
    EXPECT_TRUE(SendWithFds(daemon.get(), frame, {}).ok());
  }
  if (!raw.empty()) {
    EXPECT_EQ(write(daemon.get(), raw.data(), raw.size()),
              static_cast<ssize_t>(raw.size()));
  }
  return UniqueFd(ends[1]);
}

void ExpectDaemonLost(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("the daemon exited, crashed or "
                                          "restarted"));
}

TEST(PlaneClosing, ANoticeGivesItsCodeAndText) {
  UniqueFd gave_way = AfterHangUp({EncodeClosingNotice(
      ClosingReason::kGaveWay, "to give uid 1001's job j-7 its share")});
  const absl::Status status = ClosedStatusFrom(gave_way.get());
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(status.message(), "to give uid 1001's job j-7 its share");
  UniqueFd stopping = AfterHangUp({EncodeClosingNotice(
      ClosingReason::kDaemonStopping, "lohand is stopping")});
  EXPECT_EQ(ClosedStatusFrom(stopping.get()),
            absl::UnavailableError("lohand is stopping"));
}

TEST(PlaneClosing, NoNoticeIsTheDaemonLost) {
  UniqueFd silent = AfterHangUp({});
  ExpectDaemonLost(ClosedStatusFrom(silent.get()));
}

TEST(PlaneClosing, AMalformedNoticeIsTheDaemonLost) {
  std::vector<uint8_t> bad_reason =
      EncodeClosingNotice(ClosingReason::kGaveWay, "why");
  bad_reason[8] = 9;
  UniqueFd unknown_reason = AfterHangUp({bad_reason});
  ExpectDaemonLost(ClosedStatusFrom(unknown_reason.get()));
  std::vector<uint8_t> bad_code =
      EncodeClosingNotice(ClosingReason::kGaveWay, "why");
  bad_code[10] = 0;  // OK would make every failure look like a success
  UniqueFd ok_code = AfterHangUp({bad_code});
  ExpectDaemonLost(ClosedStatusFrom(ok_code.get()));
  UniqueFd garbage = AfterHangUp({{1, 2, 3}});
  ExpectDaemonLost(ClosedStatusFrom(garbage.get()));
  // A frame larger than any notice, and one cut short by the hang-up.
  UniqueFd huge =
      AfterHangUp({std::vector<uint8_t>(kMaxPlaneNoticeBytes + 1, 'a')});
  ExpectDaemonLost(ClosedStatusFrom(huge.get()));
  UniqueFd cut = AfterHangUp({}, std::string("\x40\x00\x00\x00LNTC", 8));
  ExpectDaemonLost(ClosedStatusFrom(cut.get()));
}

TEST(PlaneClosing, NoticesOfUnknownKindsAreSkipped) {
  std::vector<uint8_t> later =
      EncodeClosingNotice(ClosingReason::kGaveWay, "shrink, please");
  later[6] = 7;
  UniqueFd connection = AfterHangUp(
      {later, EncodeClosingNotice(ClosingReason::kStopped, "lohanctl drain")});
  EXPECT_EQ(ClosedStatusFrom(connection.get()),
            absl::AbortedError("lohanctl drain"));
  UniqueFd only_later = AfterHangUp({later});
  ExpectDaemonLost(ClosedStatusFrom(only_later.get()));
}

}  // namespace
}  // namespace lohan
