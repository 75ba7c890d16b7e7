#ifndef LOHAN_DAEMON_RPC_ENDED_JOB_SWEEPER_H_
#define LOHAN_DAEMON_RPC_ENDED_JOB_SWEEPER_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/jobs/job_registry.h"
#include "daemon/quota/space_ledger.h"
#include "daemon/session/session_manager.h"
#include "daemon/store/tensor_store.h"

namespace lohan {

// [jobs] keep_ended: a thread that deletes, every SweepInterval, the jobs
// the registry says are due (JobRegistry::Expired: no process attached for
// keep_ended, not pinned), as DeleteJob would, and logs each deletion with
// what it freed. Never a job a process is attached to (the registry checks
// again as it deletes) nor one whose data plane is still open (a plane may
// outlive its job's attachment: it goes at a later pass, once closed).
class EndedJobSweeper {
 public:
  struct Options {
    // Borrowed; each must outlive the sweeper.
    JobRegistry* jobs = nullptr;
    SessionManager* sessions = nullptr;
    TensorStore* store = nullptr;
    SpaceLedger* ledger = nullptr;
    // Told each deleted job's id (the fair queues forget its flow); may be
    // empty.
    std::function<void(const std::string& job_id)> job_deleted;
    // The registry's keep_ended (> 0), for the log.
    absl::Duration keep_ended = absl::ZeroDuration();
  };

  // How often the thread looks: a tenth of keep_ended, from a second to a
  // minute (a job goes at most that long after it is due).
  static absl::Duration SweepInterval(absl::Duration keep_ended);

  // Starts the thread. REQUIRES: options.keep_ended > 0, the parts set.
  static std::unique_ptr<EndedJobSweeper> Start(Options options);

  EndedJobSweeper(const EndedJobSweeper&) = delete;
  EndedJobSweeper& operator=(const EndedJobSweeper&) = delete;
  // Stops and joins the thread.
  ~EndedJobSweeper();

  // Stops and joins the thread (a pass under way finishes first).
  // Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // One pass: deletes the jobs due at `now`; how many it deleted.
  size_t SweepOnce(absl::Time now);

 private:
  explicit EndedJobSweeper(Options options);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const Options options_;
  const absl::Duration interval_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_RPC_ENDED_JOB_SWEEPER_H_
