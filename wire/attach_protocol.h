#ifndef LOHAN_WIRE_ATTACH_PROTOCOL_H_
#define LOHAN_WIRE_ATTACH_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "wire/arena_grant.h"

namespace lohan {

// The handshake on a data-plane connection (lohand's "<socket>.data"):
//   client -> daemon  one frame, no fd: the attach request (64 bytes,
//                     little-endian: u32 magic "LATQ", u32 version,
//                     char job_id[48] NUL-padded, u64 reserved = 0).
//   daemon -> client  one frame, no fd: the reply header (u32 magic "LATR",
//                     u32 canonical status code, then on error the message,
//                     at most kMaxAttachMessageBytes of UTF-8).
//   on OK, then       one frame with the arena fd: EncodeArenaGrant(...).
// The connection then stays open for the life of the data plane: when it
// closes (the client exits or dies), the daemon frees the job's arena.
inline constexpr size_t kAttachRequestBytes = 64;
inline constexpr size_t kMaxAttachJobIdBytes = 47;
inline constexpr size_t kMaxAttachMessageBytes = 1024;
inline constexpr size_t kMaxAttachReplyBytes = 8 + kMaxAttachMessageBytes;

std::vector<uint8_t> EncodeAttachRequest(const std::string& job_id);
// INVALID_ARGUMENT for a wrong size, magic or version, a job id that is empty,
// too long, not NUL-terminated, or non-zero reserved bytes.
absl::StatusOr<std::string> DecodeAttachRequest(
    absl::Span<const uint8_t> bytes);

// The message is cut to kMaxAttachMessageBytes.
std::vector<uint8_t> EncodeAttachReply(const absl::Status& status);
// What the daemon answered: OK, or its error code and message.
struct AttachReply {
  absl::Status daemon_status;
};
// INVALID_ARGUMENT when the bytes are not a reply.
absl::StatusOr<AttachReply> DecodeAttachReply(absl::Span<const uint8_t> bytes);

}  // namespace lohan

#endif  // LOHAN_WIRE_ATTACH_PROTOCOL_H_
