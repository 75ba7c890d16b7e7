"""Progress of lohan's long client-side work (writing a new job's initial
states, resuming, loading, saving), once the work has taken a moment: on a
terminal, a one-line display on stderr, rewritten as the work goes on; when
stderr is not a terminal (Slurm, nohup, CI, notebooks that capture it), log
lines instead, at most one every `log_every_seconds` and one when done
(never one per layer): through the `lohan.progress` logger at INFO when
the program's logging shows INFO, else as plain lines on stderr."""

from __future__ import annotations

import logging
import sys
import time
from typing import Callable, Optional, TextIO

logger = logging.getLogger(__name__)


class Progress:
    def __init__(self, what: str, total_layers: int, total_params: int,
                 stream: Optional[TextIO] = None, after_seconds: float = 1.0,
                 unit: str = "layers", log_every_seconds: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        """`unit`: what `total_layers` counts (a save's tensors, say).
        `after_seconds`: nothing is shown or logged before the work has
        taken that long. `log_every_seconds`: when `stream` is not a
        terminal, the least time between two log lines. `clock`: seconds,
        monotonic (tests pass their own)."""
        self._what = what
        self._unit = unit
        self._layers = total_layers
        self._params = total_params
        self._stream = stream if stream is not None else sys.stderr
        self._after = after_seconds
        self._log_every = log_every_seconds
        self._clock = clock
        self._start = clock()
        self._done_layers = 0
        self._done_params = 0
        self._shown = False
        self._logged_at: Optional[float] = None
        isatty = getattr(self._stream, "isatty", None)
        self._terminal = bool(isatty and isatty())

    def advance(self, params: int) -> None:
        """One more layer (unit) of `params` parameters done."""
        self._done_layers += 1
        self._done_params += params
        elapsed = self._clock() - self._start
        if self._terminal:
            if elapsed < self._after and not self._shown:
                return
            self._stream.write(f"\r{self._status(elapsed)}   ")
            self._stream.flush()
            self._shown = True
            return
        if elapsed < self._after:
            return
        if (self._logged_at is not None
                and elapsed - self._logged_at < self._log_every):
            return
        self._log(self._status(elapsed))
        self._logged_at = elapsed

    def done(self) -> None:
        """The work is over: the display's last line, or (not a terminal)
        the closing log line when the work took `after_seconds` or more."""
        elapsed = self._clock() - self._start
        if self._terminal:
            if self._shown:
                self._stream.write(
                    f"\rlohan: {self._what}: {self._layers} {self._unit}, "
                    f"{self._params / 1e6:,.0f} M parameters in "
                    f"{elapsed:.1f} s" + " " * 20 + "\n")
                self._stream.flush()
            return
        if self._logged_at is not None or elapsed >= self._after:
            self._log(f"lohan: {self._what}: done, {self._layers} "
                      f"{self._unit}, {self._params / 1e6:,.0f} M "
                      f"parameters in {elapsed:.1f} s")

    def _log(self, line: str) -> None:
        """A log line: through `logger` when the program has logging set
        up to show it, else as a plain line on the stream (a batch job's
        stderr shows it without any set-up)."""
        if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
            logger.info("%s", line)
        else:
            self._stream.write(line + "\n")
            self._stream.flush()

    def _status(self, elapsed: float) -> str:
        """Where the work stands, `elapsed` seconds in."""
        rate = self._done_params / elapsed if elapsed > 0 else 0.0
        left = (self._params - self._done_params) / rate if rate > 0 else 0.0
        return (f"lohan: {self._what}: {self._done_layers}/{self._layers} "
                f"{self._unit}, {self._done_params / 1e6:,.0f}/"
                f"{self._params / 1e6:,.0f} M parameters, "
                f"{elapsed:.0f} s, about {left:.0f} s left")
