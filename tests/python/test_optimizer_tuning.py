"""lohand's optimizer kernel choice, started for real: `[optimizer] tuning
= "auto"` times the candidate kernels on the daemon's own threads at its
first start, caches the choice in the state directory and reports it in
`lohanctl status`; a configured tuning is used as given and a bad one is
refused. Whatever the tuning, training gives the same bits."""

from __future__ import annotations

import copy
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

import lohan
import torch

from conftest import Daemon, built
from test_engine import (assert_fp32_close, batches, engine_for, tiny_gpt,
                         train_lohan, train_torch)

TUNING = re.compile(r"^prefetch=\d+,stream=(on|off),chunks=\d+$")


def optimizer_status(daemon: Daemon) -> dict:
    """What lohand says of its optimizer, once it serves: a first start
    times the kernels before it answers (its socket is bound before), for
    longer than a client's 10 s deadline on a busy machine."""
    deadline = time.monotonic() + 120
    while True:
        try:
            with lohan.Client(daemon.socket) as client:
                return client.status()["optimizer"]
        except lohan.LohanError as error:
            if (error.code != lohan.StatusCode.UNAVAILABLE
                    or time.monotonic() > deadline):
                raise


def test_auto_times_the_kernels_once_and_reports_the_choice(tmp_path: Path):
    daemon = Daemon(tmp_path, optimizer_tuning="auto",
                    extra_args=["--optimizer-threads", "2"])
    try:
        first = optimizer_status(daemon)
        text = subprocess.run(
            [str(built("client/ctl/lohanctl")), "--socket", daemon.socket,
             "status"], check=True, capture_output=True, text=True).stdout
    finally:
        daemon.stop()
    assert first["source"] == "calibrated", first
    assert TUNING.match(first["tuning"]), first
    calibration = first["calibration"]
    assert calibration["tuning"] == first["tuning"]
    assert calibration["isa"] in ("avx512", "avx2", "scalar")
    assert first["kernel"].startswith(calibration["isa"])
    # Every candidate timed, the choice the fastest over both cases.
    candidates = calibration["candidates"]
    assert len(candidates) >= 16
    total = {(c["isa"], c["tuning"]):
             1 / c["fp32_parameters_per_second"] + 1 / c["bf16_parameters_per_second"]
             for c in candidates}
    assert min(total, key=total.get) == (calibration["isa"],
                                         calibration["tuning"])
    # The uncalibrated default (timed first) over the choice, as measured.
    default = (candidates[0]["isa"], candidates[0]["tuning"])
    chosen = (calibration["isa"], calibration["tuning"])
    assert calibration["speedup_over_default"] == pytest.approx(
        total[default] / total[chosen], rel=1e-9)
    line = next(l for l in text.splitlines() if "optimizer " in l)
    assert "2 threads" in line and first["tuning"] in line, line
    assert "calibrated" in line and "the default" in line, line
    assert "timing the optimizer kernels" in daemon.log()

    # The next start on the same state directory takes the cached choice.
    again = Daemon(tmp_path, optimizer_tuning="auto",
                   extra_args=["--optimizer-threads", "2"])
    try:
        second = optimizer_status(again)
    finally:
        again.stop()
    assert second["source"] == "calibrated earlier", second
    assert second["tuning"] == first["tuning"]
    assert second["calibration"]["measured_unix_seconds"] == (
        calibration["measured_unix_seconds"])
    assert again.log().count("timing the optimizer kernels") == 1

    # --reprofile times them again.
    third = Daemon(tmp_path, optimizer_tuning="auto",
                   extra_args=["--optimizer-threads", "2", "--reprofile"])
    try:
        assert optimizer_status(third)["source"] == "calibrated"
    finally:
        third.stop()


def test_a_configured_tuning_is_used_as_given(tmp_path: Path):
    daemon = Daemon(tmp_path, optimizer_tuning="chunks=4, prefetch=0")
    try:
        status = optimizer_status(daemon)
    finally:
        daemon.stop()
    assert status["source"] == "configured"
    assert status["tuning"] == "prefetch=0,stream=on,chunks=4"
    assert "calibration" not in status
    assert "timing the optimizer kernels" not in daemon.log()


def test_a_bad_tuning_is_refused_naming_the_flag(tmp_path: Path):
    result = subprocess.run(
        [str(built("daemon/main/lohand")), "--socket",
         str(tmp_path / "s.sock"), "--state-dir", str(tmp_path / "state"),
         "--ssd-path", str(tmp_path), "--optimizer-tuning",
         "prefetch=lots"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "flag --optimizer-tuning" in output, output
    assert "prefetch=lots" in output and "auto" in output, output


def test_training_gives_the_same_bits_under_another_tuning(tmp_path: Path):
    """The daemon's default tuning and one that moves memory as differently
    as the candidates allow (no prefetch, no streaming stores, long
    per-thread runs on two threads): the same weights bit for bit, and
    both match torch's AdamW."""
    reference = tiny_gpt()
    data = batches(4)
    torch_model = copy.deepcopy(reference)
    ref_losses = train_torch(torch_model, data)
    trained = {}
    for name, tuning in (("default", "default"),
                         ("other", "prefetch=0,stream=off,chunks=16")):
        directory = tmp_path / name
        directory.mkdir()
        daemon = Daemon(directory, optimizer_tuning=tuning,
                        extra_args=["--optimizer-threads", "2"])
        model = copy.deepcopy(reference)
        try:
            with engine_for(model, daemon, job_name=name) as engine:
                losses = train_lohan(engine, model, data)
                trained[name] = (losses, engine.master_weights())
        finally:
            daemon.stop(signal.SIGKILL)
        assert_fp32_close(model, torch_model, losses, ref_losses)
    (losses_a, weights_a), (losses_b, weights_b) = trained.values()
    assert losses_a == losses_b
    for key, value in weights_a.items():
        assert torch.equal(value, weights_b[key]), key
