#include "wire/plane_notice.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace lohan {
namespace {

constexpr uint32_t kNoticeMagic = 0x43544e4c;  // "LNTC"
constexpr uint16_t kNoticeVersion = 1;

void PutU16(uint8_t* out, uint16_t value) {
  out[0] = static_cast<uint8_t>(value);
  out[1] = static_cast<uint8_t>(value >> 8);
}

void PutU32(uint8_t* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint16_t GetU16(const uint8_t* in) {
  return static_cast<uint16_t>(in[0] | (in[1] << 8));
}

uint32_t GetU32(const uint8_t* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<uint32_t>(in[i]) << (8 * i);
  return value;
}

// The length of the well-formed UTF-8 character at `in` (at most `left`
// bytes), or 0: a stray continuation byte, a truncated or overlong
// sequence, a surrogate or a code point beyond U+10FFFF.
size_t Utf8CharBytes(const uint8_t* in, size_t left) {
  const uint8_t lead = in[0];
  if (lead < 0x80) return 1;
  size_t length = 0;
  uint32_t code_point = 0;
  if ((lead & 0xe0) == 0xc0) {
    length = 2;
    code_point = lead & 0x1f;
  } else if ((lead & 0xf0) == 0xe0) {
    length = 3;
    code_point = lead & 0x0f;
  } else if ((lead & 0xf8) == 0xf0) {
    length = 4;
    code_point = lead & 0x07;
  } else {
    return 0;
  }
  if (length > left) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((in[i] & 0xc0) != 0x80) return 0;
    code_point = (code_point << 6) | (in[i] & 0x3f);
  }
  static constexpr uint32_t kSmallest[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (code_point < kSmallest[length] || code_point > 0x10ffff ||
      (code_point >= 0xd800 && code_point <= 0xdfff)) {
    return 0;
  }
  return length;
}

bool IsControl(uint8_t byte) { return byte < 0x20 || byte == 0x7f; }

// `text` as a notice carries it: invalid bytes as '?', control characters
// as spaces, cut at a character's start to kMaxPlaneNoticeTextBytes.
std::string NoticeText(absl::string_view text) {
  std::string out;
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t at = 0; at < text.size();) {
    const size_t length = Utf8CharBytes(bytes + at, text.size() - at);
    if (out.size() + std::max<size_t>(length, 1) > kMaxPlaneNoticeTextBytes) {
      break;
    }
    if (length == 0) {
      out.push_back('?');
      ++at;
    } else if (length == 1 && IsControl(bytes[at])) {
      out.push_back(' ');
      ++at;
    } else {
      out.append(text.data() + at, length);
      at += length;
    }
  }
  return out;
}

absl::Status CheckText(absl::Span<const uint8_t> text) {
  if (text.empty()) return absl::InvalidArgumentError("notice has no text");
  for (size_t at = 0; at < text.size();) {
    const size_t length = Utf8CharBytes(text.data() + at, text.size() - at);
    if (length == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("notice text is not UTF-8 at byte ", at));
    }
    if (length == 1 && IsControl(text[at])) {
      return absl::InvalidArgumentError(
          absl::StrCat("notice text has a control character at byte ", at));
    }
    at += length;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusCode ClosingCode(ClosingReason reason) {
  switch (reason) {
    case ClosingReason::kGaveWay:
    case ClosingReason::kStopped:
      return absl::StatusCode::kAborted;
    case ClosingReason::kDaemonStopping:
      return absl::StatusCode::kUnavailable;
  }
  return absl::StatusCode::kUnavailable;
}

std::vector<uint8_t> EncodeClosingNotice(ClosingReason reason,
                                         absl::string_view text) {
  const std::string carried = NoticeText(text);
  std::vector<uint8_t> bytes(kPlaneNoticeHeaderBytes + carried.size());
  PutU32(bytes.data(), kNoticeMagic);
  PutU16(bytes.data() + 4, kNoticeVersion);
  PutU16(bytes.data() + 6, static_cast<uint16_t>(PlaneNoticeKind::kClosing));
  PutU16(bytes.data() + 8, static_cast<uint16_t>(reason));
  PutU16(bytes.data() + 10, static_cast<uint16_t>(ClosingCode(reason)));
  PutU32(bytes.data() + 12, static_cast<uint32_t>(carried.size()));
  std::copy(carried.begin(), carried.end(),
            bytes.begin() + kPlaneNoticeHeaderBytes);
  return bytes;
}

absl::StatusOr<PlaneNotice> DecodePlaneNotice(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kPlaneNoticeHeaderBytes ||
      bytes.size() > kMaxPlaneNoticeBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a notice of ", bytes.size(), " bytes"));
  }
  if (GetU32(bytes.data()) != kNoticeMagic) {
    return absl::InvalidArgumentError("not a notice from lohand (bad magic)");
  }
  if (GetU16(bytes.data() + 4) != kNoticeVersion) {
    return absl::InvalidArgumentError(absl::StrCat("notice version ",
                                                   GetU16(bytes.data() + 4),
                                                   " is not ", kNoticeVersion));
  }
  const uint32_t text_bytes = GetU32(bytes.data() + 12);
  if (text_bytes != bytes.size() - kPlaneNoticeHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("notice says ", text_bytes, " bytes of text but has ",
                     bytes.size() - kPlaneNoticeHeaderBytes));
  }
  const absl::Span<const uint8_t> text = bytes.subspan(kPlaneNoticeHeaderBytes);
  if (absl::Status checked = CheckText(text); !checked.ok()) return checked;
  const uint16_t kind = GetU16(bytes.data() + 6);
  if (kind != static_cast<uint16_t>(PlaneNoticeKind::kClosing)) {
    return absl::UnimplementedError(
        absl::StrCat("a notice of kind ", kind, " this client does not know"));
  }
  const uint16_t reason = GetU16(bytes.data() + 8);
  if (reason < static_cast<uint16_t>(ClosingReason::kGaveWay) ||
      reason > static_cast<uint16_t>(ClosingReason::kDaemonStopping)) {
    return absl::InvalidArgumentError(
        absl::StrCat("closing notice with unknown reason ", reason));
  }
  PlaneNotice notice;
  notice.reason = static_cast<ClosingReason>(reason);
  const absl::StatusCode code = ClosingCode(notice.reason);
  if (GetU16(bytes.data() + 10) != static_cast<uint16_t>(code)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "closing notice for reason ", reason, " carries code ",
        GetU16(bytes.data() + 10), ", not ", static_cast<int>(code)));
  }
  notice.status = absl::Status(
      code, absl::string_view(reinterpret_cast<const char*>(text.data()),
                              text.size()));
  return notice;
}

}  // namespace lohan
