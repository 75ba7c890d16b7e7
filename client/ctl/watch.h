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

// "2 threads, kernel avx512+bf16, prefetch=256,stream=on,chunks=16
// (calibrated 2026-12-01 22:40 UTC: 1.05x the default)": the optimizer
// and where its kernel and tuning come from, for `status`.
std::string OptimizerLine(const v1::OptimizerStatus& optimizer);

// "arena 6.0 MiB of the 18.0 MiB its job asks for (what the pool had free
// when the plane opened)", or in place of the parenthesis why lohand last
// asked it to change (SessionStatus.arena_note): a session granted less
// than its job's arena, for `status`; then "moving to a 9.0 MiB arena at
// its next iteration's end" while lohand asks it to move; "" when it has
// its job's arena and nothing is asked.
std::string ArenaLine(const v1::SessionStatus& session);

// "plan: case 3, predicted 1.23 s/iteration (bound by SSDs / device
// compute), measured 1.31 s over 12 iterations (1.07x); blocks: 10
// offload, 2 mixed": a session's activation plan (PlanJob) against the
// iterations since, for `status`; "" when the session has no plan.
std::string PlanLine(const v1::SessionStatus& session);

// "states 3.7 GB: 3.7 GB in RAM (share 6.5 GB), 0 B on the SSDs only; SSD
// 0.02 read, 12.0 written B/param/iteration": where a session's optimizer
// states are (the state tier's copies), the last durable iteration when
// later ones are in RAM only (ModelSpec.commit_interval), and what its
// iterations moved through the SSDs since it attached, for `status`; ""
// before its model is registered.
std::string StatesLine(const v1::SessionStatus& session);

}  // namespace lohan

#endif  // LOHAN_CLIENT_CTL_WATCH_H_
