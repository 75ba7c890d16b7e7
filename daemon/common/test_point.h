#ifndef LOHAN_DAEMON_COMMON_TEST_POINT_H_
#define LOHAN_DAEMON_COMMON_TEST_POINT_H_

#include <functional>
#include <string>

#include "absl/strings/string_view.h"

namespace lohan {

// Named points in the daemon's code where an in-process test can run code
// on the thread that reaches them: to hold that thread while the test does
// something at exactly that moment (control the timing of a race instead of
// hoping for it). TestPoint(name) calls the hook installed for `name`, if
// any; with none installed anywhere (lohand) it is one relaxed atomic load.
void TestPoint(absl::string_view name);

// Installs `hook` for `name` while it lives. At most one hook per name.
// The hook runs on the thread that reaches the point, with no lock held by
// this facility; it must not install or remove hooks.
class ScopedTestPointHook {
 public:
  ScopedTestPointHook(std::string name, std::function<void()> hook);
  ~ScopedTestPointHook();
  ScopedTestPointHook(const ScopedTestPointHook&) = delete;
  ScopedTestPointHook& operator=(const ScopedTestPointHook&) = delete;

 private:
  const std::string name_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_COMMON_TEST_POINT_H_
