#!/bin/bash
# Checks deploy/lohand.service with systemd-analyze verify, with ExecStart
# pointed at the lohand just built (the installed path does not exist here).
set -euo pipefail
if ! command -v systemd-analyze >/dev/null; then
  echo "SKIPPED: systemd-analyze is not installed"
  exit 0
fi
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
lohand="$runfiles/daemon/main/lohand"
unit_dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/unit.XXXXXX")
sed "s|/usr/local/bin/lohand|$lohand|" "$runfiles/deploy/lohand.service" \
  >"$unit_dir/lohand.service"
grep -q "^ExecStart=$lohand --config /etc/lohan/lohand.toml$" \
  "$unit_dir/lohand.service"
output=$(systemd-analyze verify "$unit_dir/lohand.service" 2>&1) || {
  echo "systemd-analyze verify failed:"
  echo "$output"
  exit 1
}
if [ -n "$output" ]; then
  echo "systemd-analyze verify complained:"
  echo "$output"
  exit 1
fi
# The options the daemon cannot run without are still there.
for needed in "LimitMEMLOCK=infinity" "CAP_IPC_LOCK" "@aio" "@memlock" \
  "RuntimeDirectory=lohan" "KillSignal=SIGTERM" "^Type=notify$" \
  "^NotifyAccess=main$" "^WatchdogSec=[1-9]"; do
  grep -q -- "$needed" "$runfiles/deploy/lohand.service" || {
    echo "lohand.service lost '$needed'"
    exit 1
  }
done
grep -q "^d /run/lohan 0755 root root" "$runfiles/deploy/tmpfiles.d/lohan.conf"

# The system calls lohand makes must pass the unit's SystemCallFilter
# (expanded through nested groups), or systemd would kill it with EPERM.
expand() {
  systemd-analyze syscall-filter --no-pager "$1" 2>/dev/null | sed 1d |
    grep -v '^ *#' | awk '{print $1}' | while read -r member; do
      case "$member" in
        @*) expand "$member" ;;
        "") ;;
        *) echo "$member" ;;
      esac
    done
}
allowed=$(mktemp "${TEST_TMPDIR:-/tmp}/allowed.XXXXXX")
for group in $(sed -n 's/^SystemCallFilter=//p' "$runfiles/deploy/lohand.service"); do
  expand "$group"
done | sort -u >"$allowed"
for call in memfd_create fcntl mmap mlock munlock ftruncate fallocate \
  io_setup io_destroy io_submit io_getevents pread64 pwrite64 fdatasync \
  fsync futex eventfd2 poll ppoll epoll_wait accept4 getsockopt \
  sendmsg recvmsg flock rename sched_setaffinity rt_sigtimedwait statfs \
  socket connect sendto; do
  grep -qx "$call" "$allowed" || {
    echo "lohand.service's SystemCallFilter blocks $call, which lohand uses"
    exit 1
  }
done
echo "PASS: deploy/lohand.service verifies"
