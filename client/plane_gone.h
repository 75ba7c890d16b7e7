#ifndef LOHAN_CLIENT_PLANE_GONE_H_
#define LOHAN_CLIENT_PLANE_GONE_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace lohan {

// What a call that needs the job's data plane returns once a move to
// another arena (share_move.h) closed the plane and could not open it again:
// FAILED_PRECONDITION, its text starting with `what`, saying what to do.
inline absl::Status PlaneGoneError(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      what,
      ": the job has no data plane: it was closed to move to another arena "
      "and opening it again failed; open the job again (resume): it keeps "
      "its committed iterations"));
}

}  // namespace lohan

#endif  // LOHAN_CLIENT_PLANE_GONE_H_
