#ifndef LOHAN_WIRE_PLANE_NOTICE_H_
#define LOHAN_WIRE_PLANE_NOTICE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lohan {

// A notice from lohand on an open data-plane connection (after the attach
// handshake and the arena grant; wire/attach_protocol.h). One frame
// (wire/fd_passing.h), no fd, little-endian:
//   u32 magic "LNTC", u16 version (1), u16 kind, u16 reason, u16 code,
//   u32 text_bytes, then text_bytes (1..kMaxPlaneNoticeTextBytes) of UTF-8
//   without control characters.
// Kind kClosing: lohand closes the connection right after it, every
// completion of what it ran already in the completion ring; `reason` says
// why and `code` is the canonical status code every request failing because
// of it reports (ClosingCode(reason)), with the text. A client that cannot
// decode a notice (a malformed one) treats the close as the daemon lost.
// Other kinds are reserved for notices that leave the plane open (e.g. a
// request to shrink the arena): a client skips a kind it does not know.
inline constexpr size_t kPlaneNoticeHeaderBytes = 16;
inline constexpr size_t kMaxPlaneNoticeTextBytes = 1024;
inline constexpr size_t kMaxPlaneNoticeBytes =
    kPlaneNoticeHeaderBytes + kMaxPlaneNoticeTextBytes;

enum class PlaneNoticeKind : uint16_t { kClosing = 1 };

enum class ClosingReason : uint16_t {
  // Given way to another user's job within that user's share (of the host
  // pool or the SSD array).
  kGaveWay = 1,
  // `lohanctl drain` or `kill` by the job's owner or root.
  kStopped = 2,
  // lohand is stopping (SIGTERM, its service stopped).
  kDaemonStopping = 3,
};

// ABORTED for kGaveWay and kStopped (the job was asked to give way: open it
// again), UNAVAILABLE for kDaemonStopping (as for a daemon lost).
absl::StatusCode ClosingCode(ClosingReason reason);

// A closing notice; `text` is cut to kMaxPlaneNoticeTextBytes (at a UTF-8
// character's start) and its control characters become spaces.
std::vector<uint8_t> EncodeClosingNotice(ClosingReason reason,
                                         absl::string_view text);

struct PlaneNotice {
  PlaneNoticeKind kind = PlaneNoticeKind::kClosing;
  ClosingReason reason = ClosingReason::kDaemonStopping;
  // Status(ClosingCode(reason), text).
  absl::Status status;
};
// The notice in `bytes` (one frame's payload). UNIMPLEMENTED for a
// well-formed notice of a kind this side does not know (skip it);
// INVALID_ARGUMENT for anything else that is not a notice: a wrong size,
// magic or version, an unknown reason, a code that is not its reason's, an
// empty text, text that is not UTF-8 or holds control characters.
absl::StatusOr<PlaneNotice> DecodePlaneNotice(absl::Span<const uint8_t> bytes);

}  // namespace lohan

#endif  // LOHAN_WIRE_PLANE_NOTICE_H_
