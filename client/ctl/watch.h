#ifndef LOHAN_CLIENT_CTL_WATCH_H_
#define LOHAN_CLIENT_CTL_WATCH_H_

#include <string>

#include "client/control_client.h"

namespace lohan {

struct WatchOptions {
  double interval_seconds = 2.0;
  int count = 0;      // refreshes, then exit; 0: until interrupted
  bool json = false;  // one GetStatusResponse per line instead of the table
  bool clear = true;  // clear the terminal before each refresh (a tty)
};

// `lohanctl status --watch`: refreshes like top. Per training job: owner,
// step, iteration time (last, mean), SSD read and write rates, its share of
// the optimizer's threads and of the host pool, SSD space set aside, and
// requests queued in each lane; rates are the change between two
// refreshes. Then totals over the jobs shown, and the caller's quota.
// Returns the exit code.
int Watch(ControlClient& client, const WatchOptions& options);

// "jobs 1 of 64, SSD 0 B held of no limit, ...": the caller's quota and
// holdings, for `status` and `status --watch`.
std::string QuotaLine(const v1::QuotaStatus& quota);

}  // namespace lohan

#endif  // LOHAN_CLIENT_CTL_WATCH_H_
