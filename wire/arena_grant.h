#ifndef LOHAN_WIRE_ARENA_GRANT_H_
#define LOHAN_WIRE_ARENA_GRANT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace lohan {

// The payload the daemon sends with a job's arena fd (SendWithFds, one fd):
// how big the arena is and where in it the two rings live. Fixed 64-byte
// little-endian encoding:
//   u32 magic "LGNT", u32 version, u64 arena_bytes,
//   u64 submission_offset, u64 submission_bytes,
//   u64 completion_offset, u64 completion_bytes, u64 reserved[2] (0).
// Decoding checks everything a client (or a daemon reading it back in a test)
// relies on: both rings inside the arena, 64-byte aligned, not overlapping.
struct ArenaGrant {
  uint64_t arena_bytes = 0;
  uint64_t submission_offset = 0;  // ring client -> daemon (SubmissionEntry)
  uint64_t submission_bytes = 0;
  uint64_t completion_offset = 0;  // ring daemon -> client (CompletionEntry)
  uint64_t completion_bytes = 0;

  bool operator==(const ArenaGrant&) const = default;
};

inline constexpr uint32_t kArenaGrantMagic = 0x544e474c;  // "LGNT"
inline constexpr uint32_t kArenaGrantVersion = 1;
inline constexpr size_t kArenaGrantBytes = 64;

std::vector<uint8_t> EncodeArenaGrant(const ArenaGrant& grant);

// INVALID_ARGUMENT for a wrong size, magic or version, or rings that are
// misaligned, outside the arena or overlapping.
absl::StatusOr<ArenaGrant> DecodeArenaGrant(absl::Span<const uint8_t> bytes);

}  // namespace lohan

#endif  // LOHAN_WIRE_ARENA_GRANT_H_
