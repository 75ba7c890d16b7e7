"""The engine on a GPU: the CUDA path of liblohan_client (pinned arena,
gradients copied out on a side stream with GRAD_READY posted from a CUDA
stream callback) and of the engine (block weights fetched one block ahead on
a side stream, block inputs copied to pinned host memory on a side stream,
RNG replayed on the device in the recompute).

These need a GPU and a liblohan_client built with the CUDA toolkit; without
both they are skipped, saying which is missing. The CPU tests cover the same
engine logic with CPU tensors; the device copies, streams and CUDA RNG are
specific to these.

Determinism: GPU kernels may accumulate in a different order from run to
run (atomics), which would blur a comparison between two runs. These tests
ask torch for its deterministic kernels and use the math attention kernel,
so two runs of the same computation agree bit for bit and the tolerances
are the CPU tests' (test_engine.py states them).

On a GPU machine: `.venv/bin/pytest -q tests/python/test_cuda.py` (with
LOHAN_BAZEL_BIN pointing at the build); scripts/device_pack packs them.
"""

from __future__ import annotations

import contextlib
import copy
import os
from typing import Dict, List, Tuple

# Before CUDA starts: cuBLAS is deterministic only with a fixed workspace.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch
from torch import nn

import lohan
from lohan.client import Model
from test_engine import (BATCH, BETAS, EPS, LR, SEQ, VOCAB, WD, _Fuse,
                         _FusedProbe, _LoraModel, assert_fp32_close,
                         tiny_gpt)


def _cuda_or_skip() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    available, reason = Model.cuda_available()
    if not available:
        pytest.skip(f"liblohan_client cannot use CUDA: {reason}")


@contextlib.contextmanager
def _deterministic():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.use_deterministic_algorithms(False)


def _data(steps: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (steps, BATCH, SEQ + 1),
                         generator=g).to(device)


def _loss(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])
    return torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _train(model: nn.Module, lohand, data: torch.Tensor, job: str,
           **options) -> Tuple[List[float], Dict[str, torch.Tensor], dict]:
    """Trains through lohan; (losses, final weights on the CPU, counters)."""
    options.setdefault("weight_decay", WD)
    with lohan.init(model, lr=LR, betas=BETAS, eps=EPS, socket=lohand.socket,
                    job_name=job, **options) as engine:
        assert engine._cuda, "the engine did not take the CUDA path"
        losses = []
        for ids in data:
            loss = _loss(model, ids)
            engine.backward(loss)
            losses.append(loss.item())
            engine.step()
        counters = {"activations": engine.activation_stats}
        if engine._residency is not None:
            counters["prefetched"] = engine._residency.prefetched
    weights = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    return losses, weights, counters


@pytest.mark.parametrize("params", ["resident", "offload"])
def test_gpu_training_matches_torch_adamw(lohand, params):
    _cuda_or_skip()
    device = torch.device("cuda")
    with _deterministic():
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
        losses, _, counters = _train(model, lohand, data, f"gpu-{params}",
                                     params=params)
    if params == "offload":
        # Every block after the first in each pass found its weights
        # already on the device.
        assert counters["prefetched"] > 0
    assert_fp32_close(model.cpu(), reference.cpu(), losses, ref_losses)


def test_gpu_bf16_streamed_offloaded_everything_matches_resident(lohand):
    """bf16 with everything away from the GPU (weights fetched per block,
    2 shared gradient/weight buffers, block inputs on the SSDs) equals the
    run with everything resident on the same GPU, bit for bit."""
    _cuda_or_skip()
    device = torch.device("cuda")
    data = _data(4, device)
    runs = {}
    with _deterministic():
        for name, options in (
                ("resident", dict(params="resident", buffers="resident")),
                ("away", dict(params="offload", buffers="streamed",
                              stream_buffers=2, activation_host_bytes=0,
                              activation_buffer_bytes=1 << 20))):
            model = tiny_gpt().to(device).to(torch.bfloat16)
            runs[name] = _train(model, lohand, data, f"gpu-bf16-{name}",
                                max_grad_norm=0.5, **options)
    resident, away = runs["resident"], runs["away"]
    assert away[0] == resident[0], (away[0], resident[0])
    for name, weight in resident[1].items():
        assert torch.equal(weight, away[1][name]), name
    assert away[2]["activations"].ssd_puts > 0


class _DropoutStack(nn.Module):
    """Blocks with dropout, given their input by keyword, and an unused
    parameter: the recompute must replay the device's RNG, and the unused
    parameter's (empty, offloaded) placeholder gets a zero gradient."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            _DropoutBlock() for _ in range(3))
        self.blocks[1].unused = nn.Parameter(torch.zeros(5))
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(hidden=x)
        return self.head(x)


class _DropoutBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.drop = nn.Dropout(0.3)

    def forward(self, hidden):
        return self.drop(torch.tanh(self.fc(hidden)))


def test_gpu_dropout_is_replayed_in_the_recompute(lohand):
    _cuda_or_skip()
    device = torch.device("cuda")
    xs = torch.randn(3, 8, 32, generator=torch.Generator().manual_seed(3))
    runs = []
    with _deterministic():
        for policy, params in (("keep", "resident"), ("offload", "offload")):
            torch.manual_seed(0)
            model = _DropoutStack().to(device)
            torch.cuda.manual_seed(7)
            with pytest.warns(UserWarning, match="unused"), lohan.init(
                    model, lr=1e-2, socket=lohand.socket,
                    job_name=f"gpu-drop-{policy}", activations=policy,
                    params=params) as engine:
                losses = []
                for x in xs:
                    loss = model(x.to(device)).pow(2).mean()
                    loss.backward()
                    losses.append(loss.item())
                    engine.step()
            runs.append((losses, [p.detach().cpu() for p in
                                  model.parameters()]))
    (keep_losses, keep_weights), (off_losses, off_weights) = runs
    assert keep_losses == off_losses
    for a, b in zip(keep_weights, off_weights):
        assert torch.equal(a, b)


def test_gpu_per_tensor_plans_and_auto_give_the_bits_of_keep(lohand,
                                                             monkeypatch):
    """Per saved tensor on the GPU: kept on the device, copied to pinned
    host memory on the side stream, sent to the SSDs, or made again from
    the recorded operators in backward; and "auto" (a profiling iteration,
    lohand's plan from the second): the same bits as keep."""
    _cuda_or_skip()
    import lohan.activations
    monkeypatch.setattr(lohan.activations, "_MIN_SWAP_BYTES", 1024)
    device = torch.device("cuda")
    data = _data(4, device)
    # One decision per storage a tiny_gpt block saves candidates over (8).
    mixed = ["device", "recompute", "host", "ssd", "recompute",
             "recompute", "host", "device"]
    runs = []
    with _deterministic():
        for policy in ("keep", [mixed] * 3, [["recompute"] * 8] * 3,
                       "auto"):
            model = tiny_gpt().to(device)
            runs.append(_train(model, lohand, data,
                               f"gpu-plan-{len(runs)}", activations=policy,
                               params="resident",
                               activation_host_bytes=1 << 30))
    for losses, weights, _ in runs[1:]:
        assert losses == runs[0][0]
        for name, tensor in weights.items():
            assert torch.equal(tensor, runs[0][1][name]), name
    assert runs[1][2]["activations"].ssd_puts > 0
    assert runs[1][2]["activations"].host_puts > 0


def test_gpu_backward_failing_half_way_then_zero_grad_and_close(lohand):
    """Gradient copies from the device are in flight when backward raises:
    zero_grad() discards the step (training goes on as if the batch had
    never been seen), and close() with copies in flight is clean."""
    _cuda_or_skip()
    device = torch.device("cuda")
    xs = [torch.randn(4, 16, generator=torch.Generator().manual_seed(n))
          .to(device) for n in range(3)]
    runs = []
    with _deterministic():
        for fail in (False, True):
            torch.manual_seed(0)
            model = _FusedProbe([]).to(device)
            with lohan.init(model, lr=1e-2, socket=lohand.socket,
                            job_name=f"gpu-fuse-{fail}", params="offload",
                            buffers="streamed", stream_buffers=1) as engine:
                if fail:
                    _Fuse.armed = True
                    try:
                        with pytest.raises(RuntimeError, match="half-way"):
                            model(xs[0]).pow(2).mean().backward()
                    finally:
                        _Fuse.armed = False
                    engine.zero_grad()
                    assert engine.iteration == 0
                for x in xs[1:]:
                    model(x).pow(2).mean().backward()
                    engine.step()
                runs.append(engine.master_weights())
        for name, weight in runs[0].items():
            assert torch.equal(weight, runs[1][name]), name
        # An exception in backward, then straight out of the with block.
        model = _FusedProbe([]).to(device)
        with pytest.raises(RuntimeError, match="half-way"):
            with lohan.init(model, lr=1e-2, socket=lohand.socket,
                            job_name="gpu-fuse-close", params="offload"):
                _Fuse.armed = True
                try:
                    model(xs[0]).pow(2).mean().backward()
                finally:
                    _Fuse.armed = False
        assert all(p.numel() > 0 for p in model.parameters())


def test_gpu_model_given_on_the_cpu_trains_on_the_device(lohand):
    """A model larger than the GPU is built on the CPU and handed over with
    device="cuda": the layers outside the blocks and the buffers go to the
    GPU, the blocks' weights come from the daemon one block at a time. The
    run equals the one of the same model moved to the GPU first, and
    close() gives the model back on the CPU with the trained weights."""
    _cuda_or_skip()
    device = torch.device("cuda")
    data = _data(3, device)
    runs = []
    with _deterministic():
        for given_on_cpu in (False, True):
            model = tiny_gpt()
            if not given_on_cpu:
                model = model.to(device)
            options = dict(device="cuda") if given_on_cpu else {}
            losses, weights, _ = _train(model, lohand, data,
                                        f"gpu-given-{given_on_cpu}",
                                        params="offload", **options)
            expected = torch.device("cpu") if given_on_cpu else device
            assert all(p.device.type == expected.type
                       for p in model.parameters())
            runs.append((losses, weights))
    (on_gpu_losses, on_gpu), (given_losses, given) = runs
    assert given_losses == on_gpu_losses
    for name, weight in on_gpu.items():
        assert torch.equal(weight, given[name]), name


def test_gpu_lora_base_on_the_ssds_matches_base_in_host_memory(lohand):
    """A LoRA model given on the CPU, trained on the GPU with its frozen
    base weights on the daemon's SSDs (frozen_host_bytes=0), equals the run
    with the base pinned in host memory."""
    _cuda_or_skip()
    runs = []
    with _deterministic():
        for budget in (None, 0):
            model = _LoraModel()
            with lohan.init(model, lr=1e-2, socket=lohand.socket,
                            job_name=f"gpu-lora-{budget}", device="cuda",
                            frozen_host_bytes=budget,
                            activation_buffer_bytes=1 << 20) as engine:
                assert engine._cuda and engine.params_mode == "offload"
                losses = []
                for step in range(3):
                    x = torch.randn(8, 16, generator=torch.Generator()
                                    .manual_seed(step)).to("cuda")
                    loss = model(x).pow(2).mean()
                    loss.backward()
                    engine.step()
                    losses.append(loss.item())
            runs.append((losses, {n: p.detach().clone()
                                  for n, p in model.named_parameters()}))
    assert runs[0][0] == runs[1][0]
    for name, weight in runs[0][1].items():
        assert weight.device.type == "cpu"  # given back where it was
        assert torch.equal(weight, runs[1][1][name]), name


def test_the_synchronous_fallback_says_what_it_costs_a_step():
    """Runs anywhere: the warning a GPU job gets when liblohan_client
    cannot use CUDA names the reason and the per-step cost of the
    synchronous copies from the measured rate (the measurement itself,
    job.measure_sync_copy, needs a GPU)."""
    from lohan.job import sync_fallback_message
    text = sync_fallback_message("no NVIDIA driver: ...", 3 << 30, 12e9)
    assert "no NVIDIA driver: ..." in text
    assert "synchronous tensor copies" in text
    assert "about 0.268 s a step" in text  # 3 GiB / 12 GB/s
    assert "3072 MiB at 12.00 GB/s, measured now" in text
    assert "inf s a step" in sync_fallback_message("x", 1 << 20, 0.0)
