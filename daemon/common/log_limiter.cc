#include "daemon/common/log_limiter.h"

namespace lohan {

std::optional<uint64_t> LogLimiter::Admit(absl::string_view key,
                                          absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto found = windows_.find(key);
  if (found == windows_.end()) {
    if (windows_.size() >= kMaxKeys) windows_.clear();
    found = windows_.emplace(std::string(key), Window{.start = now}).first;
  }
  Window& window = found->second;
  if (now - window.start >= window_) {
    window.start = now;
    window.logged = 0;
  }
  if (window.logged >= burst_) {
    ++window.dropped;
    return std::nullopt;
  }
  ++window.logged;
  const uint64_t dropped = window.dropped;
  window.dropped = 0;
  return dropped;
}

}  // namespace lohan
