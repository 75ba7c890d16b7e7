#include "daemon/ipc/arena_access.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/pool/shared_arena.h"
#include "gtest/gtest.h"
#include "wire/fd_passing.h"
#include "wire/unique_fd.h"

namespace lohan {
namespace {

constexpr uid_t kNobody = 65534;

TEST(AuthorizeArenaAccessTest, Policy) {
  EXPECT_TRUE(AuthorizeArenaAccess(Caller{1000, 5}, 1000).ok());
  EXPECT_TRUE(AuthorizeArenaAccess(Caller{0, 5}, 1000).ok());  // root
  const absl::Status denied = AuthorizeArenaAccess(Caller{1001, 5}, 1000);
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.message().find("uid 1001"), std::string::npos);
  EXPECT_NE(denied.message().find("owned by uid 1000"), std::string::npos);
}

// The daemon side of the hand-over, as the lead will wire it: credentials
// from the socket, the policy, then the fd or a refusal.
void ServeArena(int connection, const SharedArena& arena, uid_t owner) {
  auto peer = ReadPeerCredentials(connection);
  ASSERT_TRUE(peer.ok()) << peer.status();
  const absl::Status allowed =
      AuthorizeArenaAccess(Caller{peer->uid, peer->pid}, owner);
  const std::string reply =
      allowed.ok() ? "ok" : std::string(allowed.message());
  const absl::Span<const uint8_t> payload(
      reinterpret_cast<const uint8_t*>(reply.data()), reply.size());
  const int fds[] = {arena.fd()};
  absl::Status sent = allowed.ok() ? SendWithFds(connection, payload, fds)
                                   : SendWithFds(connection, payload, {});
  ASSERT_TRUE(sent.ok()) << sent;
}

// A child that drops to uid 65534, connects to the abstract socket and
// reports what it got: 0 = mapped the arena and saw the marker, 1 = refused
// (no fd), other = failure.
int NobodyClient(const sockaddr_un& address, socklen_t address_size) {
  if (setresgid(kNobody, kNobody, kNobody) != 0) return 20;
  if (setresuid(kNobody, kNobody, kNobody) != 0) return 21;
  UniqueFd socket_fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!socket_fd.valid()) return 22;
  if (connect(socket_fd.get(), reinterpret_cast<const sockaddr*>(&address),
              address_size) != 0) {
    return 23;
  }
  auto refused = ReceiveWithFds(socket_fd.get(), 1024, 0);
  if (refused.ok()) {
    const std::string text(refused->payload.begin(), refused->payload.end());
    return text.find("may not map") != std::string::npos ? 1 : 24;
  }
  return 25;
}

int NobodyOwnerClient(const sockaddr_un& address, socklen_t address_size) {
  if (setresgid(kNobody, kNobody, kNobody) != 0) return 20;
  if (setresuid(kNobody, kNobody, kNobody) != 0) return 21;
  UniqueFd socket_fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (connect(socket_fd.get(), reinterpret_cast<const sockaddr*>(&address),
              address_size) != 0) {
    return 23;
  }
  auto message = ReceiveWithFds(socket_fd.get(), 1024, 1);
  if (!message.ok()) return 26;
  void* base =
      mmap(nullptr, 1 << 20, PROT_READ, MAP_SHARED, message->fds[0].get(), 0);
  if (base == MAP_FAILED) return 27;
  const bool same = std::memcmp(base, "job memory", 10) == 0;
  munmap(base, 1 << 20);
  return same ? 0 : 28;
}

class ArenaHandOverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (getuid() != 0) GTEST_SKIP() << "needs root to setresuid";
    SharedArena::Options options;
    options.bytes = 1 << 20;
    auto arena = SharedArena::Create(options);
    ASSERT_TRUE(arena.ok()) << arena.status();
    arena_ = std::move(*arena);
    std::memcpy(arena_->base(), "job memory", 10);

    listener_.reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(listener_.valid());
    address_.sun_family = AF_UNIX;
    const std::string name = absl::StrCat("lohan-arena-test-", getpid());
    std::memcpy(address_.sun_path + 1, name.data(), name.size());  // abstract
    address_size_ = offsetof(sockaddr_un, sun_path) + 1 + name.size();
    ASSERT_EQ(bind(listener_.get(), reinterpret_cast<sockaddr*>(&address_),
                   address_size_),
              0);
    ASSERT_EQ(listen(listener_.get(), 4), 0);
  }

  // Forks `client`, serves one connection for a job owned by `owner`,
  // returns the client's exit code.
  int Run(int (*client)(const sockaddr_un&, socklen_t), uid_t owner) {
    const pid_t child = fork();
    if (child == 0) _exit(client(address_, address_size_));
    UniqueFd connection(
        accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    EXPECT_TRUE(connection.valid());
    if (connection.valid()) ServeArena(connection.get(), *arena_, owner);
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::unique_ptr<SharedArena> arena_;
  UniqueFd listener_;
  sockaddr_un address_{};
  socklen_t address_size_ = 0;
};

TEST_F(ArenaHandOverTest, OtherUidIsRefusedTheArena) {
  EXPECT_EQ(Run(&NobodyClient, /*owner=*/1000), 1);
}

TEST_F(ArenaHandOverTest, OwnerGetsTheArena) {
  EXPECT_EQ(Run(&NobodyOwnerClient, /*owner=*/kNobody), 0);
}

}  // namespace
}  // namespace lohan
