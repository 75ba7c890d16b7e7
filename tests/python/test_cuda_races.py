"""GPU tests that can catch the CUDA path's races: a model large enough that
every copy takes milliseconds (so a copy still in flight when its buffer is
reused, or a put submitted before its bytes landed, changes results),
compared with torch AdamW on the same GPU, bf16 weight refills of one
shared buffer while the previous layer's copy may still read it, a
non-default current stream, a second GPU (nothing may land on GPU 0), rings
of 8 entries, and gradient copies that overlap backward (a ratio measured in
the test's own run).

Skipped without a GPU (scripts/device_pack fails on any skip but the
second-GPU one on a machine with a single GPU); run with
`.venv/bin/pytest -q tests/python/test_cuda_races.py` there.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Tuple

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch
from torch import nn

import lohan
from conftest import Daemon
from test_cuda import _cuda_or_skip, _deterministic, _loss
from test_engine import BETAS, EPS, WD, Block, assert_fp32_close

LR = 1e-3
# About 60M parameters: a block's fp32 gradient (12.6M elements, 50 MB)
# takes milliseconds to cross the link.
VOCAB, DIM, HEADS, BLOCKS, SEQ, BATCH = 4096, 1024, 8, 4, 128, 4


class _WideGPT(nn.Module):
    def __init__(self, blocks: int = BLOCKS):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList(Block(DIM, HEADS) for _ in range(blocks))
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1],
                                                  device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _model(device: torch.device, blocks: int = BLOCKS) -> _WideGPT:
    torch.manual_seed(0)
    return _WideGPT(blocks).to(device)


def _data(steps: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (steps, BATCH, SEQ + 1),
                         generator=g).to(device)


@pytest.fixture
def big_lohand(tmp_path: Path):
    """A daemon with room for the wide model's states (none without a GPU:
    the tests skip first)."""
    _cuda_or_skip()
    daemon = Daemon(tmp_path, host_pool="2GiB", ssd_capacity="4GiB")
    try:
        yield daemon
    finally:
        daemon.stop(signal.SIGKILL)


def _train(model: nn.Module, socket: str, data: torch.Tensor, job: str,
           **options) -> Tuple[List[float], Dict[str, torch.Tensor], dict]:
    options.setdefault("weight_decay", WD)
    with lohan.init(model, lr=LR, betas=BETAS, eps=EPS, socket=socket,
                    job_name=job, **options) as engine:
        assert engine._cuda, "the engine did not take the CUDA path"
        losses = []
        for ids in data:
            loss = _loss(model, ids)
            engine.backward(loss)
            losses.append(loss.item())
            engine.step()
        stats = engine.activation_stats
    weights = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    return losses, weights, {"activations": stats}


def _torch_adamw(model: nn.Module, data: torch.Tensor,
                 max_norm: float = 0.0) -> List[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WD)
    losses = []
    for ids in data:
        loss = _loss(model, ids)
        loss.backward()
        losses.append(loss.item())
        if max_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        opt.zero_grad()
    return losses


def test_gpu_wide_model_away_from_the_gpu_matches_torch_adamw(big_lohand):
    """fp32, everything away from the GPU: block weights fetched one block
    ahead, two shared gradient/weight buffers refilled by every layer,
    block inputs straight from the GPU to the SSDs (ACT_PUT posted by the
    copy's stream callback), clipping. Against torch AdamW on the GPU."""
    _cuda_or_skip()
    device = torch.device("cuda")
    data = _data(4, device)
    with _deterministic():
        reference = _model(device)
        model = copy.deepcopy(reference)
        ref_losses = _torch_adamw(reference, data, max_norm=1.0)
        losses, _, seen = _train(
            model, big_lohand.socket, data, "wide-away", params="offload",
            buffers="streamed", stream_buffers=2, activation_host_bytes=0,
            activation_buffer_bytes=8 << 20, max_grad_norm=1.0)
    assert seen["activations"].ssd_puts > 0
    assert_fp32_close(model.cpu(), reference.cpu(), losses, ref_losses)


def test_gpu_bf16_one_shared_buffer_equals_resident_bit_for_bit(big_lohand):
    """bf16 weights through one shared weight buffer: each layer's refill
    rewrites bytes the previous layer's copy to the GPU may still be
    reading (unless the buffer is held until that copy is done). Equal to
    the resident run, bit for bit."""
    _cuda_or_skip()
    device = torch.device("cuda")
    data = _data(3, device)
    runs = {}
    with _deterministic():
        for name, options in (
                ("resident", dict(buffers="resident", params="resident")),
                ("one", dict(buffers="streamed", stream_buffers=1,
                             params="offload"))):
            model = _model(device).to(torch.bfloat16)
            runs[name] = _train(model, big_lohand.socket, data,
                                f"bf16-{name}", **options)
    assert runs["one"][0] == runs["resident"][0]
    for name, weight in runs["resident"][1].items():
        assert torch.equal(weight, runs["one"][1][name]), name


def test_gpu_training_on_a_side_stream_equals_the_default_stream(big_lohand):
    """torch's current stream is a side stream for the whole run: every copy
    the engine and the C library enqueue must follow it."""
    _cuda_or_skip()
    device = torch.device("cuda")
    data = _data(3, device)
    runs = []
    with _deterministic():
        for side in (False, True):
            model = _model(device, blocks=2)
            stream = torch.cuda.Stream(device) if side else None
            with (torch.cuda.stream(stream) if side
                  else contextlib.nullcontext()):
                runs.append(_train(model, big_lohand.socket, data,
                                   f"stream-{side}", params="offload",
                                   activation_host_bytes=0,
                                   activation_buffer_bytes=4 << 20))
            torch.cuda.synchronize(device)
    assert runs[0][0] == runs[1][0]
    for name, weight in runs[0][1].items():
        assert torch.equal(weight, runs[1][1][name]), name


def _gpu0_pids() -> List[int]:
    """The processes with a context on GPU 0 (nvidia-smi)."""
    out = subprocess.run(
        ["nvidia-smi", "--id=0", "--query-compute-apps=pid",
         "--format=csv,noheader"], capture_output=True, text=True,
        check=True).stdout
    return [int(line) for line in out.split() if line.strip().isdigit()]


def test_gpu_job_on_the_second_gpu_puts_nothing_on_gpu0(big_lohand):
    """A model on cuda:1 without torch.cuda.set_device: trains as torch
    AdamW does there, and this process has no context on GPU 0."""
    _cuda_or_skip()
    if torch.cuda.device_count() < 2:
        pytest.skip("needs a second GPU")
    device = torch.device("cuda", 1)
    data = _data(2, device)
    with _deterministic():
        reference = _model(device, blocks=2)
        model = copy.deepcopy(reference)
        ref_losses = _torch_adamw(reference, data)
        losses, _, _ = _train(model, big_lohand.socket, data, "second-gpu",
                              params="offload", activation_host_bytes=0,
                              activation_buffer_bytes=4 << 20)
    assert torch.cuda.memory_allocated(0) == 0
    assert os.getpid() not in _gpu0_pids()
    assert_fp32_close(model.cpu(), reference.cpu(), losses, ref_losses)


def test_gpu_rings_of_eight_do_not_stall(tmp_path: Path):
    """lohand --ring-entries 8: the GPU's gradient copies, weight fetches
    and activation puts wait for ring room without a stall, and the run
    equals the one with the default rings, bit for bit."""
    _cuda_or_skip()
    device = torch.device("cuda")
    data = _data(2, device)
    runs = []
    with _deterministic():
        for entries in (8, 1024):
            directory = tmp_path / f"rings-{entries}"
            directory.mkdir()
            daemon = Daemon(directory, host_pool="2GiB", ssd_capacity="4GiB",
                            extra_args=["--ring-entries", str(entries)])
            try:
                model = _model(device, blocks=8).to(torch.bfloat16)
                runs.append(_train(model, daemon.socket, data,
                                   f"rings-{entries}", params="offload",
                                   activation_host_bytes=0,
                                   activation_buffer_bytes=1 << 20))
            finally:
                daemon.stop(signal.SIGKILL)
    assert runs[0][0] == runs[1][0]
    for name, weight in runs[0][1].items():
        assert torch.equal(weight, runs[1][1][name]), name


def _backward_seconds(model: nn.Module, ids: torch.Tensor,
                      backward) -> float:
    """The median time of a backward (forward untimed), device synchronized
    (every stream, the copies' side streams too)."""
    times = []
    for _ in range(5):
        loss = _loss(model, ids)
        torch.cuda.synchronize()
        start = time.perf_counter()
        backward(loss)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def test_gpu_gradient_copies_overlap_backward(big_lohand):
    """Backward through lohan (each layer's gradient copied out on a side
    stream as soon as backward has made it) against plain backward and
    the same copies made one after another, measured in this run. Run one
    after the other they would take t_plain + t_copies, perfectly
    overlapped max(t_plain, t_copies); at least a third of the time that
    overlap can save is saved."""
    _cuda_or_skip()
    device = torch.device("cuda")
    ids = _data(1, device)[0]
    plain = _model(device)
    t_plain = _backward_seconds(plain, ids, lambda loss: (
        loss.backward(), plain.zero_grad(set_to_none=True)))
    pinned = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True)
              for p in plain.parameters()]
    loss = _loss(plain, ids)
    loss.backward()
    grads = [p.grad for p in plain.parameters()]
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for host, grad in zip(pinned, grads):
            host.copy_(grad, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    t_copies = statistics.median(times[1:])
    model = _model(device)
    with lohan.init(model, lr=LR, socket=big_lohand.socket,
                    job_name="overlap", params="resident",
                    activations="keep") as engine:
        assert engine._cuda
        seconds = []
        for _ in range(5):
            loss = _loss(model, ids)
            torch.cuda.synchronize()
            start = time.perf_counter()
            engine.backward(loss)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
            engine.step()
        t_lohan = statistics.median(seconds[1:])
    hidden = (t_plain + t_copies - t_lohan) / min(t_plain, t_copies)
    print(f"backward {t_plain * 1e3:.2f} ms, copies alone "
          f"{t_copies * 1e3:.2f} ms, backward through lohan "
          f"{t_lohan * 1e3:.2f} ms: {hidden:.0%} of what overlap can save, "
          "copies hidden")
    assert hidden >= 1 / 3, (t_plain, t_copies, t_lohan)
