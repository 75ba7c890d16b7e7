#ifndef LOHAN_CLIENT_DATA_PLANE_H_
#define LOHAN_CLIENT_DATA_PLANE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/common/unique_fd.h"
#include "daemon/ipc/arena_grant.h"
#include "daemon/ipc/ring.h"
#include "daemon/ipc/ring_entry.h"

namespace lohan {

// The client's end of a job's data plane: the job's shared-memory arena,
// mapped into this process, and the connection whose life bounds it (the
// daemon frees the arena when the connection closes).
// Thread-compatible: one owner.
class DataPlane {
 public:
  // Connects to `data_socket_path` (HelloResponse.data_socket_path) and asks
  // for `job_id`'s arena. The daemon's refusal comes back as its status
  // (e.g. PERMISSION_DENIED for another user's job, FAILED_PRECONDITION when
  // this process has not attached the job); UNAVAILABLE when no daemon
  // answers there.
  static absl::StatusOr<std::unique_ptr<DataPlane>> Open(
      const std::string& data_socket_path, const std::string& job_id);

  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;
  // Unmaps the arena and closes the connection.
  ~DataPlane();

  // Where the daemon writes the text of failed requests
  // (RegisterModelResponse.error_text_offset/bytes).
  void SetErrorText(uint64_t offset, uint64_t bytes);

  // Puts `entry` on the submission ring, waiting up to `timeout` for room.
  absl::Status Submit(const SubmissionEntry& entry, absl::Duration timeout);
  // The next completion, waiting up to `timeout` (DEADLINE_EXCEEDED).
  absl::StatusOr<CompletionEntry> NextCompletion(absl::Duration timeout);
  // OK, or the completion's error with the daemon's text.
  absl::Status StatusOf(const CompletionEntry& completion) const;
  // Submit, then wait for its completion (REQUIRES: nothing else in
  // flight); the completion, or its error.
  absl::StatusOr<CompletionEntry> Call(SubmissionEntry entry,
                                       absl::Duration timeout);

  uint8_t* arena() const { return base_; }
  uint64_t arena_bytes() const { return grant_.arena_bytes; }
  const ArenaGrant& grant() const { return grant_; }

 private:
  DataPlane(UniqueFd connection, uint8_t* base, ArenaGrant grant,
            RingProducer submissions, RingConsumer completions)
      : connection_(std::move(connection)),
        base_(base),
        grant_(grant),
        submissions_(std::move(submissions)),
        completions_(std::move(completions)) {}

  UniqueFd connection_;
  uint8_t* base_;
  const ArenaGrant grant_;
  RingProducer submissions_;
  RingConsumer completions_;
  uint64_t error_text_offset_ = 0;
  uint64_t error_text_bytes_ = 0;
  uint64_t next_request_id_ = 1;
};

}  // namespace lohan

#endif  // LOHAN_CLIENT_DATA_PLANE_H_
