#ifndef LOHAN_DAEMON_MAIN_WATCHDOG_H_
#define LOHAN_DAEMON_MAIN_WATCHDOG_H_

#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lohan {

// systemd's watchdog fed only while lohand works: a thread of its own runs
// `alive` every interval/2 and pings (WATCHDOG=1) after each check that
// passes, never on a timer alone. `alive` gets interval/4 to answer, so
// between two pings of a daemon that answers in time lie at most 3/4 of the
// interval; a check that fails or overruns sends nothing (and is logged),
// the next starts interval/4 after it began, and systemd, hearing nothing
// for the interval, stops the daemon. A stopped (SIGSTOP) or deadlocked lohand
// thus goes unpinged. The check's deadline is its own to keep (the thread waits
// for it; a check that never returns holds up Stop).
class Watchdog {
 public:
  using Check = std::function<absl::Status(absl::Duration deadline)>;
  using Ping = std::function<void()>;

  // Starts the thread; the first check runs at once.
  // REQUIRES: interval > 0; `alive` and `ping` may be called until Stop
  // returns.
  static std::unique_ptr<Watchdog> Start(absl::Duration interval, Check alive,
                                         Ping ping);

  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog();  // Stop()

  // Wakes the thread, waits for a check under way and joins it; nothing is
  // checked or pinged after it returns. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Pings sent so far (for tests and the shutdown log).
  uint64_t pings() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Watchdog(absl::Duration interval, Check alive, Ping ping);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const absl::Duration period_;    // between the starts of two checks
  const absl::Duration deadline_;  // a check's time to answer
  const Check alive_;
  const Ping ping_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t pings_ ABSL_GUARDED_BY(mu_) = 0;

  std::thread thread_;  // joined by Stop
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_MAIN_WATCHDOG_H_
