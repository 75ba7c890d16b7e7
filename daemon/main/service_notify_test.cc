#include "daemon/main/service_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "wire/unique_fd.h"

namespace lohan {
namespace {

// A socket systemd would listen on: datagrams, with senders' credentials.
class FakeSystemd {
 public:
  // `name`: a path, or an abstract name with a leading '@'.
  explicit FakeSystemd(const std::string& name) : name_(name) {
    fd_.reset(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, name.data(), name.size());
    if (name[0] == '@') address.sun_path[0] = '\0';
    const socklen_t length =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() +
                               (name[0] == '@' ? 0 : 1));
    bound_ =
        bind(fd_.get(), reinterpret_cast<sockaddr*>(&address), length) == 0;
    const int on = 1;
    setsockopt(fd_.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof(on));
    const timeval timeout{.tv_sec = 60, .tv_usec = 0};
    setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~FakeSystemd() {
    if (name_[0] == '/') unlink(name_.c_str());
  }

  bool bound() const { return bound_; }

  // The next datagram and its sender's pid; empty text on timeout.
  std::string Receive(pid_t* sender = nullptr) {
    char text[4096];
    iovec data{.iov_base = text, .iov_len = sizeof(text)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    msghdr message{};
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t got = recvmsg(fd_.get(), &message, 0);
    if (got < 0) return "";
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr;
         c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
          sender != nullptr) {
        ucred credentials;
        std::memcpy(&credentials, CMSG_DATA(c), sizeof(credentials));
        *sender = credentials.pid;
      }
    }
    return std::string(text, static_cast<size_t>(got));
  }

 private:
  const std::string name_;
  UniqueFd fd_;
  bool bound_ = false;
};

class ServiceNotifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Not TEST_TMPDIR: a socket path must fit sockaddr_un.
    char dir[] = "/tmp/lohan-notify.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { rmdir(dir_.c_str()); }

  std::string dir_;
};

TEST_F(ServiceNotifyTest, DisabledWithoutASocket) {
  absl::StatusOr<ServiceNotifier> notifier = ServiceNotifier::For("");
  ASSERT_TRUE(notifier.ok()) << notifier.status();
  EXPECT_FALSE(notifier->enabled());
  EXPECT_TRUE(notifier->Notify("READY=1").ok());
  EXPECT_FALSE(ServiceNotifier().enabled());
  EXPECT_TRUE(ServiceNotifier().Notify("WATCHDOG=1").ok());
}

TEST_F(ServiceNotifyTest, FromTheEnvironment) {
  unsetenv("NOTIFY_SOCKET");
  absl::StatusOr<ServiceNotifier> unset = ServiceNotifier::FromEnvironment();
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_FALSE(unset->enabled());

  const std::string path = dir_ + "/notify";
  FakeSystemd systemd(path);
  ASSERT_TRUE(systemd.bound());
  setenv("NOTIFY_SOCKET", path.c_str(), 1);
  absl::StatusOr<ServiceNotifier> set = ServiceNotifier::FromEnvironment();
  unsetenv("NOTIFY_SOCKET");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE(set->enabled());
  ASSERT_TRUE(set->Notify("READY=1\nSTATUS=serving").ok());
  EXPECT_EQ(systemd.Receive(), "READY=1\nSTATUS=serving");
}

TEST_F(ServiceNotifyTest, ToAPathFromAnyThreadAsThisProcess) {
  const std::string path = dir_ + "/notify";
  FakeSystemd systemd(path);
  ASSERT_TRUE(systemd.bound());
  absl::StatusOr<ServiceNotifier> notifier = ServiceNotifier::For(path);
  ASSERT_TRUE(notifier.ok()) << notifier.status();
  ASSERT_TRUE(notifier->Notify("STATUS=opening the store").ok());
  pid_t sender = 0;
  EXPECT_EQ(systemd.Receive(&sender), "STATUS=opening the store");
  EXPECT_EQ(sender, getpid());
  // NotifyAccess=main: a datagram from another thread is still the main
  // process's (the kernel reports the thread group's pid).
  absl::Status sent;
  std::thread([&] { sent = notifier->Notify("WATCHDOG=1"); }).join();
  ASSERT_TRUE(sent.ok()) << sent;
  sender = 0;
  EXPECT_EQ(systemd.Receive(&sender), "WATCHDOG=1");
  EXPECT_EQ(sender, getpid());
}

TEST_F(ServiceNotifyTest, ToAnAbstractName) {
  const std::string name =
      absl::StrCat("@lohan-notify-test-", getpid(), "-", dir_.substr(18));
  FakeSystemd systemd(name);
  ASSERT_TRUE(systemd.bound());
  absl::StatusOr<ServiceNotifier> notifier = ServiceNotifier::For(name);
  ASSERT_TRUE(notifier.ok()) << notifier.status();
  ASSERT_TRUE(notifier->Notify("STOPPING=1").ok());
  EXPECT_EQ(systemd.Receive(), "STOPPING=1");
}

TEST_F(ServiceNotifyTest, NobodyListening) {
  absl::StatusOr<ServiceNotifier> notifier =
      ServiceNotifier::For(dir_ + "/nobody");
  ASSERT_TRUE(notifier.ok()) << notifier.status();
  EXPECT_FALSE(notifier->Notify("READY=1").ok());
}

TEST_F(ServiceNotifyTest, RefusesWhatIsNoUnixSocket) {
  for (const std::string& bad :
       {std::string("relative/notify"), std::string("vsock:2:1234"),
        "/" + std::string(sizeof(sockaddr_un::sun_path), 'x'),
        "@" + std::string(sizeof(sockaddr_un::sun_path), 'x')}) {
    absl::StatusOr<ServiceNotifier> notifier = ServiceNotifier::For(bad);
    EXPECT_EQ(notifier.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  // The longest of each that fits.
  const size_t room = sizeof(sockaddr_un::sun_path);
  EXPECT_TRUE(ServiceNotifier::For("/" + std::string(room - 2, 'x')).ok());
  EXPECT_TRUE(ServiceNotifier::For("@" + std::string(room - 1, 'x')).ok());
}

TEST(StatusLineTest, OneLine) {
  EXPECT_EQ(StatusLine("serving on /run/lohan/lohand.sock"),
            "STATUS=serving on /run/lohan/lohand.sock");
  EXPECT_EQ(StatusLine("a\nREADY=1"), "STATUS=a READY=1");
}

TEST(WatchdogIntervalTest, AsSdWatchdogEnabledReadsIt) {
  EXPECT_EQ(*WatchdogInterval(nullptr, nullptr, 42), absl::ZeroDuration());
  EXPECT_EQ(*WatchdogInterval("", nullptr, 42), absl::ZeroDuration());
  EXPECT_EQ(*WatchdogInterval("60000000", nullptr, 42), absl::Seconds(60));
  EXPECT_EQ(*WatchdogInterval("60000000", "", 42), absl::Seconds(60));
  EXPECT_EQ(*WatchdogInterval("1500", "42", 42), absl::Microseconds(1500));
  // Meant for another process (a parent that spawned this one).
  EXPECT_EQ(*WatchdogInterval("60000000", "43", 42), absl::ZeroDuration());
  for (const char* bad : {"0", "-5", "ten", "1.5"}) {
    EXPECT_EQ(WatchdogInterval(bad, nullptr, 42).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(WatchdogInterval("60000000", "pid", 42).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lohan
