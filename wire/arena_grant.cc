#include "wire/arena_grant.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace lohan {
namespace {

void Put(std::vector<uint8_t>* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(uint8_t(value >> (8 * i)));
}

uint64_t Get(absl::Span<const uint8_t> in, size_t at, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{in[at + i]} << (8 * i);
  return value;
}

absl::Status CheckRing(const char* name, uint64_t offset, uint64_t bytes,
                       uint64_t arena_bytes) {
  if (bytes == 0 || offset % 64 != 0 || offset > arena_bytes ||
      arena_bytes - offset < bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arena grant: ", name, " ring [", offset, ", +", bytes,
        ") is misaligned or outside the ", arena_bytes, " byte arena"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<uint8_t> EncodeArenaGrant(const ArenaGrant& grant) {
  std::vector<uint8_t> out;
  out.reserve(kArenaGrantBytes);
  Put(&out, kArenaGrantMagic, 4);
  Put(&out, kArenaGrantVersion, 4);
  Put(&out, grant.arena_bytes, 8);
  Put(&out, grant.submission_offset, 8);
  Put(&out, grant.submission_bytes, 8);
  Put(&out, grant.completion_offset, 8);
  Put(&out, grant.completion_bytes, 8);
  Put(&out, 0, 8);
  Put(&out, 0, 8);
  return out;
}

absl::StatusOr<ArenaGrant> DecodeArenaGrant(absl::Span<const uint8_t> bytes) {
  if (bytes.size() != kArenaGrantBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arena grant of ", bytes.size(), " bytes, want ", kArenaGrantBytes));
  }
  if (Get(bytes, 0, 4) != kArenaGrantMagic) {
    return absl::InvalidArgumentError("arena grant: bad magic");
  }
  if (Get(bytes, 4, 4) != kArenaGrantVersion) {
    return absl::InvalidArgumentError(absl::StrCat("arena grant: version ",
                                                   Get(bytes, 4, 4), ", want ",
                                                   kArenaGrantVersion));
  }
  ArenaGrant grant;
  grant.arena_bytes = Get(bytes, 8, 8);
  grant.submission_offset = Get(bytes, 16, 8);
  grant.submission_bytes = Get(bytes, 24, 8);
  grant.completion_offset = Get(bytes, 32, 8);
  grant.completion_bytes = Get(bytes, 40, 8);
  if (Get(bytes, 48, 8) != 0 || Get(bytes, 56, 8) != 0) {
    return absl::InvalidArgumentError("arena grant: reserved bytes not zero");
  }
  absl::Status status = CheckRing("submission", grant.submission_offset,
                                  grant.submission_bytes, grant.arena_bytes);
  if (!status.ok()) return status;
  status = CheckRing("completion", grant.completion_offset,
                     grant.completion_bytes, grant.arena_bytes);
  if (!status.ok()) return status;
  const bool apart = grant.submission_offset + grant.submission_bytes <=
                         grant.completion_offset ||
                     grant.completion_offset + grant.completion_bytes <=
                         grant.submission_offset;
  if (!apart) {
    return absl::InvalidArgumentError("arena grant: the rings overlap");
  }
  return grant;
}

}  // namespace lohan
