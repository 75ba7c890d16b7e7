"""How busy the disk under a directory was over an interval, from the
kernel's own counters (/proc/diskstats): the time it had any request in
flight and the bytes it moved, whoever moved them. A step that keeps the
disk busy all the time, at the speed the disk reaches alone, is as fast as
its SSD traffic allows; one that leaves it idle, or busy but slow, is not.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class DiskCounters:
    busy_ms: int        # time with at least one request in flight
    read_bytes: int
    written_bytes: int
    at: float           # time.monotonic() when read


@dataclass(frozen=True)
class DiskBusy:
    busy: float         # fraction of the interval with a request in flight
    bytes_per_busy_second: float  # read and written, while busy


def device_of(directory: Path) -> Optional[str]:
    """The block device (as /proc/diskstats names it) holding `directory`;
    None where there is none (tmpfs, overlay, a network filesystem)."""
    st_dev = os.stat(directory).st_dev
    link = Path(f"/sys/dev/block/{os.major(st_dev)}:{os.minor(st_dev)}")
    return link.resolve().name if link.exists() else None


def read_counters(device: str) -> DiskCounters:
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()
        # major minor name, then reads completed, merged, sectors read,
        # ms reading, writes completed, merged, sectors written, ms
        # writing, in flight, ms with I/O in flight, ...
        if len(fields) >= 13 and fields[2] == device:
            return DiskCounters(busy_ms=int(fields[12]),
                                read_bytes=int(fields[5]) * 512,
                                written_bytes=int(fields[9]) * 512,
                                at=time.monotonic())
    raise RuntimeError(f"no device {device!r} in /proc/diskstats")


def busy_between(before: DiskCounters, after: DiskCounters) -> DiskBusy:
    seconds = after.at - before.at
    busy_seconds = (after.busy_ms - before.busy_ms) / 1000.0
    moved = (after.read_bytes - before.read_bytes +
             after.written_bytes - before.written_bytes)
    return DiskBusy(busy=min(1.0, busy_seconds / seconds) if seconds > 0
                    else 0.0,
                    bytes_per_busy_second=moved / busy_seconds
                    if busy_seconds > 0 else 0.0)
