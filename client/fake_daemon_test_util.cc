#include "client/fake_daemon_test_util.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

#include "gtest/gtest.h"
#include "wire/fd_passing.h"
#include "wire/unique_fd.h"

namespace lohan {

FakeDaemon::FakeDaemon(uint32_t capacity, bool echo) : echo_(echo) {
  fd_ = memfd_create("fake-arena", MFD_CLOEXEC);
  EXPECT_GE(fd_, 0);
  EXPECT_EQ(ftruncate(fd_, kArenaBytes), 0);
  base_ = Map();
  grant_.arena_bytes = kArenaBytes;
  grant_.submission_offset = kSubmissionOffset;
  grant_.submission_bytes = RingBytes(capacity, kRingEntryBytes);
  grant_.completion_offset = kCompletionOffset;
  grant_.completion_bytes = RingBytes(capacity, kRingEntryBytes);
  EXPECT_TRUE(FormatRing(base_ + kSubmissionOffset, grant_.submission_bytes,
                         capacity, kRingEntryBytes)
                  .ok());
  EXPECT_TRUE(FormatRing(base_ + kCompletionOffset, grant_.completion_bytes,
                         capacity, kRingEntryBytes)
                  .ok());
  submissions_.emplace(*RingConsumer::Attach(
      base_ + kSubmissionOffset, grant_.submission_bytes, kRingEntryBytes));
  completions_.emplace(*RingProducer::Attach(
      base_ + kCompletionOffset, grant_.completion_bytes, kRingEntryBytes));
  int ends[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends), 0);
  ours_ = ends[0];
  theirs_ = ends[1];
  server_ = std::thread([this] { Serve(); });
}

FakeDaemon::~FakeDaemon() {
  Stop();
  munmap(base_, kArenaBytes);
  close(fd_);
  if (ours_ >= 0) close(ours_);
}

std::unique_ptr<DataPlane> FakeDaemon::Plane() {
  auto plane = DataPlane::Adopt(UniqueFd(theirs_), Map(), grant_);
  EXPECT_TRUE(plane.ok()) << plane.status();
  theirs_ = -1;
  (*plane)->SetErrorText(kErrorOffset, kErrorBytes);
  return *std::move(plane);
}

std::vector<SubmissionEntry> FakeDaemon::Take(size_t n) {
  absl::MutexLock lock(&mu_);
  auto enough = [&] { return held_.size() >= n; };
  EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), kPatience))
      << "only " << held_.size() << " of " << n << " submissions came";
  std::vector<SubmissionEntry> taken;
  while (taken.size() < n && !held_.empty()) {
    taken.push_back(held_.front());
    held_.pop_front();
  }
  return taken;
}

void FakeDaemon::Answer(const SubmissionEntry& entry, uint64_t detail,
                        uint32_t flags, uint64_t arena_asked) {
  CompletionEntry completion{};
  completion.request_id = entry.request_id;
  completion.detail = detail;
  completion.flags = flags;
  completion.arena_asked = arena_asked;
  Push(completion);
}

void FakeDaemon::Fail(const SubmissionEntry& entry, absl::StatusCode code,
                      std::string_view text) {
  CompletionEntry completion{};
  completion.request_id = entry.request_id;
  completion.status_code = static_cast<uint32_t>(code);
  absl::MutexLock lock(&push_mu_);
  completion.detail = ++error_sequence_;
  WriteErrorText(base_ + kErrorOffset, kErrorBytes, error_sequence_, text);
  PushLocked(completion);
}

void FakeDaemon::HangUp() {
  close(ours_);
  ours_ = -1;
}

void FakeDaemon::Say(const std::vector<uint8_t>& payload) {
  EXPECT_TRUE(SendWithFds(ours_, payload, {}).ok());
}

void FakeDaemon::Stop() {
  stop_.store(true);
  if (server_.joinable()) server_.join();
}

uint8_t* FakeDaemon::Map() {
  void* mapped =
      mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  EXPECT_NE(mapped, MAP_FAILED);
  return static_cast<uint8_t*>(mapped);
}

void FakeDaemon::Serve() {
  SubmissionEntry entry;
  while (!stop_.load()) {
    absl::StatusOr<bool> popped = submissions_->TryPop(&entry);
    ASSERT_TRUE(popped.ok()) << popped.status();
    if (!*popped) {
      (void)submissions_->WaitForEntries(absl::Milliseconds(10));
      continue;
    }
    served_.fetch_add(1);
    if (echo_) {
      Answer(entry, entry.activation_id);
    } else {
      absl::MutexLock lock(&mu_);
      held_.push_back(entry);
    }
  }
}

void FakeDaemon::Push(const CompletionEntry& completion) {
  absl::MutexLock lock(&push_mu_);
  PushLocked(completion);
}

void FakeDaemon::PushLocked(const CompletionEntry& completion) {
  while (true) {
    absl::StatusOr<bool> pushed = completions_->TryPush(&completion);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    if (*pushed) return;
    (void)completions_->WaitForSpace(absl::Milliseconds(10));
  }
}

}  // namespace lohan
