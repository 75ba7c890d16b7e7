#ifndef LOHAN_DAEMON_COMMON_LOG_LIMITER_H_
#define LOHAN_DAEMON_COMMON_LOG_LIMITER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lohan {

// Keeps a flood of one kind of log line (a client refused a thousand times
// a second) from filling the log: per key, at most `burst` lines per
// `window`; the first line let through after some were held back says how
// many. Thread-safe.
class LogLimiter {
 public:
  LogLimiter(int burst, absl::Duration window)
      : burst_(burst), window_(window) {}

  // nullopt: drop this line. Otherwise log it, with the number of lines of
  // this key dropped since the last one logged (0: none).
  std::optional<uint64_t> Admit(absl::string_view key,
                                absl::Time now = absl::Now())
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Window {
    absl::Time start;
    int logged = 0;
    uint64_t dropped = 0;
  };
  // Keys are kinds of lines, not values from clients: few, and bounded.
  static constexpr size_t kMaxKeys = 256;

  const int burst_;
  const absl::Duration window_;
  absl::Mutex mu_;
  std::map<std::string, Window, std::less<>> windows_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_COMMON_LOG_LIMITER_H_
