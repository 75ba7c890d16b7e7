"""bench/train/disk_busy.py: the counters it reads are the kernel's for the
disk under a directory, and the busy share and rate are worked out from
them as documented."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" /
                       "train"))
from disk_busy import (DiskCounters, busy_between, device_of,  # noqa: E402
                       read_counters)


def test_busy_share_and_rate_from_two_readings() -> None:
    before = DiskCounters(busy_ms=1000, read_bytes=10, written_bytes=20,
                          at=100.0)
    after = DiskCounters(busy_ms=1500, read_bytes=10 + 3 * 10**9,
                         written_bytes=20 + 10**9, at=102.0)
    busy = busy_between(before, after)
    assert busy.busy == pytest.approx(0.25)
    assert busy.bytes_per_busy_second == pytest.approx(8e9)
    idle = busy_between(before, DiskCounters(1000, 10, 20, 101.0))
    assert (idle.busy, idle.bytes_per_busy_second) == (0.0, 0.0)


def test_counts_what_reaches_the_disk_under_a_directory(
        tmp_path: Path) -> None:
    device = device_of(tmp_path)
    if device is None:
        pytest.skip(f"{tmp_path} is on no block device (tmpfs, overlay)")
    before = read_counters(device)
    data = os.urandom(8 << 20)
    path = tmp_path / "written"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    after = read_counters(device)
    # Others may write too, never less: at least our bytes reached it.
    assert after.written_bytes - before.written_bytes >= len(data)
    # (Busy time is kept in jiffies: a fast disk may show none for this.)
    assert after.busy_ms >= before.busy_ms
    assert 0.0 <= busy_between(before, after).busy <= 1.0


def test_an_unknown_device_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="no device"):
        read_counters("no-such-disk")
