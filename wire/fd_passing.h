#ifndef LOHAN_WIRE_FD_PASSING_H_
#define LOHAN_WIRE_FD_PASSING_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "wire/unique_fd.h"

namespace lohan {

// Small messages with file descriptors over a connected AF_UNIX stream
// socket (SCM_RIGHTS). Framing: a 4-byte little-endian payload length, then
// the payload; the fds travel with the first byte of the frame.
//
// Both calls block: use a blocking socket, on a thread that may block (set
// SO_RCVTIMEO / SO_SNDTIMEO to bound the wait; a timeout is
// DEADLINE_EXCEEDED). EINTR is retried. Never raises SIGPIPE (MSG_NOSIGNAL).
// After any error the stream may be out of step (part of a frame sent or
// read): close the connection. Thread safety: one sender and one receiver
// per socket at a time.

inline constexpr size_t kMaxPassedFds = 8;
inline constexpr size_t kMaxFdMessageBytes = 64 * 1024;

// Sends `payload` (at most kMaxFdMessageBytes) with up to kMaxPassedFds fds.
// The fds stay owned by the caller (the kernel duplicates them into the
// peer). UNAVAILABLE when the peer has gone; INVALID_ARGUMENT for too many
// fds or too large a payload.
absl::Status SendWithFds(int socket_fd, absl::Span<const uint8_t> payload,
                         absl::Span<const int> fds);

struct FdMessage {
  std::vector<uint8_t> payload;
  std::vector<UniqueFd> fds;  // owned, close-on-exec
};

// Receives one frame. The frame must carry exactly `expected_fds` fds and at
// most `max_payload_bytes` of payload; otherwise (or when the control data
// was truncated, MSG_CTRUNC) it is an error and every fd that did arrive is
// closed. Fds are received with MSG_CMSG_CLOEXEC. UNAVAILABLE when the peer
// closed the connection (also mid-frame); INVALID_ARGUMENT for a frame that
// breaks the rules above (the stream is then out of step: close it).
// A frame may arrive in any number of pieces; on a non-blocking socket the
// call waits for the rest, and DEADLINE_EXCEEDED when the whole frame has
// not come within `timeout_ms` of the call (-1: no limit), so a peer that
// sends a byte and stops holds nothing for long.
absl::StatusOr<FdMessage> ReceiveWithFds(int socket_fd,
                                         size_t max_payload_bytes,
                                         size_t expected_fds,
                                         int timeout_ms = -1);

// The peer of a connected AF_UNIX socket as the kernel saw it at connect()
// time (SO_PEERCRED).
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerCredentials> ReadPeerCredentials(int socket_fd);

}  // namespace lohan

#endif  // LOHAN_WIRE_FD_PASSING_H_
