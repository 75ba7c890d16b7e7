"""lohan.progress: once the work has taken a moment, a progress line on a
terminal; otherwise log lines (the `lohan.progress` logger at INFO, or plain
lines on the stream when logging would not show INFO) at most
every so often and one at the end, never one per layer. The clock is the
test's: nothing sleeps. The last test saves a real engine's checkpoint
(lohand) with the thresholds at 0 and reads its log lines."""

from __future__ import annotations

import functools
import io
import logging
from typing import List

import pytest
import torch
from torch import nn

import lohan
from lohan import weights
from lohan.progress import Progress

LOGGER = "lohan.progress"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    """Seconds as the test sets them."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def messages(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.INFO]


def test_a_terminal_sees_the_layers_and_the_end(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    out = Terminal()
    progress = Progress("writing the initial states", 3, 3_000_000,
                        stream=out, after_seconds=0.0)
    for _ in range(3):
        progress.advance(1_000_000)
    progress.done()
    text = out.getvalue()
    assert "\rlohan: writing the initial states: 1/3 layers" in text
    assert "3/3 layers, 3/3 M parameters" in text
    assert text.endswith("\n") and "3 M parameters in" in text
    assert messages(caplog) == []  # a terminal has the display, no logs


def test_a_terminal_waits_as_before_with_the_clock(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    out, clock = Terminal(), Clock()
    progress = Progress("saving to ckpt", 4, 4_000_000, stream=out,
                        after_seconds=1.0, clock=clock)
    clock.now += 0.5
    progress.advance(1_000_000)
    assert out.getvalue() == ""
    clock.now += 1.0
    progress.advance(1_000_000)
    assert out.getvalue().startswith(
        "\rlohan: saving to ckpt: 2/4 layers, 2/4 M parameters, 2 s, "
        "about 2 s left")
    # Shown once: every further layer rewrites the line, whatever the time.
    progress.advance(1_000_000)
    progress.advance(1_000_000)
    assert out.getvalue().count("\r") == 3
    clock.now += 0.5
    progress.done()
    assert out.getvalue().endswith(
        "\rlohan: saving to ckpt: 4 layers, 4 M parameters in 2.0 s"
        + " " * 20 + "\n")
    assert messages(caplog) == []


def test_quiet_on_a_terminal_when_quick(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    stream = Terminal()
    progress = Progress("saving", 2, 10, stream=stream, after_seconds=3600.0)
    progress.advance(5)
    progress.advance(5)
    progress.done()
    assert stream.getvalue() == ""
    assert messages(caplog) == []


def test_not_a_terminal_logs_at_the_interval_and_at_the_end(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    stream, clock = io.StringIO(), Clock()
    progress = Progress("saving to ckpt", 100, 100_000_000, stream=stream,
                        after_seconds=1.0, log_every_seconds=10.0,
                        clock=clock)
    # 0.25 s a layer: before 1 s nothing, then a line at most every 10 s.
    logged_at = []
    for layer in range(100):
        clock.now += 0.25
        before = len(messages(caplog))
        progress.advance(1_000_000)
        if len(messages(caplog)) > before:
            logged_at.append(layer + 1)
    assert logged_at == [4, 44, 84]  # 1 s, 11 s, 21 s in
    lines = messages(caplog)
    assert lines[0] == ("lohan: saving to ckpt: 4/100 layers, 4/100 M "
                        "parameters, 1 s, about 24 s left")
    assert lines[1].startswith("lohan: saving to ckpt: 44/100 layers, "
                               "44/100 M parameters, 11 s")
    clock.now += 0.5
    progress.done()
    assert messages(caplog)[-1] == ("lohan: saving to ckpt: done, 100 "
                                    "layers, 100 M parameters in 25.5 s")
    assert len(messages(caplog)) == 4
    assert stream.getvalue() == ""  # nothing on the stream itself


def test_not_a_terminal_and_quick_logs_nothing(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    progress = Progress("saving", 2, 10, stream=io.StringIO(),
                        after_seconds=1.0, clock=clock)
    clock.now += 0.4
    progress.advance(5)
    clock.now += 0.4
    progress.advance(5)
    progress.done()
    assert messages(caplog) == []


def test_a_long_last_layer_still_gets_the_final_line(caplog):
    """No line while the layers went quickly, but the whole took longer
    than after_seconds: the final line says so."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    progress = Progress("loading ckpt", 2, 2_000_000, stream=io.StringIO(),
                        after_seconds=1.0, unit="tensors", clock=clock)
    progress.advance(1_000_000)
    clock.now += 30.0
    progress.advance(1_000_000)
    progress.done()
    assert messages(caplog) == [
        "lohan: loading ckpt: 2/2 tensors, 2/2 M parameters, 30 s, about "
        "0 s left",
        "lohan: loading ckpt: done, 2 tensors, 2 M parameters in 30.0 s"]


def test_without_logging_set_up_the_lines_go_to_the_stream(caplog):
    """A batch job that never configured logging (INFO not shown) still
    sees the lines, plainly, on stderr."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    stream, clock = io.StringIO(), Clock()
    progress = Progress("saving to ckpt", 2, 2_000_000, stream=stream,
                        after_seconds=1.0, clock=clock)
    clock.now += 2.0
    progress.advance(1_000_000)
    progress.advance(1_000_000)  # within 10 s of the last line: none
    progress.done()
    assert stream.getvalue().splitlines() == [
        "lohan: saving to ckpt: 1/2 layers, 1/2 M parameters, 2 s, about "
        "2 s left",
        "lohan: saving to ckpt: done, 2 layers, 2 M parameters in 2.0 s"]
    assert messages(caplog) == []


def test_a_percent_in_the_name_is_not_a_format(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    progress = Progress("saving to 100%s", 1, 1, stream=io.StringIO(),
                        after_seconds=0.0)
    progress.advance(1)
    progress.done()
    assert [m.split(":")[1] for m in messages(caplog)] == [
        " saving to 100%s", " saving to 100%s"]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def test_a_real_save_logs_its_progress(lohand, tmp_path, monkeypatch,
                                       caplog):
    """engine.save through lohand, stderr not a terminal (pytest's capture),
    thresholds at 0: a line per layer here (every one is due) and the
    final line, on the lohan.progress logger."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    monkeypatch.setattr(weights, "Progress", functools.partial(
        Progress, stream=io.StringIO(), after_seconds=0.0,
        log_every_seconds=0.0))
    torch.manual_seed(0)
    model = Net()
    with lohan.init(model, lr=1e-3, socket=lohand.socket,
                    job_name="progress") as engine:
        layers = len(engine.layers)
        caplog.clear()
        engine.save(tmp_path / "ckpt")
    lines = messages(caplog)
    target = tmp_path / "ckpt"
    assert lines[0].startswith(f"lohan: saving to {target}: 1/{layers} "
                               "layers"), lines
    assert len(lines) == layers + 1, lines
    assert lines[-1].startswith(f"lohan: saving to {target}: done, "
                                f"{layers} layers, 0 M parameters in "), lines
