#ifndef LOHAN_WIRE_ERRNO_STATUS_H_
#define LOHAN_WIRE_ERRNO_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lohan {

// The one place an errno value becomes a Status. The code follows the errno
// (ENOENT -> NOT_FOUND, ENOSPC -> RESOURCE_EXHAUSTED, EIO -> DATA_LOSS...);
// the message is "<context>: <strerror> (errno N)".
absl::Status ErrnoToStatus(int error_number, absl::string_view context);

}  // namespace lohan

#endif  // LOHAN_WIRE_ERRNO_STATUS_H_
