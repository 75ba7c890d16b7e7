#include "daemon/main/watchdog.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace lohan {

std::unique_ptr<Watchdog> Watchdog::Start(absl::Duration interval, Check alive,
                                          Ping ping) {
  std::unique_ptr<Watchdog> watchdog(
      new Watchdog(interval, std::move(alive), std::move(ping)));
  watchdog->thread_ = std::thread([self = watchdog.get()] { self->Loop(); });
  return watchdog;
}

Watchdog::Watchdog(absl::Duration interval, Check alive, Ping ping)
    : period_(interval / 2),
      deadline_(interval / 4),
      alive_(std::move(alive)),
      ping_(std::move(ping)) {}

Watchdog::~Watchdog() { Stop(); }

void Watchdog::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t Watchdog::pings() const {
  absl::MutexLock lock(&mu_);
  return pings_;
}

void Watchdog::Loop() {
  // Monotonic: a step of the wall clock must neither skip nor delay a ping.
  using Clock = std::chrono::steady_clock;
  const auto wait_until =
      [this](Clock::time_point until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                             absl::FromChrono(until - Clock::now()));
      };
  uint64_t failures = 0;
  while (true) {
    const Clock::time_point started = Clock::now();
    const absl::Status alive = alive_(deadline_);
    const absl::Duration took = absl::FromChrono(Clock::now() - started);
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (alive.ok() && took <= deadline_) {
      // Logged before the ping: whoever sees the ping finds the line.
      if (failures > 0) {
        spdlog::info("watchdog: alive again after {} failed checks", failures);
      }
      ping_();
      ++pings_;
      failures = 0;
      // The next check a period after this one started; Stop wakes it.
      wait_until(started + absl::ToChronoNanoseconds(period_));
      if (stopping_) return;
    } else {
      // Logged each time: systemd stops the daemon after a few of them.
      ++failures;
      spdlog::error(
          "watchdog: not pinging systemd: the liveness check {} after {}{}",
          alive.ok() ? "answered too late" : "failed",
          absl::FormatDuration(took),
          alive.ok() ? "" : absl::StrCat(": ", alive.message()));
      // Not at once: a check that fails fast would spin.
      wait_until(started + absl::ToChronoNanoseconds(deadline_));
      if (stopping_) return;
    }
  }
}

}  // namespace lohan
