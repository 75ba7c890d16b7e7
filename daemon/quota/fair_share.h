#ifndef LOHAN_DAEMON_QUOTA_FAIR_SHARE_H_
#define LOHAN_DAEMON_QUOTA_FAIR_SHARE_H_

// A capacity (the SSD array's space, the host pool) divided among the users
// who are training by their weights ([quotas] weight): each such user's
// share is guaranteed to it. A user may take what is free beyond its share
// (what nobody else wants), but never what another training user's share
// still has free: that stays for that user's next job, data plane or
// swapped activations. A user who is not training reserves nothing.

#include <sys/types.h>

#include <cstdint>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lohan {

struct ShareHolder {
  double weight = 1.0;
  uint64_t held = 0;     // what the user holds now
  bool present = false;  // training: its share is reserved for it
};

// OK when `uid` may hold `bytes` more of `capacity`, of which `held_by_all`
// is held, given every user's holding in `holders` (`uid` included or
// not; a user absent from it holds nothing and is not present). `uid`
// counts as training (present) whatever `holders` says: the other users'
// shares are theirs beside it. Else RESOURCE_EXHAUSTED naming `what`, the
// resource, `uid`'s holding and share and, beyond that share, how much of
// what is free the other training users' shares keep and how much is free
// for `uid`.
absl::Status FitsFairShare(uint64_t capacity, uint64_t held_by_all, uid_t uid,
                           uint64_t bytes,
                           const std::map<uid_t, ShareHolder>& holders,
                           absl::string_view what, absl::string_view resource);

// The most bytes FitsFairShare lets `uid` take more now (same arguments):
// what is free beyond what the other training users' shares keep, or what
// is free up to `uid`'s own share, whichever is more.
uint64_t FairShareRoom(uint64_t capacity, uint64_t held_by_all, uid_t uid,
                       const std::map<uid_t, ShareHolder>& holders);

// `uid`'s share of `capacity` among the present users and `uid` itself,
// by weight.
uint64_t ShareOf(uint64_t capacity, uid_t uid,
                 const std::map<uid_t, ShareHolder>& holders);

}  // namespace lohan

#endif  // LOHAN_DAEMON_QUOTA_FAIR_SHARE_H_
