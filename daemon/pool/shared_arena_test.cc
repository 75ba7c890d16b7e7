#include "daemon/pool/shared_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace lohan {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

SharedArena::Options Small(uint64_t bytes = kMiB) {
  SharedArena::Options options;
  options.name = "arena-test";
  options.bytes = bytes;
  return options;
}

TEST(SharedArenaTest, CreatesSealedLockedSharedMapping) {
  auto arena = SharedArena::Create(Small());
  ASSERT_TRUE(arena.ok()) << arena.status();
  SharedArena& a = **arena;
  EXPECT_EQ(a.size(), kMiB);
  EXPECT_TRUE(a.locked());
  ASSERT_NE(a.base(), nullptr);
  ASSERT_GE(a.fd(), 0);

  // Close-on-exec.
  EXPECT_TRUE(fcntl(a.fd(), F_GETFD) & FD_CLOEXEC);

  // Sealed against shrink, grow and further sealing.
  const int seals = fcntl(a.fd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(ftruncate(a.fd(), kMiB / 2), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(a.fd(), 2 * kMiB), 0);
  EXPECT_NE(fcntl(a.fd(), F_ADD_SEALS, F_SEAL_WRITE), 0);

  // A second mapping of the fd sees the same bytes (what a client does).
  std::memset(a.base(), 0, a.size());
  std::memcpy(a.base() + 4096, "lohan", 5);
  void* other =
      mmap(nullptr, a.size(), PROT_READ | PROT_WRITE, MAP_SHARED, a.fd(), 0);
  ASSERT_NE(other, MAP_FAILED);
  EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(other) + 4096, "lohan", 5), 0);
  static_cast<uint8_t*>(other)[a.size() - 1] = 0x5a;
  EXPECT_EQ(a.base()[a.size() - 1], 0x5a);
  munmap(other, a.size());
}

TEST(SharedArenaTest, RefusesBadSizes) {
  EXPECT_EQ(SharedArena::Create(Small(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SharedArena::Create(Small(4097)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SharedArenaTest, HugePageRequestFallsBackOrSucceeds) {
  // 2 MiB: huge pages are tried; without any, normal pages are used.
  auto arena = SharedArena::Create(Small(2 * kMiB));
  ASSERT_TRUE(arena.ok()) << arena.status();
  (*arena)->base()[0] = 1;
  (*arena)->base()[2 * kMiB - 1] = 1;
}

TEST(SharedArenaTest, UnlockedArenaWhenAsked) {
  SharedArena::Options options = Small();
  options.lock_in_ram = false;
  auto arena = SharedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_FALSE((*arena)->locked());
}

// In a child without CAP_IPC_LOCK and a 64 KiB RLIMIT_MEMLOCK, locking 1 MiB
// fails with RESOURCE_EXHAUSTED naming the size and the limit.
TEST(SharedArenaTest, MlockFailureIsResourceExhausted) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipe_fds[0]);
    rlimit limit{64 * 1024, 64 * 1024};
    if (setrlimit(RLIMIT_MEMLOCK, &limit) != 0) _exit(10);
    if (getuid() == 0 && setresuid(65534, 65534, 65534) != 0) _exit(11);
    auto arena = SharedArena::Create(Small());
    std::string report =
        arena.ok()
            ? std::string("ok")
            : std::string(absl::StatusCodeToString(arena.status().code())) +
                  "|" + std::string(arena.status().message());
    if (write(pipe_fds[1], report.data(), report.size()) < 0) _exit(12);
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string report;
  char buffer[512];
  ssize_t n;
  while ((n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) {
    report.append(buffer, n);
  }
  close(pipe_fds[0]);
  int wait_status = 0;
  ASSERT_EQ(waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFEXITED(wait_status));
  ASSERT_EQ(WEXITSTATUS(wait_status), 0);
  EXPECT_EQ(report.rfind("RESOURCE_EXHAUSTED|", 0), 0u) << report;
  EXPECT_NE(report.find("1.0 MiB"), std::string::npos) << report;
  EXPECT_NE(report.find("RLIMIT_MEMLOCK"), std::string::npos) << report;
}

}  // namespace
}  // namespace lohan
