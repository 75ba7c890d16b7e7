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
  "RuntimeDirectory=lohan" "KillSignal=SIGTERM"; do
  grep -q -- "$needed" "$runfiles/deploy/lohand.service" || {
    echo "lohand.service lost '$needed'"
    exit 1
  }
done
grep -q "^d /run/lohan 0755 root root" "$runfiles/deploy/tmpfiles.d/lohan.conf"
echo "PASS: deploy/lohand.service verifies"
