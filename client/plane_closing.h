#ifndef LOHAN_CLIENT_PLANE_CLOSING_H_
#define LOHAN_CLIENT_PLANE_CLOSING_H_

#include "absl/status/status.h"

namespace lohan {

// Why a data plane closed, as every request failing because of it reports
// it. lohand says why when it closes a plane from its side: a closing
// notice (wire/plane_notice.h) is the last frame before its end of the
// connection closes. Its status is ABORTED when the job gave way to
// another user's share or was stopped (`lohanctl drain` / `kill`) and
// UNAVAILABLE when lohand is stopping, with lohand's text (who for, which
// iteration the job keeps, what to do).

// A connection lost without a word (the daemon exited, crashed or
// restarted): UNAVAILABLE.
absl::Status DaemonLost();

// Reads what is left on `connection` (the data-plane socket, whose peer
// has hung up: the reads never wait) and returns the closing notice's
// status; frames of kinds this client does not know are skipped. Without a
// notice, or with anything that is not one (a malformed frame, a notice
// that does not decode), DaemonLost().
absl::Status ClosedStatusFrom(int connection);

}  // namespace lohan

#endif  // LOHAN_CLIENT_PLANE_CLOSING_H_
