"""A data plane opens at what the host pool has free (issue #47): a job
created with room for one buffer per layer, resumed while another plane
holds most of the pool, opens streamed in the arena that is free and
trains on to the weights of an uninterrupted run."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import List

import torch
from torch import nn

import lohan
from conftest import Daemon
from lohan.client import Client

MIB = 1 << 20
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01


class _WideStack(nn.Module):
    """6 blocks of 256x256 fp32 and a head: one gradient and one weight
    buffer per layer need 5 MiB of arena, one shared one of each 2."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(256, 256), nn.Tanh()) for _ in range(6))
        self.head = nn.Linear(256, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _engine(model: nn.Module, daemon: Daemon, name: str,
            resume: bool = False) -> lohan.Engine:
    return lohan.init(model, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                      socket=daemon.socket, job_name=name, resume=resume,
                      stream_buffers=2, activation_buffer_bytes=0,
                      activations="keep")


def _train(engine: lohan.Engine, model: nn.Module,
           steps: range) -> List[float]:
    losses = []
    for step in steps:
        x = torch.randn(8, 256, generator=torch.Generator().manual_seed(step))
        loss = model(x).pow(2).mean()
        loss.backward()
        engine.step()
        losses.append(loss.item())
    return losses


def test_a_resumed_job_opens_streamed_in_what_the_pool_has_free(
        tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, host_pool="8MiB", ssd_capacity="256MiB")
    try:
        straight = _WideStack()
        with _engine(straight, daemon, "straight") as engine:
            assert engine.buffers == "resident"
            straight_losses = _train(engine, straight, range(5))

        first = _WideStack()
        with _engine(first, daemon, "wide") as engine:
            assert engine.buffers == "resident"
            losses = _train(engine, first, range(2))

        with Client(daemon.socket) as client:
            # Another job's plane holds 6 of the 8 MiB: 2 are free, the
            # floor of "wide" (one shared buffer of each kind).
            filler = client.create_job("filler", host_pool_bytes=6 * MIB)
            client.attach_job(filler.id)
            with client.open_data_plane(filler.id):
                second = _WideStack()
                with _engine(second, daemon, "wide", resume=True) as engine:
                    assert engine.buffers == "streamed"
                    assert engine.iteration == 2
                    (session,) = [s for s in client.status()["sessions"]
                                  if s["job_id"] != filler.id]
                    assert int(session["arena_bytes"]) == 2 * MIB
                    assert int(session["wanted_arena_bytes"]) == 5 * MIB
                    losses += _train(engine, second, range(2, 5))
                    assert engine.iteration == 5
            client.detach_job(filler.id)
        assert "of the 5242880 its job asks for" in daemon.log()
        assert losses == straight_losses
        for (name, a), (_, b) in zip(second.named_parameters(),
                                     straight.named_parameters()):
            assert torch.equal(a, b), name
    finally:
        daemon.stop(signal.SIGKILL)
