"""Data-plane rings of 8 entries (lohand --ring-entries 8): a 16-block
model with a gradient buffer per layer hands its 18 layers' gradients over
without waiting and spills every block input to the SSDs in small pieces,
many more requests than the rings hold. The client waits for room instead
of stalling, and training gives torch AdamW's results (clipped) and, bit
for bit, the run with the default rings."""

from __future__ import annotations

import copy
import signal
from pathlib import Path
from typing import Dict, List, Tuple

import torch

import lohan
from conftest import Daemon
from test_engine import (TinyGPT, assert_fp32_close, batches, engine_for,
                         train_lohan, train_torch)

BLOCKS = 16
MAX_NORM = 0.5


def _train(tmp_path: Path, entries: int, model: torch.nn.Module,
           data: torch.Tensor) -> Tuple[List[float], Dict[str, torch.Tensor],
                                        dict]:
    directory = tmp_path / f"rings-{entries}"
    directory.mkdir()
    daemon = Daemon(directory, host_pool="64MiB", ssd_capacity="256MiB",
                    extra_args=["--ring-entries", str(entries)])
    try:
        engine = engine_for(model, daemon, job_name=f"rings-{entries}",
                            buffers="resident", max_grad_norm=MAX_NORM,
                            grad_accumulation_steps=len(data[0]),
                            activation_host_bytes=0,
                            activation_buffer_bytes=8192)
        try:
            losses = train_lohan(engine, model, data)
            engine.sync_weights()
            with lohan.Client(daemon.socket) as client:
                (session,) = [s for s in client.status()["sessions"]
                              if s["job_id"] == engine._job.id]
            stats = engine.activation_stats
        finally:
            engine.close()
    finally:
        daemon.stop(signal.SIGKILL)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return losses, weights, {"session": session, "activations": stats}


def test_rings_of_eight_train_as_the_default_rings_and_torch(tmp_path):
    torch.manual_seed(0)
    reference = TinyGPT(layers=BLOCKS)
    initial = copy.deepcopy(reference)
    data = batches(3, micro=2)
    ref_losses = train_torch(reference, data, max_norm=MAX_NORM)

    small = copy.deepcopy(initial)
    losses, weights, seen = _train(tmp_path, 8, small, data)
    assert seen["session"]["ring_entries"] == 8
    assert seen["session"]["layers"] == BLOCKS + 2
    # Each block input (8 KiB) goes out in two 4 KiB pieces.
    assert seen["activations"].ssd_puts >= BLOCKS * len(data) * 2
    assert_fp32_close(small, reference, losses, ref_losses)

    default = copy.deepcopy(initial)
    default_losses, default_weights, default_seen = _train(
        tmp_path, 1024, default, data)
    assert default_seen["session"]["ring_entries"] == 1024
    assert losses == default_losses
    for name, weight in default_weights.items():
        assert torch.equal(weight, weights[name]), name
