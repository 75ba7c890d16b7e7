// lohand under systemd (Type=notify, WatchdogSec=): a real lohand told of a
// notification socket the test plays systemd on. It says what its start is
// doing, READY=1 only once it serves, STOPPING=1 when it stops, and pings
// the watchdog only while its control plane answers.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/control_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Bounds only what a broken lohand would never do; a healthy one does each
// in milliseconds to seconds.
constexpr absl::Duration kPatience = absl::Seconds(60);
// WatchdogSec for the tests: lohand checks itself every 3 s and gives a
// check 1.5 s (Watchdog), far above what a GetStatus takes even on a loaded
// machine.
constexpr absl::Duration kInterval = absl::Seconds(6);

struct Datagram {
  std::string text;
  absl::Time arrived;  // the kernel's receive time
};

// The socket systemd hands a Type=notify service in $NOTIFY_SOCKET.
class FakeSystemd {
 public:
  // A datagram socket bound at `path`. `one_slot`: it queues a single
  // datagram (net.unix.max_dgram_qlen 0, set in a network namespace of the
  // socket's own), so a sender blocks in its next send until the test has
  // read the one before: lohand cannot get past a notification the test
  // holds. PERMISSION_DENIED where this process may not make a namespace.
  static absl::StatusOr<std::unique_ptr<FakeSystemd>> Bind(
      const std::string& path, bool one_slot) {
    absl::StatusOr<int> fd = absl::InternalError("not run");
    auto make = [&] {
      if (one_slot) {
        // Only this short-lived thread moves to the new namespace; the
        // socket keeps it alive, and a path reaches it from any namespace.
        if (unshare(CLONE_NEWNET) != 0) {
          fd = absl::PermissionDeniedError(
              absl::StrCat("unshare(CLONE_NEWNET): ", std::strerror(errno)));
          return;
        }
        FILE* qlen = std::fopen("/proc/sys/net/unix/max_dgram_qlen", "w");
        if (qlen == nullptr || std::fputs("0", qlen) < 0 ||
            std::fclose(qlen) != 0) {
          fd = absl::PermissionDeniedError("cannot set max_dgram_qlen");
          return;
        }
      }
      fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    };
    std::thread(make).join();
    if (!fd.ok()) return fd.status();
    std::unique_ptr<FakeSystemd> systemd(new FakeSystemd(*fd, path));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof(address.sun_path), "%s",
                  path.c_str());
    if (bind(*fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
        0) {
      return absl::InternalError(absl::StrCat("bind: ", std::strerror(errno)));
    }
    const int on = 1;
    setsockopt(*fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on));
    return systemd;
  }
  ~FakeSystemd() {
    close(fd_);
    unlink(path_.c_str());
  }

  const std::string& path() const { return path_; }

  // The next datagram, waiting up to `timeout`; nullopt if none came.
  std::optional<Datagram> Receive(absl::Duration timeout) {
    return Next(timeout, 0);
  }
  // The next datagram's text, left queued.
  std::optional<std::string> Peek(absl::Duration timeout) {
    std::optional<Datagram> next = Next(timeout, MSG_PEEK);
    if (!next) return std::nullopt;
    return next->text;
  }
  // What is queued now.
  std::vector<std::string> Drain() {
    std::vector<std::string> queued;
    while (std::optional<Datagram> next = Next(absl::ZeroDuration(), 0)) {
      queued.push_back(next->text);
    }
    return queued;
  }
  // Datagrams until one with a `wanted` line (returned with the ones
  // before it), or nullopt after `timeout` in all.
  std::optional<std::vector<std::string>> ReceiveUntil(
      const std::string& wanted, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    std::vector<std::string> seen;
    while (std::optional<Datagram> next = Receive(Left(deadline))) {
      seen.push_back(next->text);
      for (absl::string_view line : absl::StrSplit(next->text, '\n')) {
        if (line == wanted) return seen;
      }
    }
    return std::nullopt;
  }
  // Every datagram that arrives until `deadline`.
  std::vector<Datagram> ReceiveFor(absl::Time deadline) {
    std::vector<Datagram> seen;
    while (absl::Now() < deadline) {
      if (std::optional<Datagram> next = Receive(Left(deadline))) {
        seen.push_back(*std::move(next));
      }
    }
    return seen;
  }

 private:
  FakeSystemd(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  static absl::Duration Left(absl::Time deadline) {
    return std::max(deadline - absl::Now(), absl::ZeroDuration());
  }

  std::optional<Datagram> Next(absl::Duration timeout, int flags) {
    pollfd ready{.fd = fd_, .events = POLLIN, .revents = 0};
    if (poll(&ready, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) <=
        0) {
      return std::nullopt;
    }
    char text[4096];
    iovec data{.iov_base = text, .iov_len = sizeof(text)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec))];
    msghdr message{};
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t got = recvmsg(fd_, &message, flags | MSG_DONTWAIT);
    if (got < 0) return std::nullopt;
    Datagram datagram{.text = std::string(text, static_cast<size_t>(got)),
                      .arrived = absl::Now()};
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr;
         c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
        timespec stamp;
        std::memcpy(&stamp, CMSG_DATA(c), sizeof(stamp));
        datagram.arrived = absl::TimeFromTimespec(stamp);
      }
    }
    return datagram;
  }

  const int fd_;
  const std::string path_;
};

// Every line of a notification is an assignment, as sd_notify(3) wants.
void ExpectAssignments(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t equals = line.find('=');
    EXPECT_TRUE(equals != absl::string_view::npos && equals > 0 &&
                equals + 1 < line.size())
        << "not KEY=VALUE: '" << line << "' in '" << text << "'";
  }
}

bool Answers(const std::string& socket) {
  return ControlClient::Connect({.socket_path = socket,
                                 .client_name = "systemd-notify-test",
                                 .timeout = std::chrono::milliseconds(1000)})
      .ok();
}

// Whether the control plane answers within kPatience.
bool AnswersSoon(const std::string& socket) {
  const absl::Time deadline = absl::Now() + kPatience;
  while (absl::Now() < deadline) {
    if (Answers(socket)) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

size_t Count(const std::vector<std::string>& texts, const std::string& line) {
  size_t count = 0;
  for (const std::string& text : texts) {
    for (absl::string_view each : absl::StrSplit(text, '\n')) {
      count += each == line;
    }
  }
  return count;
}

TEST(SystemdNotify, ReadyOnlyOnceTheControlPlaneAnswers) {
  PublicTempDir dir;
  auto systemd = FakeSystemd::Bind(dir.path() + "/notify", /*one_slot=*/true);
  if (absl::IsPermissionDenied(systemd.status())) {
    GTEST_SKIP() << "needs a network namespace of its own (root): "
                 << systemd.status();
  }
  ASSERT_TRUE(systemd.ok()) << systemd.status();
  auto daemon = DaemonProcess::Spawn(dir.path(), {},
                                     {"NOTIFY_SOCKET=" + (*systemd)->path()});
  ASSERT_TRUE(daemon.ok()) << daemon.status();

  // The start, one notification at a time: while the test holds one
  // unread, lohand cannot send the next.
  std::vector<std::string> phases;
  while (true) {
    std::optional<std::string> next = (*systemd)->Peek(kPatience);
    ASSERT_TRUE(next.has_value())
        << "no notification after " << absl::StrJoin(phases, " / ") << ":\n"
        << (*daemon)->Log();
    ASSERT_THAT(*next, Not(HasSubstr("READY=1")))
        << "READY=1 during the start, after: " << absl::StrJoin(phases, " / ");
    ASSERT_THAT(*next, StartsWith("STATUS="));
    ASSERT_THAT(*next, Not(HasSubstr("\n")));
    ExpectAssignments(*next);
    phases.push_back(next->substr(7));
    // The start's last phase: held here, lohand may go on to serve but
    // cannot send what follows this notification.
    if (absl::StartsWith(phases.back(), "starting the optimizer")) break;
    ASSERT_TRUE((*systemd)->Receive(absl::ZeroDuration()).has_value());
  }
  EXPECT_THAT(phases.front(), StartsWith("opening the jobs and the SSD store"));
  // READY=1 is lohand's next notification, so it is sent only once the
  // control plane answers: held before it, lohand serves anyway. (Sent
  // before serving, it would wait on this test, and no answer would come.)
  EXPECT_TRUE(AnswersSoon((*daemon)->socket()))
      << "lohand, held before READY=1, does not serve:\n"
      << (*daemon)->Log();
  ASSERT_TRUE((*systemd)->Receive(absl::ZeroDuration()).has_value());
  std::optional<Datagram> ready = (*systemd)->Receive(kPatience);
  ASSERT_TRUE(ready.has_value()) << (*daemon)->Log();
  ExpectAssignments(ready->text);
  const std::vector<std::string> lines = absl::StrSplit(ready->text, '\n');
  ASSERT_EQ(lines.size(), 2u) << ready->text;
  EXPECT_EQ(lines[0], "READY=1");
  EXPECT_THAT(lines[1],
              StartsWith("STATUS=serving on " + (*daemon)->socket() + " ("));
  EXPECT_THAT(lines[1], HasSubstr("SSDs: 1, host pool 64.0 MiB"));

  // Stopping: said first.
  ASSERT_EQ(kill((*daemon)->pid(), SIGTERM), 0);
  std::optional<Datagram> stopping = (*systemd)->Receive(kPatience);
  ASSERT_TRUE(stopping.has_value()) << (*daemon)->Log();
  ExpectAssignments(stopping->text);
  EXPECT_THAT(stopping->text, StartsWith("STOPPING=1\nSTATUS=stopping: "));
  EXPECT_EQ((*daemon)->Stop(SIGTERM), 0) << (*daemon)->Log();
  EXPECT_TRUE((*systemd)->Drain().empty());
}

TEST(SystemdNotify, WatchdogPingedOnlyWhileLohandAnswers) {
  PublicTempDir dir;
  auto systemd = FakeSystemd::Bind(dir.path() + "/notify", /*one_slot=*/false);
  ASSERT_TRUE(systemd.ok()) << systemd.status();
  auto daemon = DaemonProcess::Start(
      dir.path(), {},
      {"NOTIFY_SOCKET=" + (*systemd)->path(),
       absl::StrCat("WATCHDOG_USEC=", absl::ToInt64Microseconds(kInterval))});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const pid_t pid = (*daemon)->pid();
  ASSERT_TRUE((*systemd)->ReceiveUntil("READY=1", kPatience).has_value())
      << (*daemon)->Log();

  // Paced pings: checks start every interval/2, so three pings span at
  // least one of those (whatever each check took); none late by more than
  // generous multiples of the interval.
  std::vector<absl::Time> pings;
  while (pings.size() < 3) {
    std::optional<Datagram> next = (*systemd)->Receive(5 * kInterval);
    ASSERT_TRUE(next.has_value()) << "no ping within 5 intervals:\n"
                                  << (*daemon)->Log();
    ASSERT_EQ(next->text, "WATCHDOG=1");
    pings.push_back(next->arrived);
  }
  EXPECT_GE(pings.back() - pings.front(), kInterval / 2);

  // Stopped (SIGSTOP): no ping for two intervals, where systemd would have
  // stopped it after one.
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, WUNTRACED), pid);
  ASSERT_TRUE(WIFSTOPPED(status));
  (*systemd)->Drain();  // sent before it stopped
  std::optional<Datagram> while_stopped = (*systemd)->Receive(2 * kInterval);
  EXPECT_FALSE(while_stopped.has_value()) << while_stopped->text;
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  std::optional<Datagram> resumed = (*systemd)->Receive(5 * kInterval);
  ASSERT_TRUE(resumed.has_value()) << (*daemon)->Log();
  EXPECT_EQ(resumed->text, "WATCHDOG=1");

  // Running but unreachable (its socket file gone): the check is a real
  // call, not a timer. A check already connected may still ping once.
  const std::string socket = (*daemon)->socket();
  const std::string away = socket + ".away";
  ASSERT_EQ(rename(socket.c_str(), away.c_str()), 0);
  const absl::Time renamed = absl::Now();
  std::vector<std::string> unreachable;
  for (const Datagram& datagram :
       (*systemd)->ReceiveFor(renamed + 2 * kInterval)) {
    // Pings sent before the rename are the healthy daemon's.
    if (datagram.arrived > renamed) unreachable.push_back(datagram.text);
  }
  EXPECT_LE(Count(unreachable, "WATCHDOG=1"), 1u)
      << absl::StrJoin(unreachable, " | ");
  EXPECT_THAT((*daemon)->Log(), HasSubstr("watchdog: not pinging systemd"));
  ASSERT_EQ(rename(away.c_str(), socket.c_str()), 0);
  std::optional<Datagram> back = (*systemd)->Receive(5 * kInterval);
  ASSERT_TRUE(back.has_value()) << (*daemon)->Log();
  EXPECT_EQ(back->text, "WATCHDOG=1");
  EXPECT_THAT((*daemon)->Log(), HasSubstr("watchdog: alive again"));

  // SIGTERM: STOPPING=1, and no ping after it (the watchdog's thread is
  // joined first).
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  std::optional<std::vector<std::string>> until_stopping =
      (*systemd)->ReceiveUntil("STOPPING=1", kPatience);
  ASSERT_TRUE(until_stopping.has_value()) << (*daemon)->Log();
  EXPECT_EQ((*daemon)->Stop(SIGTERM), 0) << (*daemon)->Log();
  const std::vector<std::string> after = (*systemd)->Drain();
  EXPECT_EQ(Count(after, "WATCHDOG=1"), 0u) << absl::StrJoin(after, " | ");
}

TEST(SystemdNotify, NobodyListeningStopsNothing) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(
      dir.path(), {},
      {"NOTIFY_SOCKET=" + dir.path() + "/nobody", "WATCHDOG_USEC=6000000"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_TRUE(Answers((*daemon)->socket()));
  EXPECT_EQ((*daemon)->Stop(SIGTERM), 0) << (*daemon)->Log();
  EXPECT_THAT((*daemon)->Log(), HasSubstr("systemd: notifying systemd"));
}

TEST(SystemdNotify, WithoutNotifySocketNoWatchdog) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(dir.path(), {}, {"WATCHDOG_USEC=6000000"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_EQ((*daemon)->Stop(SIGTERM), 0) << (*daemon)->Log();
  EXPECT_THAT((*daemon)->Log(), Not(HasSubstr("systemd watchdog")));
}

}  // namespace
}  // namespace lohan::testing
