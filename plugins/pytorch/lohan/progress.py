"""A one-line progress display for lohan's long set-up work (writing a new
job's initial states, resuming, saving): on stderr, only when it is a
terminal and the work has already taken a moment; quiet otherwise (logs,
CI, notebooks that capture stderr)."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class Progress:
    def __init__(self, what: str, total_layers: int, total_params: int,
                 stream: Optional[TextIO] = None, after_seconds: float = 1.0,
                 unit: str = "layers"):
        """`unit`: what `total_layers` counts (a save's tensors, say)."""
        self._what = what
        self._unit = unit
        self._layers = total_layers
        self._params = total_params
        self._stream = stream if stream is not None else sys.stderr
        self._after = after_seconds
        self._start = time.monotonic()
        self._done_layers = 0
        self._done_params = 0
        self._shown = False
        isatty = getattr(self._stream, "isatty", None)
        self._enabled = bool(isatty and isatty())

    def advance(self, params: int) -> None:
        """One more layer (unit) of `params` parameters done."""
        self._done_layers += 1
        self._done_params += params
        if not self._enabled:
            return
        elapsed = time.monotonic() - self._start
        if elapsed < self._after and not self._shown:
            return
        rate = self._done_params / elapsed if elapsed > 0 else 0.0
        left = (self._params - self._done_params) / rate if rate > 0 else 0.0
        self._stream.write(
            f"\rlohan: {self._what}: {self._done_layers}/{self._layers} "
            f"{self._unit}, {self._done_params / 1e6:,.0f}/"
            f"{self._params / 1e6:,.0f} M parameters, "
            f"{elapsed:.0f} s, about {left:.0f} s left   ")
        self._stream.flush()
        self._shown = True

    def done(self) -> None:
        if self._shown:
            elapsed = time.monotonic() - self._start
            self._stream.write(
                f"\rlohan: {self._what}: {self._layers} {self._unit}, "
                f"{self._params / 1e6:,.0f} M parameters in {elapsed:.1f} s"
                + " " * 20 + "\n")
            self._stream.flush()
