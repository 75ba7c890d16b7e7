#include "wire/attach_protocol.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace lohan {
namespace {

constexpr uint32_t kRequestMagic = 0x5154414c;  // "LATQ"
constexpr uint32_t kReplyMagic = 0x5254414c;    // "LATR"
constexpr uint32_t kAttachVersion = 1;
constexpr size_t kJobIdField = 48;

void PutU32(uint8_t* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint32_t GetU32(const uint8_t* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<uint32_t>(in[i]) << (8 * i);
  return value;
}

}  // namespace

std::vector<uint8_t> EncodeAttachRequest(const std::string& job_id) {
  std::vector<uint8_t> bytes(kAttachRequestBytes, 0);
  PutU32(bytes.data(), kRequestMagic);
  PutU32(bytes.data() + 4, kAttachVersion);
  std::memcpy(bytes.data() + 8, job_id.data(),
              std::min(job_id.size(), kMaxAttachJobIdBytes));
  return bytes;
}

absl::StatusOr<std::string> DecodeAttachRequest(
    absl::Span<const uint8_t> bytes) {
  if (bytes.size() != kAttachRequestBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach request is ", bytes.size(), " bytes, expected ",
                     kAttachRequestBytes));
  }
  if (GetU32(bytes.data()) != kRequestMagic) {
    return absl::InvalidArgumentError("attach request has a bad magic");
  }
  if (GetU32(bytes.data() + 4) != kAttachVersion) {
    return absl::InvalidArgumentError(absl::StrCat("attach request version ",
                                                   GetU32(bytes.data() + 4),
                                                   " is not ", kAttachVersion,
                                                   "; install matching "
                                                   "versions of lohan"));
  }
  const uint8_t* field = bytes.data() + 8;
  const void* nul = std::memchr(field, 0, kJobIdField);
  if (nul == nullptr) {
    return absl::InvalidArgumentError("attach request's job id is too long");
  }
  const size_t length = static_cast<const uint8_t*>(nul) - field;
  for (size_t i = length; i < kJobIdField; ++i) {
    if (field[i] != 0) {
      return absl::InvalidArgumentError(
          "attach request's job id field has bytes after its end");
    }
  }
  for (size_t i = 8 + kJobIdField; i < kAttachRequestBytes; ++i) {
    if (bytes[i] != 0) {
      return absl::InvalidArgumentError(
          "attach request's reserved bytes are not zero");
    }
  }
  if (length == 0) {
    return absl::InvalidArgumentError("attach request names no job");
  }
  return std::string(reinterpret_cast<const char*>(field), length);
}

std::vector<uint8_t> EncodeAttachReply(const absl::Status& status) {
  const size_t message_bytes =
      std::min(status.message().size(), kMaxAttachMessageBytes);
  std::vector<uint8_t> bytes(8 + message_bytes);
  PutU32(bytes.data(), kReplyMagic);
  PutU32(bytes.data() + 4, static_cast<uint32_t>(status.code()));
  std::memcpy(bytes.data() + 8, status.message().data(), message_bytes);
  return bytes;
}

absl::StatusOr<AttachReply> DecodeAttachReply(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < 8 || bytes.size() > kMaxAttachReplyBytes ||
      GetU32(bytes.data()) != kReplyMagic) {
    return absl::InvalidArgumentError("not an attach reply from lohand");
  }
  const uint32_t code = GetU32(bytes.data() + 4);
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach reply carries unknown status code ", code));
  }
  AttachReply reply;
  if (code != 0) {
    reply.daemon_status = absl::Status(
        static_cast<absl::StatusCode>(code),
        absl::string_view(reinterpret_cast<const char*>(bytes.data() + 8),
                          bytes.size() - 8));
  }
  return reply;
}

}  // namespace lohan
