#include "daemon/common/process_identity.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "wire/errno_status.h"

namespace lohan {
namespace {

// /proc/<pid>/stat, or why not. The errno tells a missing process (ENOENT,
// ESRCH) from a daemon that cannot look now (EMFILE, ENFILE, ENOMEM, ...).
absl::StatusOr<std::string> ReadStat(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  int error = errno;
  std::string text;
  if (fd >= 0) {
    char buffer[1024];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof(buffer))) != 0) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;
      text.append(buffer, static_cast<size_t>(n));
    }
    error = n < 0 ? errno : 0;
    close(fd);
  }
  if (fd >= 0 && error == 0) return text;
  if (error == ENOENT || error == ESRCH) {
    return absl::NotFoundError(absl::StrCat("no process ", pid));
  }
  return absl::UnavailableError(
      ErrnoToStatus(error, absl::StrCat("reading ", path)).message());
}

}  // namespace

absl::StatusOr<ProcessIdentity> IdentifyProcess(pid_t pid) {
  if (pid <= 0) return absl::NotFoundError(absl::StrCat("no process ", pid));
  absl::StatusOr<std::string> text = ReadStat(pid);
  if (!text.ok()) return text.status();
  // The command name (field 2) may hold spaces and parentheses; the fields
  // after the last ')' are plain.
  const size_t name_end = text->rfind(')');
  if (name_end == std::string::npos || name_end + 2 > text->size()) {
    return absl::NotFoundError(absl::StrCat("unreadable stat for pid ", pid));
  }
  std::istringstream fields(text->substr(name_end + 2));
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

ProcessState CheckRunning(const ProcessIdentity& identity) {
  absl::StatusOr<ProcessIdentity> now = IdentifyProcess(identity.pid);
  if (absl::IsUnavailable(now.status())) return ProcessState::kUnknown;
  return now.ok() && *now == identity ? ProcessState::kRunning
                                      : ProcessState::kGone;
}

}  // namespace lohan
