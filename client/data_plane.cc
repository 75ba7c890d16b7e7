#include "client/data_plane.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/common/errno_status.h"
#include "daemon/ipc/attach_protocol.h"
#include "daemon/ipc/fd_passing.h"

namespace lohan {

absl::StatusOr<std::unique_ptr<DataPlane>> DataPlane::Open(
    const std::string& data_socket_path, const std::string& job_id) {
  if (job_id.empty() || job_id.size() > kMaxAttachJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job id must be 1 to ", kMaxAttachJobIdBytes, " characters"));
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (data_socket_path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data socket path '", data_socket_path, "' is too long"));
  }
  std::memcpy(address.sun_path, data_socket_path.c_str(),
              data_socket_path.size() + 1);
  UniqueFd connection(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!connection) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  if (connect(connection.get(), reinterpret_cast<const sockaddr*>(&address),
              sizeof(address)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("no lohand data plane at ", data_socket_path, ": ",
                     ErrnoToStatus(errno, "connect").message()));
  }
  if (absl::Status sent =
          SendWithFds(connection.get(), EncodeAttachRequest(job_id), {});
      !sent.ok()) {
    return sent;
  }
  absl::StatusOr<FdMessage> reply =
      ReceiveWithFds(connection.get(), kMaxAttachReplyBytes, 0);
  if (!reply.ok()) return reply.status();
  absl::StatusOr<AttachReply> decoded = DecodeAttachReply(reply->payload);
  if (!decoded.ok()) return decoded.status();
  if (!decoded->daemon_status.ok()) return decoded->daemon_status;

  absl::StatusOr<FdMessage> granted =
      ReceiveWithFds(connection.get(), kArenaGrantBytes, 1);
  if (!granted.ok()) return granted.status();
  absl::StatusOr<ArenaGrant> grant = DecodeArenaGrant(granted->payload);
  if (!grant.ok()) return grant.status();
  void* mapped = mmap(nullptr, grant->arena_bytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED, granted->fds[0].get(), 0);
  if (mapped == MAP_FAILED) {
    return ErrnoToStatus(errno,
                         absl::StrCat("mapping the arena of job ", job_id));
  }
  uint8_t* base = static_cast<uint8_t*>(mapped);
  absl::StatusOr<RingProducer> submissions =
      RingProducer::Attach(base + grant->submission_offset,
                           grant->submission_bytes, kRingEntryBytes);
  absl::StatusOr<RingConsumer> completions =
      RingConsumer::Attach(base + grant->completion_offset,
                           grant->completion_bytes, kRingEntryBytes);
  if (!submissions.ok() || !completions.ok()) {
    munmap(mapped, grant->arena_bytes);
    return !submissions.ok() ? submissions.status() : completions.status();
  }
  return std::unique_ptr<DataPlane>(
      new DataPlane(std::move(connection), base, *grant,
                    *std::move(submissions), *std::move(completions)));
}

void DataPlane::SetErrorText(uint64_t offset, uint64_t bytes) {
  if (offset <= grant_.arena_bytes && bytes <= grant_.arena_bytes - offset &&
      bytes > sizeof(uint64_t)) {
    error_text_offset_ = offset;
    error_text_bytes_ = bytes;
  }
}

absl::Status DataPlane::Submit(const SubmissionEntry& entry,
                               absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<bool> pushed = submissions_.TryPush(&entry);
    if (!pushed.ok()) return pushed.status();
    if (*pushed) return absl::OkStatus();
    if (absl::Status waited = submissions_.WaitForSpace(deadline - absl::Now());
        !waited.ok()) {
      return waited;
    }
  }
}

absl::StatusOr<CompletionEntry> DataPlane::NextCompletion(
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  CompletionEntry completion;
  while (true) {
    absl::StatusOr<bool> popped = completions_.TryPop(&completion);
    if (!popped.ok()) return popped.status();
    if (*popped) return completion;
    if (absl::Status waited =
            completions_.WaitForEntries(deadline - absl::Now());
        !waited.ok()) {
      return waited;
    }
  }
}

absl::Status DataPlane::StatusOf(const CompletionEntry& completion) const {
  if (completion.status_code == 0) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(
      completion.status_code <= 16 ? completion.status_code : 2);
  std::string text = "(no text)";
  if (error_text_bytes_ > 0) {
    const uint8_t* slot = base_ + error_text_offset_;
    uint64_t sequence = 0;
    std::memcpy(&sequence, slot, sizeof(sequence));
    const char* message =
        reinterpret_cast<const char*>(slot + sizeof(sequence));
    text = sequence == completion.detail
               ? std::string(message, strnlen(message, error_text_bytes_ -
                                                           sizeof(sequence)))
               : "(text overwritten by a later error)";
  }
  return absl::Status(code, text);
}

absl::StatusOr<CompletionEntry> DataPlane::Call(SubmissionEntry entry,
                                                absl::Duration timeout) {
  entry.request_id = next_request_id_++;
  if (absl::Status sent = Submit(entry, timeout); !sent.ok()) return sent;
  absl::StatusOr<CompletionEntry> completion = NextCompletion(timeout);
  if (!completion.ok()) return completion.status();
  if (completion->request_id != entry.request_id) {
    return absl::InternalError(absl::StrCat("completion for request ",
                                            completion->request_id,
                                            ", expected ", entry.request_id));
  }
  if (absl::Status status = StatusOf(*completion); !status.ok()) {
    return status;
  }
  return completion;
}

DataPlane::~DataPlane() {
  munmap(base_, grant_.arena_bytes);
  connection_.reset();
}

}  // namespace lohan
