#ifndef LOHAN_DAEMON_MAIN_SERVICE_NOTIFY_H_
#define LOHAN_DAEMON_MAIN_SERVICE_NOTIFY_H_

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "wire/unique_fd.h"

namespace lohan {

// systemd's service notification protocol (sd_notify(3)), spoken without
// libsystemd: each notification is one datagram of "KEY=VALUE" lines sent to
// the unix socket that $NOTIFY_SOCKET names (a path, or an abstract name
// written with a leading '@'). systemd reads the sender's credentials from
// the kernel, so with NotifyAccess=main any thread of lohand may send.
// A notifier made with no socket sends nothing: every Notify is a no-op.
// Thread-safe (one sendto per notification on a socket of its own).
class ServiceNotifier {
 public:
  // The notifier $NOTIFY_SOCKET asks for; a disabled one when it is unset
  // or empty. INVALID_ARGUMENT when it names no unix socket this protocol
  // can reach (relative path, too long for sockaddr_un, another address
  // family such as "vsock:").
  static absl::StatusOr<ServiceNotifier> FromEnvironment();
  // The notifier for `socket` ("/path" or "@abstract"); disabled when empty.
  static absl::StatusOr<ServiceNotifier> For(const std::string& socket);

  ServiceNotifier() = default;  // disabled
  ServiceNotifier(ServiceNotifier&&) = default;
  ServiceNotifier& operator=(ServiceNotifier&&) = default;
  ServiceNotifier(const ServiceNotifier&) = delete;
  ServiceNotifier& operator=(const ServiceNotifier&) = delete;

  bool enabled() const { return fd_.valid(); }

  // Sends `state`, newline-separated "KEY=VALUE" lines (e.g. "READY=1\n
  // STATUS=serving"), in one datagram. OK without sending when disabled;
  // the errno's status when the datagram cannot be sent (nobody listens).
  absl::Status Notify(absl::string_view state) const;

 private:
  ServiceNotifier(UniqueFd fd, sockaddr_un address, socklen_t length)
      : fd_(std::move(fd)), address_(address), address_length_(length) {}

  UniqueFd fd_;
  sockaddr_un address_{};
  socklen_t address_length_ = 0;
};

// One "STATUS=" line's text: newlines (which would start another
// assignment) become spaces.
std::string StatusLine(absl::string_view text);

// The interval systemd's watchdog expects pings within, from
// $WATCHDOG_USEC and $WATCHDOG_PID as sd_watchdog_enabled(3) reads them:
// zero when the watchdog is off (WATCHDOG_USEC unset or empty) or meant for
// another process (WATCHDOG_PID set to a pid other than `self`);
// INVALID_ARGUMENT when a value is not a positive decimal number.
absl::StatusOr<absl::Duration> WatchdogInterval(const char* usec,
                                                const char* pid, pid_t self);
// The same from this process's environment and pid.
absl::StatusOr<absl::Duration> WatchdogIntervalFromEnvironment();

}  // namespace lohan

#endif  // LOHAN_DAEMON_MAIN_SERVICE_NOTIFY_H_
