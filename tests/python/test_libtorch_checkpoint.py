"""Checkpoints shared by the C++ plugin (plugins/libtorch) and this one.

plugins/libtorch/checkpoint_tool trains plugins/libtorch/linear_tanh.h's
model, whose twin is LinearTanh here: Linear + tanh blocks and a Linear
head under a mean squared error, the same ops on the same torch build, so
forward and backward give the same bits in both. Every run starts from one
step-0 checkpoint the C++ tool writes (its seed's init), so both plugins
train the same weights:
- C++ trains k steps and saves, Python resumes and trains m more: its
  losses and final masters and moments are those of a Python run of k + m
  steps, bit for bit;
- the reverse (Python saves, C++ resumes), the same;
- the two k-step checkpoints (one per plugin) hold the same bits;
- C++ recomputing its blocks' activations saves the same checkpoint;
- C++ refuses a Python checkpoint whose bytes changed (CRC-32).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch
from torch import nn

import lohan
from lohan.checkpoint import verify_checkpoint
from conftest import built

DIM, BLOCKS, OUT, BATCH = 16, 3, 4, 8
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.99), 1e-8, 0.01
FIRST, REST = 2, 3


class LinearTanh(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(BLOCKS))
        self.head = nn.Linear(DIM, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def batch(step: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """linear_tanh.h's MakeBatch."""
    x = torch.sin(torch.arange(BATCH * DIM, dtype=torch.float32)
                  .reshape(BATCH, DIM) * 0.37 + float(step))
    y = torch.cos(torch.arange(BATCH * OUT, dtype=torch.float32)
                  .reshape(BATCH, OUT) * 0.11 + float(step))
    return x, y


def cpp(lohand, job: str, *args: str) -> None:
    result = subprocess.run(
        [str(built("plugins/libtorch/checkpoint_tool")), "--socket",
         lohand.socket, "--job", job, *args],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def python_run(lohand, job: str, resume: Path, steps: int,
               save: Path) -> List[float]:
    """Resumes from `resume`, trains `steps` steps, saves to `save`, on one
    torch thread (the rest of the suite keeps its own count)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = LinearTanh()
        losses = []
        with lohan.init(model, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                        socket=lohand.socket, job_name=job,
                        resume=resume) as engine:
            for _ in range(steps):
                x, y = batch(engine.iteration + 1)
                loss = (model(x) - y).pow(2).mean()
                engine.backward(loss)
                engine.step()
                losses.append(float(loss.item()))
            engine.save(save, optimizer_state=True)
            engine.close(delete_job=True)
    finally:
        torch.set_num_threads(threads)
    return losses


def contents(directory: Path) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    tensors = load_file(str(directory / "model.safetensors"))
    tensors.update(load_file(str(directory / "optimizer.safetensors")))
    return tensors


def assert_same_bits(got: Dict[str, torch.Tensor],
                     want: Dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name


@pytest.fixture
def start(lohand, tmp_path) -> Path:
    """The step-0 checkpoint every run starts from (C++'s init, seed 0)."""
    cpp(lohand, "init", "--seed", "0", "--save", str(tmp_path / "start"))
    return tmp_path / "start"


@pytest.mark.parametrize("activations", ["keep", "recompute"])
def test_cpp_checkpoint_resumes_in_python_bit_for_bit(lohand, tmp_path,
                                                      start, activations):
    """C++ trains (keeping its blocks' activations or recomputing them),
    Python goes on."""
    straight = python_run(lohand, "straight", start, FIRST + REST,
                          tmp_path / "straight")
    cpp(lohand, "cpp-first", "--resume", str(start), "--steps", str(FIRST),
        "--save", str(tmp_path / "cpp"), "--losses", str(tmp_path / "loss"),
        "--activations", activations)
    first = [float(v) for v in (tmp_path / "loss").read_text().split()]
    rest = python_run(lohand, "py-rest", tmp_path / "cpp", REST,
                      tmp_path / "resumed")
    assert [torch.tensor(v).float().item() for v in first] == straight[:FIRST]
    assert rest == straight[FIRST:]
    assert_same_bits(contents(tmp_path / "resumed"),
                     contents(tmp_path / "straight"))


def test_python_checkpoint_resumes_in_cpp_bit_for_bit(lohand, tmp_path,
                                                      start):
    cpp(lohand, "cpp-straight", "--resume", str(start), "--steps",
        str(FIRST + REST), "--save", str(tmp_path / "straight"))
    python_run(lohand, "py-first", start, FIRST, tmp_path / "python")
    cpp(lohand, "cpp-first", "--resume", str(start), "--steps", str(FIRST),
        "--save", str(tmp_path / "cpp"))
    # The same k steps in either plugin: the same checkpoint.
    assert_same_bits(contents(tmp_path / "python"), contents(tmp_path / "cpp"))
    cpp(lohand, "cpp-rest", "--resume", str(tmp_path / "python"), "--steps",
        str(REST), "--save", str(tmp_path / "resumed"))
    assert_same_bits(contents(tmp_path / "resumed"),
                     contents(tmp_path / "straight"))
    verify_checkpoint(tmp_path / "resumed")  # Python's manifest check


def test_cpp_refuses_a_damaged_python_checkpoint(lohand, tmp_path, start):
    python_run(lohand, "py", start, 1, tmp_path / "python")
    weights = tmp_path / "python" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    result = subprocess.run(
        [str(built("plugins/libtorch/checkpoint_tool")), "--socket",
         lohand.socket, "--job", "damaged", "--resume",
         str(tmp_path / "python"), "--steps", "1"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "model.safetensors is damaged (CRC-32" in result.stderr


OLD = (Path(__file__).resolve().parents[1] / "data" / "checkpoints"
       / "main-63a1563" / "linear-tanh")


def adamw_from(directory: Path, steps: int) -> Tuple[List[float],
                                                     Dict[str, torch.Tensor]]:
    """torch AdamW from a checkpoint's masters and moments (read with the
    safetensors package), `steps` more steps: the losses and weights."""
    stored = contents(directory)
    model = LinearTanh()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(stored[name])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WD)
    iteration = 2  # the checkpoint's
    for name, param in model.named_parameters():
        opt.state[param] = {"step": torch.tensor(float(iteration)),
                            "exp_avg": stored["exp_avg/" + name].clone(),
                            "exp_avg_sq": stored["exp_avg_sq/" + name].clone()}
    losses = []
    for step in range(steps):
        x, y = batch(iteration + step + 1)
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses, {n: p.detach() for n, p in model.named_parameters()}


def test_a_checkpoint_main_wrote_before_the_client_core_resumes_in_both(
        lohand, tmp_path):
    """main at 63a1563's Python plugin wrote it (tests/data/checkpoints/
    main-63a1563): both plugins resume from it and train on to the same
    bits, which are torch AdamW's from the stored states."""
    verify_checkpoint(OLD)
    py_losses = python_run(lohand, "old-py", OLD, REST, tmp_path / "py")
    cpp(lohand, "old-cpp", "--resume", str(OLD), "--steps", str(REST),
        "--save", str(tmp_path / "cpp"), "--losses", str(tmp_path / "loss"))
    cpp_losses = [float(v) for v in (tmp_path / "loss").read_text().split()]
    assert [torch.tensor(v).float().item() for v in cpp_losses] == py_losses
    assert_same_bits(contents(tmp_path / "cpp"), contents(tmp_path / "py"))
    want_losses, want = adamw_from(OLD, REST)
    assert py_losses == pytest.approx(want_losses, rel=1e-5)
    got = contents(tmp_path / "py")
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6)
