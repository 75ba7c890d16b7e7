#include "daemon/ipc/unix_listener.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

class UnixListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = "/tmp/lohan-listener-XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    path_ = dir_ + "/sub/dir/lohand.sock";
  }
  void TearDown() override {
    std::string command = "rm -rf " + dir_;
    ASSERT_EQ(system(command.c_str()), 0);
  }

  int Connect() {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strcpy(address.sun_path, path_.c_str());
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
        0) {
      close(fd);
      return -1;
    }
    return fd;
  }

  std::string dir_;
  std::string path_;
};

TEST_F(UnixListenerTest, AcceptsWithPeerCredentialsAndCleansUp) {
  auto listener = UnixListener::Bind(path_);
  ASSERT_TRUE(listener.ok()) << listener.status();
  struct stat info {};
  ASSERT_EQ(stat(path_.c_str(), &info), 0);
  EXPECT_TRUE(S_ISSOCK(info.st_mode));
  EXPECT_EQ(info.st_mode & 0777, 0666u);

  std::atomic<int> accepted{0};
  std::atomic<pid_t> seen_pid{0};
  (*listener)->Start([&](UniqueFd fd, const Caller& caller) {
    EXPECT_TRUE(fd.valid());
    seen_pid = caller.pid;
    EXPECT_EQ(caller.uid, getuid());
    ++accepted;
  });
  int client = Connect();
  ASSERT_GE(client, 0);
  for (int i = 0; i < 5000 && accepted == 0; ++i) usleep(1000);
  EXPECT_EQ(accepted, 1);
  EXPECT_EQ(seen_pid, getpid());
  close(client);
  (*listener)->Stop();
  EXPECT_NE(stat(path_.c_str(), &info), 0) << "socket file left behind";
}

TEST_F(UnixListenerTest, SecondBindOnLivePathIsRefused) {
  auto first = UnixListener::Bind(path_);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = UnixListener::Bind(path_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(second.status().message()),
      HasSubstr("held by a running lohand (pid " + std::to_string(getpid())));
  // The refused attempt must not have disturbed the live socket.
  struct stat info {};
  EXPECT_EQ(stat(path_.c_str(), &info), 0);
}

TEST_F(UnixListenerTest, StaleSocketIsReplaced) {
  {
    auto first = UnixListener::Bind(path_);
    ASSERT_TRUE(first.ok());
  }
  // Simulate a dead daemon's leftover: a socket file nobody listens on.
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strcpy(address.sun_path, path_.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)),
            0);
  close(fd);
  EXPECT_LT(Connect(), 0);
  auto second = UnixListener::Bind(path_);
  ASSERT_TRUE(second.ok()) << second.status();
  (*second)->Start([](UniqueFd, const Caller&) {});
  int client = Connect();
  EXPECT_GE(client, 0);
  close(client);
}

TEST_F(UnixListenerTest, RefusesNonSocketAtPath) {
  ASSERT_EQ(system(("mkdir -p " + dir_ + "/sub/dir").c_str()), 0);
  std::ofstream(path_) << "not a socket";
  auto listener = UnixListener::Bind(path_);
  EXPECT_EQ(listener.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(listener.status().message()),
              HasSubstr("is not a socket"));
}

TEST_F(UnixListenerTest, RefusesOverlongPath) {
  auto listener = UnixListener::Bind("/tmp/" + std::string(200, 'x'));
  EXPECT_EQ(listener.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lohan
