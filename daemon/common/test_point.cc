#include "daemon/common/test_point.h"

#include <atomic>
#include <map>
#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "daemon/common/check.h"

namespace lohan {
namespace {

struct Hooks {
  absl::Mutex mu;
  // shared_ptr: a hook that is running stays alive if it is removed
  // meanwhile.
  std::map<std::string, std::shared_ptr<std::function<void()>>, std::less<>>
      by_name ABSL_GUARDED_BY(mu);
};

std::atomic<int> installed{0};

Hooks& TheHooks() {
  static Hooks hooks;
  return hooks;
}

}  // namespace

void TestPoint(absl::string_view name) {
  if (installed.load(std::memory_order_relaxed) == 0) return;
  std::shared_ptr<std::function<void()>> hook;
  {
    Hooks& hooks = TheHooks();
    absl::MutexLock lock(&hooks.mu);
    auto it = hooks.by_name.find(name);
    if (it == hooks.by_name.end()) return;
    hook = it->second;
  }
  (*hook)();
}

ScopedTestPointHook::ScopedTestPointHook(std::string name,
                                         std::function<void()> hook)
    : name_(std::move(name)) {
  Hooks& hooks = TheHooks();
  absl::MutexLock lock(&hooks.mu);
  const bool added =
      hooks.by_name
          .emplace(name_,
                   std::make_shared<std::function<void()>>(std::move(hook)))
          .second;
  LOHAN_CHECK(added);
  installed.fetch_add(1);
}

ScopedTestPointHook::~ScopedTestPointHook() {
  Hooks& hooks = TheHooks();
  absl::MutexLock lock(&hooks.mu);
  hooks.by_name.erase(name_);
  installed.fetch_sub(1);
}

}  // namespace lohan
