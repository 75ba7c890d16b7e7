"""SSD bytes per step against the minimum for the layout, counted where
they reach storage (lohand's /proc/<pid>/io; its files are O_DIRECT, so no
page cache hides a read).

An fp32 model, resident buffers: the states are read once and written once
per step (12 + 12 bytes a parameter); the model's new weights come from
the arena, not from the states. Streamed: the gradient is written and read
once more; each layer's new weights are fetched from the memory its update
wrote them in (lohand's weight handoff, which holds more chunks than this
model has), not read back from the states.
With a state tier ([pool] state_tier), the states of the first layers that
fit it are read from lohand's memory instead: only the other layers' are
read from the SSDs, and every layer's state is still written. What the
tier has left beside those states keeps streamed gradients, in the order
backward hands them over, whole chunks that fit: those never reach the
SSDs.
Catalog records and the per-job meta add a few pages; the bound allows 5%.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Tuple

import pytest
import torch
from torch import nn

import lohan

PAGE = 4096


class Stack(nn.Module):
    """2 blocks of 1024x1024 (1,049,600 parameters each: a state of 12
    stripe units and a bit) and a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(1024, 1024), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(1024, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def io(pid: int) -> Tuple[int, int]:
    fields = dict(line.split(": ") for line in
                  Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["read_bytes"]), int(fields["write_bytes"])


def padded(nbytes: int) -> int:
    return (nbytes + PAGE - 1) // PAGE * PAGE


def in_tier(layers, tier: int) -> int:
    """How many of the first layers' states (12 bytes a parameter, one
    chunk each here) a tier of `tier` bytes holds: the longest prefix
    (here the layer of the parameters outside the blocks, then a block)."""
    held, total = 0, 0
    for n in layers:
        if total + 12 * n > tier:
            break
        total += 12 * n
        held += 1
    return held


def grads_in_tier(layers, tier: int, resident: int) -> set:
    """The layers (one chunk each here) whose streamed gradients the tier
    keeps: taken in backward order (the last layer first) while they fit
    in what the first `resident` layers' states leave of it."""
    room = tier - sum(12 * n for n in layers[:resident])
    kept, total = set(), 0
    for layer in reversed(range(len(layers))):
        if total + 4 * layers[layer] <= room:
            total += 4 * layers[layer]
            kept.add(layer)
    return kept


@pytest.mark.parametrize("tier", ["0", "16MiB", "32MiB"])
@pytest.mark.parametrize("buffers", ["resident", "streamed"])
def test_fp32_ssd_bytes_per_step_are_the_layouts_minimum(tmp_path, buffers,
                                                        tier):
    from conftest import Daemon, built
    daemon = Daemon(tmp_path, ssd_capacity="256MiB",
                    extra_args=("--state-tier", tier))
    model = Stack()
    options = ({"buffers": "streamed", "stream_buffers": 1}
               if buffers == "streamed" else {"buffers": "resident"})
    steps = 3
    try:
        with lohan.init(model, lr=1e-3, socket=daemon.socket,
                        job_name="traffic", activations="keep",
                        # Every step durable: the tier's layers are
                        # written through each step.
                        commit_interval=1,
                        **options) as engine:
            layers = [layer.numel for layer in engine.layers]
            x = torch.randn(8, 1024,
                            generator=torch.Generator().manual_seed(1))
            model(x).pow(2).mean().backward()
            engine.step()  # the first step, then the ones counted
            # Every layer's weights fetched: its updates done (step()
            # returns before them, overlap_step).
            engine.sync_weights()
            before = io(daemon.process.pid)
            for _ in range(steps):
                model(x).pow(2).mean().backward()
                engine.step()
                engine.sync_weights()
            after = io(daemon.process.pid)
            sessions = json.loads(subprocess.run(
                [str(built("client/ctl/lohanctl")), "--socket",
                 daemon.socket, "status", "--json"],
                capture_output=True, text=True, check=True,
                timeout=60).stdout)["sessions"]
    finally:
        daemon.stop()
    tier_bytes = {"0": 0, "16MiB": 16 << 20, "32MiB": 32 << 20}[tier]
    resident = in_tier(layers, tier_bytes)
    assert resident == {"0": 0, "16MiB": 2, "32MiB": 3}[tier], layers
    want_written = sum(padded(12 * n) for n in layers)
    want_read = sum(padded(12 * n) for n in layers[resident:])
    if buffers == "streamed":
        # Each gradient stored and read back, unless the tier kept it; each
        # layer's weights read as the front of its state (from the tier's
        # copy where it has one).
        kept = grads_in_tier(layers, tier_bytes, resident)
        # 16 MiB: the head's gradient beside two states; 32 MiB: every
        # state, the last block's gradient and the head's.
        assert kept == {"0": set(), "16MiB": {0}, "32MiB": {0, 2}}[tier]
        # lohanctl status says so.
        assert int(sessions[0].get("state_tier_grad_bytes", 0)) == sum(
            4 * layers[layer] for layer in kept), sessions[0]
        stored = [n for layer, n in enumerate(layers) if layer not in kept]
        want_read += sum(padded(4 * n) for n in stored)
        want_written += sum(padded(4 * n) for n in stored)
        # The new weights are fetched from the update's own memory (the
        # weight handoff): no read of the states for them.
    read = (after[0] - before[0]) / steps
    written = (after[1] - before[1]) / steps
    if want_read == 0:  # only the catalog's and meta's pages
        assert read <= 16 * PAGE, read
    else:
        assert want_read * 0.95 <= read <= want_read * 1.05, (read,
                                                               want_read)
    assert want_written * 0.95 <= written <= want_written * 1.05, (
        written, want_written)
