#ifndef LOHAN_CLIENT_FAKE_DAEMON_TEST_UTIL_H_
#define LOHAN_CLIENT_FAKE_DAEMON_TEST_UTIL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/data_plane.h"
#include "wire/arena_grant.h"
#include "wire/ring.h"
#include "wire/ring_entry.h"

namespace lohan {

// Plays lohand in the test's process: owns a memfd arena (mapped twice: its
// own view and the one the DataPlane adopts), formats the rings, reads
// submissions on a thread. With `echo`, answers each at once (detail = its
// activation_id); otherwise keeps them for Take() and the test answers with
// Answer/Fail. Failed expectations (gtest) are reported, not thrown.
class FakeDaemon {
 public:
  // The arena: the rings, the error text area, then free bytes from
  // kFreeOffset on for whatever the test lays out there.
  static constexpr uint64_t kArenaBytes = 1 << 20;
  static constexpr uint64_t kSubmissionOffset = 0;
  static constexpr uint64_t kCompletionOffset = 256 << 10;
  static constexpr uint64_t kErrorOffset = 512 << 10;
  static constexpr uint64_t kErrorBytes =
      kErrorTextRecords * kErrorTextRecordBytes;
  static constexpr uint64_t kFreeOffset = kErrorOffset + kErrorBytes;
  // How long Take waits for submissions.
  static constexpr absl::Duration kPatience = absl::Seconds(30);

  explicit FakeDaemon(uint32_t capacity = 64, bool echo = false);
  ~FakeDaemon();

  // The client's end: a DataPlane over the second mapping, its error texts
  // at kErrorOffset. Once per daemon.
  std::unique_ptr<DataPlane> Plane();

  // The next `n` submissions, in ring order, waiting for them to arrive.
  std::vector<SubmissionEntry> Take(size_t n);

  // `arena_asked`: an ITER_END's ask to move (CompletionEntry).
  void Answer(const SubmissionEntry& entry, uint64_t detail, uint32_t flags = 0,
              uint64_t arena_asked = 0);

  // As lohand does: the text into the error area, then the completion.
  void Fail(const SubmissionEntry& entry, absl::StatusCode code,
            std::string_view text);

  // The daemon's process dies: its end of the connection closes.
  void HangUp();
  // Sends `payload` as one frame on its end of the connection (as lohand
  // sends a closing notice before it hangs up).
  void Say(const std::vector<uint8_t>& payload);

  void Stop();

  uint64_t served() const { return served_.load(); }
  // The daemon's view of the arena (the same bytes as the plane's).
  uint8_t* base() const { return base_; }

 private:
  uint8_t* Map();
  void Serve();
  void Push(const CompletionEntry& completion);
  void PushLocked(const CompletionEntry& completion)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);

  const bool echo_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  ArenaGrant grant_;
  int ours_ = -1, theirs_ = -1;
  std::optional<RingConsumer> submissions_;  // the server thread's
  absl::Mutex push_mu_;
  std::optional<RingProducer> completions_ ABSL_GUARDED_BY(push_mu_);
  uint64_t error_sequence_ ABSL_GUARDED_BY(push_mu_) = 0;
  absl::Mutex mu_;
  std::deque<SubmissionEntry> held_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> served_{0};
  std::thread server_;
};

}  // namespace lohan

#endif  // LOHAN_CLIENT_FAKE_DAEMON_TEST_UTIL_H_
