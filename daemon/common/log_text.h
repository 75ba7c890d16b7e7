#ifndef LOHAN_DAEMON_COMMON_LOG_TEXT_H_
#define LOHAN_DAEMON_COMMON_LOG_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace lohan {

// `untrusted` (text a client sent: a job name, a client name, a refusal
// message that quotes one) as it may go into lohand's log, a reply or a
// field root's tools print: every byte that is not printable ASCII, and
// the backslash, C-escaped (ESC as \x1b, LF as \n, a byte of UTF-8 as
// \xNN), so another user cannot forge log lines or drive an
// administrator's terminal; at most `max_bytes` of it, then "...". The one
// helper for every such string.
std::string LogSafe(absl::string_view untrusted, size_t max_bytes = 256);

}  // namespace lohan

#endif  // LOHAN_DAEMON_COMMON_LOG_TEXT_H_
