"""Shared fixtures: a real lohand started from Bazel's outputs.

Binaries come from $LOHAN_BAZEL_BIN (scripts/test sets it to `bazel info
bazel-bin`), defaulting to the repo's bazel-bin. A missing binary fails the
test with the build command to run; it never skips.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugins" / "pytorch"))
BAZEL_BIN = Path(os.environ.get("LOHAN_BAZEL_BIN", REPO / "bazel-bin"))
os.environ.setdefault("LOHAN_BAZEL_BIN", str(BAZEL_BIN))


def built(relative: str) -> Path:
    path = BAZEL_BIN / relative
    if not path.exists():
        pytest.fail(f"{path} is missing: run `bazel build //...` first "
                    "(scripts/test does)")
    return path


class Daemon:
    def __init__(self, directory: Path, host_pool: str = "64MiB",
                 ssd_capacity: str = "64MiB",
                 optimizer_tuning: str = "default",
                 extra_args: Sequence[str] = ()):
        self.directory = directory
        self.socket = str(directory / "lohand.sock")
        (directory / "ssd0").mkdir(exist_ok=True)
        self.log_path = directory / "lohand.log"
        # A daemon restarted on the same directory: the killed one's socket
        # file would pass for the new one's before it listens.
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                [str(built("daemon/main/lohand")), "--socket", self.socket,
                 "--state-dir", str(directory / "state"), "--ssd-path",
                 str(directory / "ssd0"), "--ssd-capacity", ssd_capacity,
                 "--host-pool-size", host_pool, "--profile-probe", "4MiB",
                 # The default tuning, not seconds of timing at each of
                 # the suite's many starts (test_optimizer_tuning.py
                 # times it).
                 "--optimizer-tuning", optimizer_tuning,
                 "--log-level", "debug", *extra_args],
                stdout=log, stderr=subprocess.STDOUT)
        # Only bounds a hung start; a healthy daemon answers in milliseconds.
        # The socket file appears when it is bound, a moment before it
        # listens: wait until a connection is taken.
        deadline = time.monotonic() + 60
        while not self._accepts():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("lohand did not start: " + self.log())
            time.sleep(0.01)

    def _accepts(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(self.socket)
            except OSError:
                return False
        return True

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=60)


def arena_bytes(socket_path: str, layer_elements: Sequence[int],
                dtype: str = "bf16", stream_buffers: int = 0,
                activation_bytes: int = 0) -> int:
    """The arena the daemon at `socket_path` sizes for a model of these
    layers with `stream_buffers` shared buffers of each kind (0: one per
    layer), as a job it creates and deletes at once."""
    from lohan.client import Client
    from lohan.model_spec import ModelSpec
    spec = ModelSpec(layer_elements=list(layer_elements), dtype=dtype,
                     grad_slots=stream_buffers, weight_slots=stream_buffers,
                     activation_bytes=activation_bytes)
    with Client(socket_path) as client:
        job, sizing = client.create_job_for_model(
            f"sizing-{os.getpid()}-{time.monotonic_ns()}", spec)
        client.delete_job(job.id)
    return sizing.arena_bytes


@pytest.fixture
def lohand():
    with tempfile.TemporaryDirectory(prefix="lohan-pytest-") as directory:
        daemon = Daemon(Path(directory))
        try:
            yield daemon
        finally:
            daemon.stop(signal.SIGKILL)
