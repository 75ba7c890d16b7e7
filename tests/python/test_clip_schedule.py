"""The clip schedules and overlap_step through the plugin: clip_schedule="deferred" (the
default: a layer's update waits for the global norm once clipping is
certain, the iteration's last updates overlap the next forward) against
"redo-all" (every update made at once and redone when the step clips).
Both must give the same losses and weights bit for bit, never clipping,
always clipping and clipping on some steps only, with accumulation,
resident and offloaded parameters, resident and streamed buffers; and the
fp32 run stays within the tolerance of torch AdamW with clip_grad_norm_."""

from __future__ import annotations

import copy
import statistics
from typing import Dict, List, Tuple

import pytest
import torch

import lohan
from test_engine import (assert_fp32_close, batches, engine_for, lm_loss,
                         tiny_gpt, train_lohan, train_torch)

Run = Tuple[List[float], Dict[str, torch.Tensor], List[bool]]


def run(lohand, schedule: str, limit: float, dtype: torch.dtype,
        data: torch.Tensor, name: str, **options) -> Run:
    model = tiny_gpt().to(dtype)
    with engine_for(model, lohand, max_grad_norm=limit,
                    grad_accumulation_steps=data.shape[1],
                    clip_schedule=schedule, job_name=name,
                    **options) as engine:
        clipped = []
        losses = []
        for step in data:
            for ids in step:
                loss = lm_loss(model, ids) / len(step)
                engine.backward(loss)
                losses.append(loss.item())
            clipped.append(engine.step().clipped)
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return losses, weights, clipped


def torch_norms(data: torch.Tensor) -> List[float]:
    """The global norm of each step's gradients in plain PyTorch."""
    model = tiny_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    norms = []
    for step in data:
        for ids in step:
            (lm_loss(model, ids) / len(step)).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(
            model.parameters(), float("inf")).item())
        opt.step()
        opt.zero_grad()
    return norms


LAYOUTS = [
    pytest.param(dict(params="resident", buffers="resident"), torch.float32,
                 id="resident-fp32"),
    pytest.param(dict(params="offload", buffers="streamed", stream_buffers=1),
                 torch.bfloat16, id="offload-streamed-bf16"),
]


@pytest.mark.parametrize("options,dtype", LAYOUTS)
def test_clip_schedules_give_the_same_bits(lohand, options, dtype):
    data = batches(5, micro=2)
    near = statistics.median(torch_norms(data))
    for limit, regime in ((1e9, "never"), (1e-3, "always"), (near, "some")):
        runs = {schedule: run(lohand, schedule, limit, dtype, data,
                              f"clip-{regime}-{schedule}-{dtype}", **options)
                for schedule in ("deferred", "redo-all")}
        losses, weights, clipped = runs["deferred"]
        assert losses == runs["redo-all"][0], regime
        assert clipped == runs["redo-all"][2], regime
        for name, weight in weights.items():
            assert torch.equal(weight, runs["redo-all"][1][name]), (regime,
                                                                     name)
        if regime == "never":
            assert not any(clipped)
        elif regime == "always":
            assert all(clipped)
        else:
            assert any(clipped) and not all(clipped), clipped


def test_deferred_clipping_matches_torch(lohand):
    data = batches(5, micro=2)
    near = statistics.median(torch_norms(data))
    reference = tiny_gpt()
    model = copy.deepcopy(reference)
    ref_losses = train_torch(reference, data, max_norm=near)
    with engine_for(model, lohand, max_grad_norm=near,
                    grad_accumulation_steps=2,
                    job_name="clip-vs-torch") as engine:
        losses = train_lohan(engine, model, data)
    assert_fp32_close(model, reference, losses, ref_losses)


def test_bad_clip_options_are_refused(tmp_path):
    socket = str(tmp_path / "unused.sock")
    with pytest.raises(ValueError, match="clip_schedule='fast'"):
        lohan.init(tiny_gpt(), clip_schedule="fast", socket=socket)
    with pytest.raises(TypeError, match="overlap_step must be True or False"):
        lohan.init(tiny_gpt(), overlap_step="yes", socket=socket)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_overlap_step_gives_the_same_model_at_every_use(lohand, dtype):
    """overlap_step=True: step() returns before the blocks' updates are
    done and each block's weights are copied just before it runs. Every
    use sees what the plain run has: the losses and weights, an eval
    forward between steps, model.state_dict() right after step() (before
    any forward), and the model close() gives back."""
    data = batches(4, micro=2)
    near = statistics.median(torch_norms(data))
    runs = []
    for overlap in (False, True):
        model = tiny_gpt().to(dtype)
        probe = data[0][0]
        with engine_for(model, lohand, max_grad_norm=near,
                        grad_accumulation_steps=2, overlap_step=overlap,
                        job_name=f"overlap-{overlap}-{dtype}") as engine:
            losses, evals, states = [], [], []
            for n, step in enumerate(data):
                for ids in step:
                    loss = lm_loss(model, ids) / len(step)
                    engine.backward(loss)
                    losses.append(loss.item())
                engine.step()
                if n % 2 == 0:
                    states.append({k: v.clone()
                                   for k, v in model.state_dict().items()})
                else:
                    with torch.no_grad():
                        evals.append(lm_loss(model, probe).item())
        runs.append((losses, evals, states,
                     {n: p.detach().clone()
                      for n, p in model.named_parameters()}))
    plain, lazy = runs
    assert lazy[0] == plain[0] and lazy[1] == plain[1]
    for a, b in zip(plain[2], lazy[2]):
        for key in a:
            assert torch.equal(a[key], b[key]), key
    for name, weight in plain[3].items():
        assert torch.equal(weight, lazy[3][name]), name


def test_overlap_step_sync_weights_and_changes_behind_its_back(lohand):
    model = tiny_gpt()
    data = batches(2)
    with engine_for(model, lohand, overlap_step=True,
                    job_name="overlap-sync") as engine:
        loss = lm_loss(model, data[0][0])
        loss.backward()
        engine.step()
        block = model.blocks[1].fc.weight
        before = block.detach().clone()
        engine.sync_weights()  # an EMA of the weights would start here
        after = block.detach().clone()
        assert not torch.equal(before, after)  # the new step's weights
        weights = engine.master_weights()
        assert torch.equal(after, weights["blocks.1.fc.weight"])
        engine.step()  # nothing handed over: a no-op
        loss = lm_loss(model, data[1][0])
        loss.backward()
        engine.step()
        # Changed in place before the block ran again: refused, as a
        # change between steps is, rather than overwritten.
        with torch.no_grad():
            model.blocks[2].fc.weight.add_(1.0)
        with pytest.raises(RuntimeError, match="changed in place"):
            lm_loss(model, data[0][0])
        changed = model.blocks[2].fc.weight.detach().clone()
        with pytest.warns(UserWarning, match="keeps the weights it has"):
            engine.close()
    # Left as the user made it, not overwritten.
    assert torch.equal(model.blocks[2].fc.weight.detach(), changed)


def test_a_stale_block_is_read_up_to_date_or_not_at_all(lohand):
    """overlap_step (the default): between step() and a block's next run
    its parameters are empty, never the previous step's weights. The
    model's parameters(), named_parameters() (its own and a block's),
    state_dict() and load_state_dict() bring each block up to date as
    they reach it and no sooner; zero_grad() waits for none; a copy of
    the model gets torch's own methods."""
    model = tiny_gpt()
    data = batches(2)
    with engine_for(model, lohand, job_name="stale-reads") as engine:
        assert engine._weights.lazy is not None  # overlap_step by default
        lm_loss(model, data[0][0]).backward()
        engine.step()
        weight = model.blocks[1].fc.weight
        assert weight.shape == (0,)  # a direct read fails on its shape
        model.zero_grad()
        engine.optimizer.zero_grad()
        assert weight.shape == (0,)
        # Early out of the generator: the blocks not reached stay empty.
        first = next(model.parameters())
        assert first is model.tok.weight
        assert model.blocks[0].fc.weight.shape == (0,)
        masters = engine.master_weights()
        mine = dict(model.blocks[1].named_parameters())
        assert torch.equal(mine["fc.weight"], masters["blocks.1.fc.weight"])
        assert model.blocks[0].fc.weight.shape == (0,)
        assert model.blocks[2].fc.weight.shape == (0,)
        for name, param in model.named_parameters():
            assert torch.equal(param.detach(), masters[name]), name
        # After the next step, a copy made at once is whole and has
        # torch's own methods.
        lm_loss(model, data[1][0]).backward()
        engine.step()
        assert model.blocks[2].fc.weight.shape == (0,)
        twin = copy.deepcopy(model)
        for module in twin.modules():
            assert not {"named_parameters", "zero_grad",
                        "__getstate__"} & set(vars(module))
        masters = engine.master_weights()
        for name, param in twin.named_parameters():
            assert torch.equal(param.detach(), masters[name]), name
        # After the next step load_state_dict brings each stale block up
        # to date before loading into it.
        lm_loss(model, data[0][0]).backward()
        engine.step()
        assert model.blocks[2].fc.weight.shape == (0,)
        state = {k: v.clone() for k, v in twin.state_dict().items()}
        model.load_state_dict(state)
        for name, param in model.state_dict().items():
            assert torch.equal(param, state[name]), name
    # close() leaves every block whole and torch's methods in place.
    assert "named_parameters" not in vars(model)
    assert "zero_grad" not in vars(model)
    assert all(block.fc.weight.numel() > 0 for block in model.blocks)


_CHILD = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_engine import batches, engine_for, lm_loss, tiny_gpt
class Lohand:
    socket = {socket!r}
model = tiny_gpt()
engine = engine_for(model, Lohand, max_grad_norm=1e-3, job_name={job!r})
for step in batches(2):
    lm_loss(model, step[0]).backward()
    result = engine.step()
    assert result.clipped
# The last step's updates (deferred: the step before clipped) may still
# be running in the daemon: die without a word.
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_client_killed_while_its_step_settles_loses_nothing(lohand):
    """step() returned, so the step counts: the daemon finishes and commits
    its updates although the process is gone, keeps serving, and the job
    resumes at that step with the weights of an uninterrupted run. (The
    path through a real process; that a pipeline closed mid-settle commits
    first, whatever the timing, is daemon/sched's SettleTest with a slowed
    store.)"""
    import subprocess
    import sys
    from pathlib import Path
    code = _CHILD.format(tests=str(Path(__file__).parent),
                         socket=lohand.socket, job="killed-settling")
    child = subprocess.run([sys.executable, "-c", code], timeout=300)
    assert child.returncode == -9
    model = tiny_gpt()
    with engine_for(model, lohand, max_grad_norm=1e-3,
                    job_name="unkilled") as engine:
        for step in batches(2):
            lm_loss(model, step[0]).backward()
            engine.step()
        want = engine.master_weights()
    resumed = tiny_gpt(seed=5)  # its weights come from the daemon
    with engine_for(resumed, lohand, max_grad_norm=1e-3,
                    job_name="killed-settling", resume=True) as engine:
        assert engine.iteration == 2
        got = engine.master_weights()
    for name, weight in want.items():
        assert torch.equal(weight, got[name]), name
