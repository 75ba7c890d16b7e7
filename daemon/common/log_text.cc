#include "daemon/common/log_text.h"

#include "absl/strings/str_format.h"

namespace lohan {

std::string LogSafe(absl::string_view untrusted, size_t max_bytes) {
  const absl::string_view kept = untrusted.substr(0, max_bytes);
  std::string shown;
  shown.reserve(kept.size() + 3);
  for (char c : kept) {
    const unsigned char byte = static_cast<unsigned char>(c);
    switch (c) {
      case '\\':
        shown += "\\\\";
        break;
      case '\n':
        shown += "\\n";
        break;
      case '\r':
        shown += "\\r";
        break;
      case '\t':
        shown += "\\t";
        break;
      default:
        if (byte >= 0x20 && byte < 0x7f) {
          shown.push_back(c);
        } else {
          absl::StrAppendFormat(&shown, "\\x%02x", byte);
        }
    }
  }
  if (untrusted.size() > max_bytes) shown += "...";
  return shown;
}

}  // namespace lohan
