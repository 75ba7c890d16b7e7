#include "client/plane_closing.h"

#include "absl/status/statusor.h"
#include "wire/fd_passing.h"
#include "wire/plane_notice.h"

namespace lohan {
namespace {

// More frames than a daemon sends before it closes: past them, whatever
// is there is not a notice worth reading.
constexpr int kMaxFramesRead = 16;
// The peer has hung up, so what it sent is all there; this only bounds a
// socket that is, against the rules, still open.
constexpr int kReadTimeoutMs = 100;

}  // namespace

absl::Status DaemonLost() {
  return absl::UnavailableError(
      "lohand closed this job's data plane (the daemon exited, crashed or "
      "restarted, or dropped the session), so the requests in flight got no "
      "answer; whatever was committed is kept: open the job again (in the "
      "plugin lohan.init(..., resume=True)) and it says which iteration the "
      "job is at");
}

absl::Status ClosedStatusFrom(int connection) {
  for (int frame = 0; frame < kMaxFramesRead; ++frame) {
    absl::StatusOr<FdMessage> message =
        ReceiveWithFds(connection, kMaxPlaneNoticeBytes, 0, kReadTimeoutMs);
    if (!message.ok()) return DaemonLost();
    absl::StatusOr<PlaneNotice> notice = DecodePlaneNotice(message->payload);
    if (absl::IsUnimplemented(notice.status())) continue;  // a later kind
    if (!notice.ok()) return DaemonLost();
    return notice->status;
  }
  return DaemonLost();
}

}  // namespace lohan
