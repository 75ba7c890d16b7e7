#include "daemon/rpc/peer_table.h"

#include <sys/socket.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

// A connected pair of unix sockets: `fd` plays an accepted connection.
struct SocketPair {
  SocketPair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0); }
  ~SocketPair() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
  void Close() {
    close(fds[0]);
    fds[0] = -1;
  }
  int fd() const { return fds[0]; }
  int fds[2] = {-1, -1};
};

TEST(PeerTable, MapsFdPeersAndRefusesOthers) {
  PeerTable table;
  SocketPair a;
  ASSERT_TRUE(table.Admit(a.fd(), Caller{.uid = 1000, .pid = 42}, 0).ok());
  const std::string peer = "fd:" + std::to_string(a.fd());
  absl::StatusOr<Caller> caller = table.Lookup(peer);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->uid, 1000u);
  EXPECT_EQ(caller->pid, 42);
  // A reused fd number belongs to the newest connection.
  ASSERT_TRUE(table.Admit(a.fd(), Caller{.uid = 0, .pid = 43}, 0).ok());
  EXPECT_EQ(table.Lookup(peer)->uid, 0u);
  for (const char* bad : {"fd:999", "ipv4:127.0.0.1:5", "fd:", "fd:x", ""}) {
    EXPECT_EQ(table.Lookup(bad).status().code(),
              absl::StatusCode::kUnauthenticated)
        << bad;
  }
}

TEST(PeerTable, CountsLiveConnectionsPerUserAndForgetsClosedOnes) {
  PeerTable table;
  SocketPair first, second, third, other;
  const Caller user{.uid = 1000, .pid = 1};
  ASSERT_TRUE(table.Admit(first.fd(), user, 2).ok());
  ASSERT_TRUE(table.Admit(second.fd(), user, 2).ok());
  absl::Status refused = table.Admit(third.fd(), user, 2);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.message()),
              ::testing::HasSubstr("uid 1000 has 2 control connections open "
                                   "and the quota is 2"));
  // Another user has a count of its own.
  EXPECT_TRUE(table.Admit(other.fd(), Caller{.uid = 1001, .pid = 2}, 2).ok());
  EXPECT_EQ(table.ConnectionsOf(1000), 2u);
  // Once a connection is closed (by gRPC, unseen), its place is free.
  first.Close();
  EXPECT_EQ(table.ConnectionsOf(1000), 1u);
  EXPECT_TRUE(table.Admit(third.fd(), user, 2).ok());
  EXPECT_EQ(table.Lookup("fd:" + std::to_string(third.fd()))->uid, 1000u);
}

TEST(PeerTable, AReusedNumberOfAnotherSocketIsNotTheOldConnection) {
  PeerTable table;
  auto pair = std::make_unique<SocketPair>();
  const int number = pair->fd();
  ASSERT_TRUE(table.Admit(number, Caller{.uid = 7, .pid = 1}, 0).ok());
  pair.reset();
  SocketPair reused;  // most likely gets the same number back
  if (reused.fd() != number) GTEST_SKIP() << "the kernel chose another fd";
  EXPECT_EQ(table.ConnectionsOf(7), 0u);
}

}  // namespace
}  // namespace lohan
