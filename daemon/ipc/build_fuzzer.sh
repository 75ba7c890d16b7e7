#!/usr/bin/env bash
# Builds the libFuzzer binary for EntryValidator and runs it.
#
#   daemon/ipc/build_fuzzer.sh [SECONDS] [WORK_DIR]
#
# SECONDS   how long to fuzz (default 60; 0 = build only)
# WORK_DIR  where the binary, corpus and crash files go
#           (default /tmp/lohan-entry-validator-fuzz)
#
# Uses clang++ with -fsanitize=fuzzer,address,undefined against the system
# Abseil. Exit status: 0 when the run found nothing, libFuzzer's otherwise.
set -euo pipefail

seconds="${1:-60}"
work="${2:-/tmp/lohan-entry-validator-fuzz}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cxx="${CXX:-clang++}"

mkdir -p "$work/corpus" "$work/artifacts"
binary="$work/entry_validator_fuzzer"

"$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$root" \
  "$root/daemon/ipc/entry_validator_fuzz.cc" \
  "$root/daemon/ipc/entry_validator.cc" \
  "$root/daemon/pool/slot_allocator.cc" \
  -labsl_strings -labsl_strings_internal -labsl_str_format_internal \
  -labsl_raw_hash_set -labsl_hash -labsl_city -labsl_low_level_hash \
  -labsl_status -labsl_statusor -labsl_cord -labsl_cordz_info \
  -labsl_cord_internal -labsl_cordz_functions -labsl_cordz_handle \
  -labsl_synchronization -labsl_graphcycles_internal -labsl_time \
  -labsl_civil_time -labsl_time_zone -labsl_stacktrace -labsl_symbolize \
  -labsl_debugging_internal -labsl_demangle_internal -labsl_malloc_internal \
  -labsl_strerror -labsl_throw_delegate -labsl_int128 -labsl_base \
  -labsl_spinlock_wait -labsl_raw_logging_internal -labsl_log_severity \
  -labsl_bad_optional_access -labsl_bad_variant_access -lpthread \
  -o "$binary"
echo "built $binary"

# One well-formed seed: layout, an iteration with every op, end.
python3 - "$work/corpus/seed-valid" <<'PY'
import struct, sys
def e(op, dtype=0, layer=0, rid=1, off=0, length=0, act=0, it=0):
    return struct.pack("<HHIQQQQQ16x", op, dtype, layer, rid, off, length, act, it)
data = bytes([1])
data += e(1, 2, 4, off=0, length=32)
data += e(7, it=0)
data += e(3, layer=0, off=20480, length=4096)
data += e(4, off=28672, length=256, act=1)
data += e(5, off=32768, length=256, act=1)
data += e(6, act=1)
data += e(2, 2, 1, off=4096, length=8192)
data += e(8, it=0)
open(sys.argv[1], "wb").write(data)
# The same with a streamed layout (flag bit 4): slot offsets must be exact.
open(sys.argv[1] + "-streamed", "wb").write(bytes([1 | 16]) + data[1:])
PY

if [[ "$seconds" -gt 0 ]]; then
  cd "$work"
  "$binary" -max_total_time="$seconds" -max_len=4096 -use_value_profile=1 \
    -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/corpus"
fi
