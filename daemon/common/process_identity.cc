#include "daemon/common/process_identity.h"

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace lohan {

absl::StatusOr<ProcessIdentity> IdentifyProcess(pid_t pid) {
  std::ifstream stat_file(absl::StrCat("/proc/", pid, "/stat"));
  std::string text;
  if (pid <= 0 || !std::getline(stat_file, text)) {
    return absl::NotFoundError(absl::StrCat("no process ", pid));
  }
  // The command name (field 2) may hold spaces and parentheses; the fields
  // after the last ')' are plain.
  const size_t name_end = text.rfind(')');
  if (name_end == std::string::npos) {
    return absl::NotFoundError(absl::StrCat("unreadable stat for pid ", pid));
  }
  std::istringstream fields(text.substr(name_end + 2));
  std::string state;
  fields >> state;  // field 3
  if (state == "Z" || state == "X") {
    return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
  }
  std::string skipped;
  for (int field = 4; field < 22; ++field) fields >> skipped;
  ProcessIdentity identity{.pid = pid};
  if (!(fields >> identity.start_ticks)) {
    return absl::NotFoundError(absl::StrCat("unreadable stat for pid ", pid));
  }
  return identity;
}

bool IsRunning(const ProcessIdentity& identity) {
  absl::StatusOr<ProcessIdentity> now = IdentifyProcess(identity.pid);
  return now.ok() && *now == identity;
}

}  // namespace lohan
