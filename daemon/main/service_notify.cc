#include "daemon/main/service_notify.h"

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "wire/errno_status.h"

namespace lohan {

absl::StatusOr<ServiceNotifier> ServiceNotifier::FromEnvironment() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  return For(socket == nullptr ? "" : socket);
}

absl::StatusOr<ServiceNotifier> ServiceNotifier::For(
    const std::string& socket) {
  if (socket.empty()) return ServiceNotifier();
  if (socket[0] != '/' && socket[0] != '@') {
    return absl::InvalidArgumentError(
        absl::StrCat("NOTIFY_SOCKET '", socket,
                     "' is neither an absolute path nor an abstract name"));
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  // A path needs its terminating NUL inside sun_path; an abstract name is
  // exactly its bytes after the leading NUL.
  const size_t limit = sizeof(address.sun_path) - (socket[0] == '/' ? 1 : 0);
  if (socket.size() > limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NOTIFY_SOCKET '", socket, "' is longer than ", limit, " bytes"));
  }
  std::memcpy(address.sun_path, socket.data(), socket.size());
  if (socket[0] == '@') address.sun_path[0] = '\0';
  const socklen_t length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket.size() +
                             (socket[0] == '/' ? 1 : 0));
  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return ErrnoToStatus(errno, "creating the NOTIFY_SOCKET socket");
  }
  return ServiceNotifier(std::move(fd), address, length);
}

absl::Status ServiceNotifier::Notify(absl::string_view state) const {
  if (!enabled()) return absl::OkStatus();
  ssize_t sent;
  do {
    sent =
        sendto(fd_.get(), state.data(), state.size(), MSG_NOSIGNAL,
               reinterpret_cast<const sockaddr*>(&address_), address_length_);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) return ErrnoToStatus(errno, "notifying systemd");
  if (static_cast<size_t>(sent) != state.size()) {
    return absl::InternalError("notifying systemd: a short datagram");
  }
  return absl::OkStatus();
}

std::string StatusLine(absl::string_view text) {
  return absl::StrCat("STATUS=",
                      absl::StrReplaceAll(text, {{"\n", " "}, {"\r", " "}}));
}

absl::StatusOr<absl::Duration> WatchdogInterval(const char* usec,
                                                const char* pid, pid_t self) {
  if (usec == nullptr || *usec == '\0') return absl::ZeroDuration();
  uint64_t microseconds = 0;
  if (!absl::SimpleAtoi(usec, &microseconds) || microseconds == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WATCHDOG_USEC '", usec, "' is not a positive number of microseconds"));
  }
  if (pid != nullptr && *pid != '\0') {
    int64_t target = 0;
    if (!absl::SimpleAtoi(pid, &target) || target <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("WATCHDOG_PID '", pid, "' is not a process id"));
    }
    if (target != self) return absl::ZeroDuration();
  }
  return absl::Microseconds(microseconds);
}

absl::StatusOr<absl::Duration> WatchdogIntervalFromEnvironment() {
  return WatchdogInterval(std::getenv("WATCHDOG_USEC"),
                          std::getenv("WATCHDOG_PID"), getpid());
}

}  // namespace lohan
