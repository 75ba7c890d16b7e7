#include "wire/fd_passing.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "daemon/pool/shared_arena.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

absl::Span<const uint8_t> Bytes(const std::string& text) {
  return absl::Span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

std::string Text(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

struct SocketPair {
  UniqueFd a, b;
};
SocketPair MakeSocketPair() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return {};
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Runs `body` in a forked child; returns its exit code (or 128 + signal).
int RunInChild(const std::function<int()>& body) {
  const pid_t child = fork();
  if (child == 0) _exit(body());
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(FdPassingTest, PassedMemfdMapsTheSameBytesInAnotherProcess) {
  SharedArena::Options options;
  options.bytes = 1 << 20;
  auto arena = SharedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status();
  std::memcpy((*arena)->base() + 12345, "from the daemon", 15);

  SocketPair sockets = MakeSocketPair();
  ASSERT_TRUE(sockets.a.valid());
  const int fds[] = {(*arena)->fd()};
  ASSERT_TRUE(SendWithFds(sockets.a.get(), Bytes("arena 1048576"), fds).ok());

  const int child_socket = sockets.b.get();
  const int code = RunInChild([child_socket] {
    auto message = ReceiveWithFds(child_socket, 1024, 1);
    if (!message.ok()) return 10;
    if (Text(message->payload) != "arena 1048576") return 11;
    const int fd = message->fds[0].get();
    if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC)) return 12;
    void* base =
        mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return 13;
    uint8_t* bytes = static_cast<uint8_t*>(base);
    if (std::memcmp(bytes + 12345, "from the daemon", 15) != 0) return 14;
    std::memcpy(bytes + 777, "from the client", 15);
    if (ftruncate(fd, 4096) == 0) return 15;  // the seals hold there too
    munmap(base, 1 << 20);
    return 0;
  });
  EXPECT_EQ(code, 0);
  EXPECT_EQ(std::memcmp((*arena)->base() + 777, "from the client", 15), 0);
}

TEST(FdPassingTest, SeveralFdsAndEmptyPayload) {
  SocketPair sockets = MakeSocketPair();
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  const int fds[] = {read_end.get(), write_end.get()};
  ASSERT_TRUE(SendWithFds(sockets.a.get(), {}, fds).ok());
  auto message = ReceiveWithFds(sockets.b.get(), 16, 2);
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_TRUE(message->payload.empty());
  ASSERT_EQ(message->fds.size(), 2u);
  // The received write end feeds the original read end.
  ASSERT_EQ(write(message->fds[1].get(), "x", 1), 1);
  char c = 0;
  ASSERT_EQ(read(read_end.get(), &c, 1), 1);
  EXPECT_EQ(c, 'x');
}

TEST(FdPassingTest, UnexpectedFdCountIsAnErrorAndClosesThem) {
  SocketPair sockets = MakeSocketPair();
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  const int fds[] = {write_end.get()};
  ASSERT_TRUE(SendWithFds(sockets.a.get(), Bytes("hello"), fds).ok());
  auto message = ReceiveWithFds(sockets.b.get(), 16, 0);
  EXPECT_EQ(message.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(message.status().message().find("expected 0 fds, got 1"),
            std::string::npos);
  // The received duplicate was closed: with our write end closed too, the
  // pipe reports EOF.
  write_end.reset();
  char c;
  EXPECT_EQ(read(read_end.get(), &c, 1), 0);
}

TEST(FdPassingTest, TooManyFdsTruncatesAndIsAnError) {
  SocketPair sockets = MakeSocketPair();
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  // A hostile peer sends more fds than any frame may carry, bypassing our
  // sender's limit with a raw sendmsg.
  constexpr int kCount = kMaxPassedFds + 4;
  int many[kCount];
  for (int& fd : many) fd = write_end.get();
  uint8_t frame[4] = {0, 0, 0, 0};
  iovec iov{frame, sizeof(frame)};
  alignas(cmsghdr) unsigned char control[CMSG_SPACE(sizeof(many))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(many));
  std::memcpy(CMSG_DATA(cmsg), many, sizeof(many));
  ASSERT_EQ(sendmsg(sockets.a.get(), &msg, 0), 4);

  auto message = ReceiveWithFds(sockets.b.get(), 16, 1);
  EXPECT_EQ(message.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(message.status().message().find("truncated"), std::string::npos)
      << message.status();
  write_end.reset();
  char c;
  EXPECT_EQ(read(read_end.get(), &c, 1), 0);  // nothing leaked
}

TEST(FdPassingTest, OversizedFrameAndPeerClose) {
  SocketPair sockets = MakeSocketPair();
  ASSERT_TRUE(SendWithFds(sockets.a.get(), Bytes("0123456789"), {}).ok());
  EXPECT_EQ(ReceiveWithFds(sockets.b.get(), 4, 0).status().code(),
            absl::StatusCode::kInvalidArgument);

  SocketPair other = MakeSocketPair();
  const uint8_t partial[] = {10, 0, 0, 0, 'a'};  // promises 10, sends 1
  ASSERT_EQ(write(other.a.get(), partial, sizeof(partial)), 5);
  other.a.reset();
  auto message = ReceiveWithFds(other.b.get(), 64, 0);
  EXPECT_EQ(message.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReceiveWithFds(other.b.get(), 64, 0).status().code(),
            absl::StatusCode::kUnavailable);

  const int fds[kMaxPassedFds + 1] = {};
  EXPECT_EQ(SendWithFds(sockets.a.get(), {}, fds).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FdPassingTest, ReceiveTimeoutIsDeadlineExceeded) {
  SocketPair sockets = MakeSocketPair();
  timeval timeout{0, 1000};
  ASSERT_EQ(setsockopt(sockets.b.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout,
                       sizeof(timeout)),
            0);
  EXPECT_EQ(ReceiveWithFds(sockets.b.get(), 64, 0).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

// The daemon's sockets are non-blocking: a frame that comes in pieces is
// still one frame, and a peer that stops halfway is dropped at the timeout.
TEST(FdPassingTest, NonBlockingReceiverWaitsForAFrameInPieces) {
  SocketPair sockets = MakeSocketPair();
  ASSERT_EQ(fcntl(sockets.b.get(), F_SETFL, O_NONBLOCK), 0);
  // What SendWithFds would write for "hello": a 4-byte length, the bytes.
  const std::string frame = std::string("\x05\0\0\0", 4) + "hello";
  const int sender = sockets.a.get();
  std::thread pieces([&] {
    for (size_t at = 0; at < frame.size(); at += 3) {
      usleep(20 * 1000);
      ASSERT_GT(write(sender, frame.data() + at,
                      std::min<size_t>(3, frame.size() - at)),
                0);
    }
  });
  absl::StatusOr<FdMessage> message =
      ReceiveWithFds(sockets.b.get(), 64, 0, /*timeout_ms=*/10000);
  pieces.join();
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(Text(message->payload), "hello");

  ASSERT_EQ(write(sender, frame.data(), 2), 2);
  absl::StatusOr<FdMessage> stalled =
      ReceiveWithFds(sockets.b.get(), 64, 0, /*timeout_ms=*/50);
  EXPECT_EQ(stalled.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(stalled.status().message().find("2 of 4 bytes"), std::string::npos)
      << stalled.status();
}

TEST(FdPassingTest, PeerCredentials) {
  SocketPair sockets = MakeSocketPair();
  auto credentials = ReadPeerCredentials(sockets.a.get());
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ(credentials->pid, getpid());
  EXPECT_EQ(credentials->uid, getuid());
  EXPECT_EQ(credentials->gid, getgid());
  EXPECT_FALSE(ReadPeerCredentials(-1).ok());
}

}  // namespace
}  // namespace lohan
