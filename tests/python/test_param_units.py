"""param_unit="sublayer" (params below the block): each block's
attention and MLP weights are daemon layers of their own, materialized on
the device only while that sublayer runs (forward, the block's replay, the
sublayer's recompute in backward) and handed over as soon as its backward
is done. The cut, training equal to torch AdamW, bf16 bit for bit the
whole block's, the device weight bound it buys, prefetching, resuming
across the cut, and refusals."""

from __future__ import annotations

import copy
import weakref
from typing import Any, Dict, List, Tuple

import pytest
import torch

import lohan
import lohan.sublayers
from lohan.options import EngineOptions
from test_engine import (assert_fp32_close, engine_for, train_lohan,
                         train_torch)
from test_sublayers import _gpt2 as _small_gpt2, _llama

transformers = pytest.importorskip("transformers")


def _gpt2(dropout: float = 0.1):
    return _small_gpt2(resid_pdrop=dropout, embd_pdrop=dropout,
                       attn_pdrop=dropout)


def _data(micro: int = 1) -> torch.Tensor:
    return torch.randint(0, 100, (3, micro, 2, 17),
                         generator=torch.Generator().manual_seed(3))


def test_each_sublayer_is_a_daemon_layer_of_its_own(lohand):
    model = _gpt2()
    with engine_for(model, lohand, params="offload", param_unit="sublayer",
                    job_name="units-cut") as engine:
        blocks = [(l.block, l.unit_index, l.names) for l in engine.layers
                  if l.block is not None]
        h = model.transformer.h
        # Per block its own layer (the norms), then attention, then MLP.
        assert [(b, u) for b, u, _ in blocks] == [
            (h[0], 0), (h[0], 1), (h[0], 2), (h[1], 0), (h[1], 1), (h[1], 2)]
        assert blocks[0][2] == ["transformer.h.0.ln_1.weight",
                                "transformer.h.0.ln_1.bias",
                                "transformer.h.0.ln_2.weight",
                                "transformer.h.0.ln_2.bias"]
        assert all(n.startswith("transformer.h.0.attn.")
                   for n in blocks[1][2])
        assert all(n.startswith("transformer.h.1.mlp.") for n in blocks[5][2])
        assert [l.unit for l in engine.layers[-3:]] == [None, h[1].attn,
                                                        h[1].mlp]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_training_with_weights_a_sublayer_at_a_time_equals_torch_adamw(
        lohand, monkeypatch, kind):
    """Dropout on (GPT-2)."""
    model = _gpt2() if kind == "gpt2" else _llama()
    reference = copy.deepcopy(model)
    data = _data()
    torch.manual_seed(0)
    ref_losses = train_torch(reference, data)
    checkpoints = []
    original = lohan.sublayers.checkpoint
    monkeypatch.setattr(lohan.sublayers, "checkpoint",
                        lambda *a, **k: checkpoints.append(1) or original(
                            *a, **k))
    torch.manual_seed(0)
    with engine_for(model, lohand, params="offload", param_unit="sublayer",
                    job_name=f"units-{kind}") as engine:
        losses = train_lohan(engine, model, data)
        fetched = engine._residency.fetches
    # Each block's two sublayers ran under a checkpoint in every step.
    assert len(checkpoints) == 3 * 2 * 2
    # One FETCH_PARAMS per block layer (own and units) and step: a buffer
    # per layer.
    assert fetched == 3 * 2 * 3
    noise = ({f"transformer.h.{i}.attn.c_attn.bias": slice(32, 64)
              for i in range(2)} if kind == "gpt2" else None)
    assert_fp32_close(model, reference, losses, ref_losses, noise)


def test_accumulated_steps_a_sublayer_at_a_time_are_the_blocks_bit_for_bit(
        lohand):
    """Two micro-batches a step, dropout on: the first pass's gradients
    wait on the parameters while their weights are released, and the
    second adds to them."""
    data = _data(micro=2)
    runs = []
    for unit in ("block", "sublayer"):
        model = _gpt2()
        torch.manual_seed(0)
        with engine_for(model, lohand, params="offload", param_unit=unit,
                        recompute_unit="sublayer", grad_accumulation_steps=2,
                        job_name=f"units-accumulate-{unit}") as engine:
            losses = train_lohan(engine, model, data)
        runs.append((losses, dict(model.named_parameters())))
    (block_losses, block_weights), (unit_losses, unit_weights) = runs
    assert unit_losses == block_losses
    for name, weight in block_weights.items():
        assert torch.equal(unit_weights[name], weight), name
    assert block_losses[-1] < block_losses[0]


def _bf16_run(lohand, kind: str, **options: Any) -> Tuple[
        List[float], Dict[str, torch.Tensor]]:
    model = _gpt2() if kind == "gpt2" else _llama()
    ids = torch.randint(0, 100, (2, 24),
                        generator=torch.Generator().manual_seed(3))
    losses = []
    name = kind + "-".join(f"{k}-{v}" for k, v in options.items())
    with lohan.init(model, socket=lohand.socket, lr=1e-2, dtype="bf16",
                    params="offload", job_name=f"units-bf16-{name}",
                    **options) as engine:
        torch.manual_seed(5)
        for _ in range(3):
            loss = model(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_bf16_weights_a_sublayer_at_a_time_are_the_blocks_bit_for_bit(
        lohand, kind):
    """The same operators on the same values: only where the weights live
    between uses differs (the block's bf16 steps are torch AdamW's within
    the suite's 16-bit tolerances, test_engine.py and test_sublayers.py)."""
    block_losses, block_weights = _bf16_run(lohand, kind,
                                            recompute_unit="sublayer")
    unit_losses, unit_weights = _bf16_run(lohand, kind, param_unit="sublayer")
    assert unit_losses == block_losses
    for name, weight in block_weights.items():
        assert torch.equal(unit_weights[name], weight), name
    assert block_losses[-1] < block_losses[0]


class _LiveWeights:
    """Counts the bytes of the weight copies the residency makes on the
    device while they are alive (a copy lives on after its release while
    autograd's recompute of a sublayer holds it), and their peak."""

    def __init__(self, residency: Any) -> None:
        self.live = self.peak = 0
        original = residency._to_device

        def counted(layer, source, device):
            flat, event = original(layer, source, device)
            nbytes = flat.numel() * flat.element_size()
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            # The storage's Python object lives as long as the storage
            # (torch keeps it with it): the parameters' views hold it.
            weakref.finalize(flat.untyped_storage(), self._freed, nbytes)
            return flat, event

        residency._to_device = counted

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes


class _FourPartBlock(torch.nn.Module):
    """A block of four sublayers (each an MLP, a quarter of its weights)
    and a norm of its own."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.part0, self.part1, self.part2, self.part3 = (
            torch.nn.Sequential(torch.nn.Linear(width, 2 * width),
                                torch.nn.GELU(),
                                torch.nn.Linear(2 * width, width))
            for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part in (self.part0, self.part1, self.part2, self.part3):
            x = x + part(self.norm(x))
        return x


class _FourPartLM(torch.nn.Module):
    def __init__(self, vocab: int = 100, width: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(_FourPartBlock(width)
                                          for _ in range(3))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _weight_peak(lohand, unit: str) -> Tuple[int, Dict[str, int]]:
    model = _FourPartLM()
    with engine_for(model, lohand, params="offload", param_unit=unit,
                    recompute_unit="sublayer",
                    job_name=f"units-peak-{unit}") as engine:
        live = _LiveWeights(engine._residency)
        train_lohan(engine, model, _data())
        peak = live.peak  # before close() gives every block its weights
        blocks = list(model.blocks)
        sizes = {f"{blocks.index(l.block)}/{l.unit_index}": l.numel * 4
                 for l in engine.layers if l.block is not None}
    return peak, sizes


def test_the_device_holds_two_sublayers_weights_not_a_blocks(lohand):
    """Weights a sublayer at a time: at most the block's own (its norm) and
    two units' weights on the device at once (the running one, or the one
    whose backward holds it, and the next, staged ahead): here half a
    block. A block at a time holds a whole block (on the CPU the next is
    staged once the running one is released)."""
    unit_peak, sizes = _weight_peak(lohand, "sublayer")
    block_peak, block_sizes = _weight_peak(lohand, "block")
    assert len(sizes) == 3 * 5  # per block its own layer and four units
    block = sum(sizes[f"0/{u}"] for u in range(5))
    assert block_sizes["0/0"] == block
    assert block_peak == block
    bound = sizes["0/0"] + 2 * sizes["0/1"]
    assert unit_peak <= bound, (unit_peak, bound)
    assert bound < 0.51 * block_peak


def test_a_units_gradients_leave_before_the_next_units_backward(lohand):
    """In the block's backward the MLP's gradients are handed over as soon
    as its backward is done, before the attention's recompute."""
    model = _gpt2()
    events: List[Tuple[str, int]] = []
    with engine_for(model, lohand, params="offload", param_unit="sublayer",
                    job_name="units-order") as engine:
        residency, router = engine._residency, engine._iteration.router
        materialize, hand_over = residency.materialize, router.hand_over

        def spy_materialize(module):
            layer = residency.layer_of(module)
            if layer is not None:
                events.append(("in", layer.index))
            materialize(module)

        def spy_hand_over(layer):
            events.append(("out", layer))
            hand_over(layer)

        residency.materialize = spy_materialize
        router.hand_over = spy_hand_over
        train_lohan(engine, model, _data()[:1])
        attn, mlp = (l.index for l in engine.layers[-2:])
    backward = events[events.index(("in", mlp)) + 1:]
    # The last block's backward: its MLP's recompute, its gradients out,
    # then the attention's recompute, its gradients out.
    last_mlp_in = len(backward) - 1 - backward[::-1].index(("in", mlp))
    assert backward.index(("out", mlp)) > last_mlp_in
    assert backward.index(("out", mlp)) < len(backward) - 1 - backward[
        ::-1].index(("in", attn))


def _second_step(lohand, job_name: str) -> Tuple[Dict[str, int],
                                                 Dict[Tuple[int, int], int]]:
    """The residency's counters over the second step (from which the
    previous step's order is known), and each block layer's bytes by
    (block, unit)."""
    model = _gpt2()
    with engine_for(model, lohand, params="offload", param_unit="sublayer",
                    job_name=job_name) as engine:
        residency = engine._residency
        data = _data()
        train_lohan(engine, model, data[:1])
        before = (residency.prefetched, residency.copied_bytes)
        train_lohan(engine, model, data[1:2])
        counters = {"prefetched": residency.prefetched - before[0],
                    "copied_bytes": residency.copied_bytes - before[1]}
        size = {(list(model.transformer.h).index(l.block), l.unit_index):
                4 * l.numel for l in engine.layers if l.block is not None}
    return counters, size


def test_from_the_second_step_each_unit_is_on_the_device_before_it_runs(
        lohand):
    counters, _ = _second_step(lohand, "units-prefetch")
    # Per block: forward 3, replay 3, recompute 2; all but the step's
    # first (block 0's own weights) staged ahead of their use.
    assert counters["prefetched"] == 2 * 8 - 1


def test_a_checkpoint_of_whole_blocks_resumes_a_sublayer_at_a_time(
        lohand, tmp_path):
    """Checkpoints go by parameter name: the cut may change between save
    and resume, and training goes on exactly as with whole blocks."""
    data = _data()
    first = _gpt2(dropout=0.0)
    with engine_for(first, lohand, params="offload",
                    job_name="units-save") as engine:
        train_lohan(engine, first, data[:2])
        engine.save(tmp_path / "ckpt", optimizer_state=True)
    runs = {}
    for unit in ("block", "sublayer"):
        model = _gpt2(dropout=0.0)
        with engine_for(model, lohand, params="offload", param_unit=unit,
                        resume=str(tmp_path / "ckpt"),
                        job_name=f"units-resume-{unit}") as engine:
            assert engine.iteration == 2
            losses = train_lohan(engine, model, data[2:])
        runs[unit] = (losses, dict(model.named_parameters()))
    assert runs["sublayer"][0] == runs["block"][0]
    for name, weight in runs["block"][1].items():
        assert torch.equal(runs["sublayer"][1][name], weight), name


@pytest.mark.parametrize("unit", ["linear", "", None, 1])
def test_an_unknown_param_unit_is_refused_naming_the_option(unit):
    with pytest.raises(ValueError, match="param_unit="):
        EngineOptions(param_unit=unit)


def test_param_units_need_offloaded_params(lohand):
    with pytest.raises(ValueError, match="param_unit='sublayer'.*"
                       "params='offload'"):
        engine_for(_gpt2(), lohand, params="resident",
                   param_unit="sublayer", job_name="units-resident")


def test_under_the_activation_plan_weights_a_sublayer_at_a_time_stay_exact(
        lohand):
    """activations="auto": the first step profiles, lohand plans (with
    offloaded weights every block stays "offload", whatever the plan
    says); the steps are those of activations="offload", bit for bit."""
    from test_plan_job import wait_for_profile
    with lohan.Client(lohand.socket) as client:
        wait_for_profile(client)
    data = _data()
    runs = []
    for activations in ("offload", "auto"):
        model = _gpt2()
        torch.manual_seed(0)
        with engine_for(model, lohand, params="offload", param_unit="sublayer",
                        activations=activations,
                        job_name=f"units-plan-{activations}") as engine:
            losses = train_lohan(engine, model, data)
            plan = engine.activation_plan
        runs.append((losses, dict(model.named_parameters()), plan))
    (losses, weights, _), (plan_losses, plan_weights, plan) = runs
    assert plan is not None and len(plan["blockModes"]) == 2
    assert plan_losses == losses
    for name, weight in weights.items():
        assert torch.equal(plan_weights[name], weight), name


def test_the_plan_counts_the_weights_a_sublayer_at_a_time(lohand):
    """activations="auto" with param_unit="sublayer" on a device with
    room for two sublayers' weights but not two whole blocks': lohand
    plans with the job's own unit (from the layers it registered), so the
    plan comes, and training matches torch AdamW as without a plan. The
    two working sets are the plan's own figures from a roomy device."""
    from test_plan_job import wait_for_profile
    with lohan.Client(lohand.socket) as client:
        wait_for_profile(client)
    data = _data()
    model = _gpt2()
    with engine_for(model, lohand, params="offload", param_unit="sublayer",
                    activations="auto", device_memory_bytes=1 << 40,
                    job_name="units-plan-roomy") as engine:
        train_lohan(engine, model, data[:2])
        roomy = engine.activation_plan
    assert roomy is not None and roomy["paramUnit"] == "sublayer"
    units = int(roomy["deviceWorkingBytes"])
    blocks = int(roomy["blockWeightsWorkingBytes"])
    assert units < blocks
    budget = (units + blocks) // 2
    model = _gpt2()
    reference = copy.deepcopy(model)
    torch.manual_seed(0)
    ref_losses = train_torch(reference, data)
    torch.manual_seed(0)
    with engine_for(model, lohand, params="offload", param_unit="sublayer",
                    activations="auto", device_memory_bytes=budget,
                    job_name="units-plan-tight") as engine:
        losses = train_lohan(engine, model, data)
        plan = engine.activation_plan
    assert plan is not None, "lohand refused the plan"
    assert plan["paramUnit"] == "sublayer"
    assert int(plan["deviceWorkingBytes"]) == units <= budget
    assert int(plan["blockWeightsWorkingBytes"]) == blocks > budget
    assert int(plan["deviceBytes"]) <= budget - units
    noise = {f"transformer.h.{i}.attn.c_attn.bias": slice(32, 64)
             for i in range(2)}
    assert_fp32_close(model, reference, losses, ref_losses, noise)


def test_the_weights_on_the_device_are_what_the_plan_counts(lohand,
                                                            tmp_path):
    """GPT-2 in bf16: the peak of the weights on the device against the
    weights in `lohanctl plan`'s always-part (two sublayers' and two
    blocks' own; the rest of that part is the head's weights and
    gradients), within test_working_set.py's 10%."""
    from test_working_set import TOLERANCE, _planned
    model = _gpt2(dropout=0.0)
    with engine_for(model, lohand, params="offload", param_unit="sublayer",
                    dtype="bf16", job_name="units-planned") as engine:
        live = _LiveWeights(engine._residency)
        train_lohan(engine, model, _data())
        measured = live.peak
    config = model.config
    plan = _planned(tmp_path, "--param-unit", "sublayer", device="80GiB",
                    config=config, batch=2, seq=16)
    assert plan["param_unit"] == "sublayer"
    head = 2 * 2 * config.vocab_size * config.n_embd
    planned = plan["always"] - head
    assert abs(measured - planned) <= TOLERANCE * planned, (measured, planned)


def test_resuming_a_job_with_another_unit_is_refused_saying_why(lohand):
    """The units are daemon layers: the job's layout. A job made a block
    at a time does not resume a sublayer at a time (a checkpoint does)."""
    model = _gpt2()
    with engine_for(model, lohand, params="offload",
                    job_name="units-layout") as engine:
        train_lohan(engine, model, _data()[:1])
        engine.close(delete_job=False)
    with pytest.raises(lohan.LohanError, match="another model layout.*"
                       "param_unit.*resume=dir"):
        engine_for(_gpt2(), lohand, params="offload", param_unit="sublayer",
                   resume=True, job_name="units-layout")


def test_state_dict_between_steps_holds_every_sublayers_weights(lohand):
    """Between steps a sublayer's parameters are placeholders: the model's
    state_dict gets each unit layer's weights from the daemon."""
    states = []
    for unit in ("block", "sublayer"):
        model = _gpt2()
        torch.manual_seed(0)
        with engine_for(model, lohand, params="offload", param_unit=unit,
                        recompute_unit="sublayer",
                        job_name=f"units-state-{unit}") as engine:
            train_lohan(engine, model, _data()[:2])
            assert model.transformer.h[0].mlp.c_fc.weight.numel() == 0
            states.append({k: v.clone() for k, v in
                           model.state_dict().items()})
    assert states[0].keys() == states[1].keys()
    for name, value in states[0].items():
        assert torch.equal(states[1][name], value), name
    assert states[1]["transformer.h.1.mlp.c_proj.weight"].shape == (128, 32)


def test_the_schedule_follows_the_last_step_and_stops_where_it_departs():
    from lohan.params import Schedule
    schedule = Schedule()
    schedule.new_step()
    assert not schedule.following  # no step recorded yet
    for layer in (2, 3, 4, 4, 3, 2):
        schedule.enter(layer)
    schedule.new_step()
    assert schedule.following and schedule.next() == 2
    schedule.enter(2)
    assert (schedule.next(), schedule.next(2)) == (3, 4)
    schedule.enter(3)
    schedule.enter(2)  # not what the last step did
    assert not schedule.following
    schedule.new_step()  # this step's record: 2, 3, 2
    schedule.enter(2)
    assert schedule.next() == 3
    # A step too long to record predicts nothing for the next.
    for _ in range(Schedule.LIMIT + 1):
        schedule.enter(5)
    schedule.new_step()
    assert not schedule.following


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_bf16_weights_a_sublayer_at_a_time_match_fp32_master_adamw(lohand,
                                                                  kind):
    """The suite's 16-bit reference (test_engine.py): torch AdamW on fp32
    masters, the bf16 model for forward and backward, the masters rounded
    into it after each step; losses and masters within the suite's 16-bit
    tolerances."""
    from test_engine import (BETAS, EPS, LR, SIXTEEN_LOSS_RTOL,
                             SIXTEEN_MASTER_RTOL_AFTER, WD, lm_loss)
    model = (_gpt2(dropout=0.0) if kind == "gpt2" else _llama()).to(
        torch.bfloat16)
    ref_model = copy.deepcopy(model)
    masters = {n: p.detach().float().clone().requires_grad_()
               for n, p in ref_model.named_parameters()}
    opt = torch.optim.AdamW(masters.values(), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WD)
    losses, ref_losses = [], []
    with engine_for(model, lohand, params="offload", param_unit="sublayer",
                    loss_scale=1.0, job_name=f"units-16-{kind}") as engine:
        for step in _data():
            loss = lm_loss(ref_model, step[0])
            loss.backward()
            ref_losses.append(loss.item())
            for name, param in ref_model.named_parameters():
                masters[name].grad = param.grad.float()
                param.grad = None
            opt.step()
            with torch.no_grad():
                for name, param in ref_model.named_parameters():
                    param.copy_(masters[name])
            loss = lm_loss(model, step[0])
            engine.backward(loss)
            losses.append(loss.item())
            engine.step()
        ours = engine.master_weights()
    worst = max(((ours[name] - master.detach()).abs().max() /
                 master.detach().abs().max()).item()
                for name, master in masters.items())
    assert worst <= SIXTEEN_MASTER_RTOL_AFTER, worst
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= SIXTEEN_LOSS_RTOL * abs(b), (losses, ref_losses)


def test_a_layer_run_again_at_once_keeps_its_weights_on_the_device(lohand):
    """From the second step: a block's last sublayer from the block's
    recompute into its own, and the last block's own weights from forward
    into its recompute, do not cross the link again; the rest does, once
    per run."""
    counters, size = _second_step(lohand, "units-reuse")
    copied = counters["copied_bytes"]
    own, attention, mlp = (size[(0, u)] for u in range(3))
    forward = 2 * (own + attention + mlp)
    # Block 1: attention twice (the block's recompute, its own), the MLP
    # once; block 0 the same and its own weights.
    backward = (2 * attention + mlp) + (own + 2 * attention + mlp)
    assert copied == forward + backward
