"""The engine on a GPU: the CUDA path of liblohan_client (pinned arena,
gradients copied out on torch's stream with GRAD_READY posted from a CUDA
host function) and of the engine (block weights fetched one block ahead on
a side stream, block inputs copied to pinned host memory on a side stream).

These need a GPU and a liblohan_client built with the CUDA toolkit; without
both they are skipped, saying which is missing. The CPU tests cover the same
engine logic with CPU tensors; only the device copies and streams are
specific to these.

On a GPU machine: `.venv/bin/pytest -q tests/python/test_cuda.py` (with
LOHAN_BAZEL_BIN pointing at the build).
"""

from __future__ import annotations

import copy

import pytest
import torch

import lohan
from lohan.client import Model
from test_engine import (BATCH, BETAS, EPS, LR, SEQ, VOCAB, WD,
                         assert_fp32_close, tiny_gpt)


def _cuda_or_skip() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    available, reason = Model.cuda_available()
    if not available:
        pytest.skip(f"liblohan_client cannot use CUDA: {reason}")


def _data(steps: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (steps, BATCH, SEQ + 1),
                         generator=g).to(device)


def _loss(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])
    return torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@pytest.mark.parametrize("params", ["resident", "offload"])
def test_gpu_training_matches_torch_adamw(lohand, params):
    _cuda_or_skip()
    device = torch.device("cuda")
    reference = tiny_gpt().to(device)
    model = copy.deepcopy(reference)
    model.head.weight = model.tok.weight
    data = _data(5, device)
    opt = torch.optim.AdamW(reference.parameters(), lr=LR, betas=BETAS,
                            eps=EPS, weight_decay=WD)
    ref_losses = []
    for ids in data:
        loss = _loss(reference, ids)
        loss.backward()
        ref_losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    with lohan.init(model, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                    socket=lohand.socket, job_name=f"gpu-{params}",
                    params=params) as engine:
        assert engine._cuda, "the engine did not take the CUDA path"
        losses = []
        for ids in data:
            loss = _loss(model, ids)
            engine.backward(loss)
            losses.append(loss.item())
            engine.step()
        if params == "offload":
            # Forward and backward of every step after the first block of
            # each found their weights already on the device.
            assert engine._residency.prefetched > 0
    # fp32 on the GPU: torch's kernels differ from the CPU's, the tolerance
    # is the CPU tests' (test_engine.py explains it).
    assert_fp32_close(model.cpu(), reference.cpu(), losses, ref_losses)


def test_gpu_block_inputs_offloaded_to_ssd_match_keep(lohand):
    _cuda_or_skip()
    device = torch.device("cuda")
    results = []
    for options in (dict(activations="keep", params="resident"),
                    dict(activations="offload", activation_host_bytes=0,
                         activation_buffer_bytes=1 << 20)):
        model = tiny_gpt().to(device)
        with lohan.init(model, lr=LR, socket=lohand.socket,
                        job_name=f"gpu-acts-{len(results)}",
                        **options) as engine:
            losses = []
            for ids in _data(3, device):
                loss = _loss(model, ids)
                engine.backward(loss)
                losses.append(loss.item())
                engine.step()
            stats = engine.activation_stats
        results.append((losses, stats))
    keep, spilled = results
    # The recompute runs the same kernels on the same inputs; GPU backward
    # kernels may accumulate in a different order between runs (atomics),
    # so equal up to float rounding rather than bit for bit.
    for a, b in zip(keep[0], spilled[0]):
        assert abs(a - b) <= 1e-5 * abs(b), (keep[0], spilled[0])
    assert spilled[1].ssd_puts == 3 * 3 and spilled[1].prefetched > 0
