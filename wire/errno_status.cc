#include "wire/errno_status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace lohan {
namespace {

absl::StatusCode CodeForErrno(int error_number) {
  switch (error_number) {
    case 0:
      return absl::StatusCode::kOk;
    case ENOENT:
    case ENOTDIR:
    case ESRCH:
      return absl::StatusCode::kNotFound;
    case EEXIST:
    case EADDRINUSE:
      return absl::StatusCode::kAlreadyExists;
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EDQUOT:
    case EFBIG:
      return absl::StatusCode::kResourceExhausted;
    case EINVAL:
    case ENAMETOOLONG:
    case EISDIR:
    case EBADF:
      return absl::StatusCode::kInvalidArgument;
    case EAGAIN:
    case EBUSY:
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case EINTR:
      return absl::StatusCode::kUnavailable;
    case ETIMEDOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case EIO:
      return absl::StatusCode::kDataLoss;
    case ENOSYS:
    case EOPNOTSUPP:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kUnknown;
  }
}

}  // namespace

absl::Status ErrnoToStatus(int error_number, absl::string_view context) {
  if (error_number == 0) return absl::OkStatus();
  return absl::Status(CodeForErrno(error_number),
                      absl::StrCat(context, ": ", std::strerror(error_number),
                                   " (errno ", error_number, ")"));
}

}  // namespace lohan
