"""Training through the chunked loss in several chunks against the model's
own loss under torch AdamW, on seeded random hyperparameter configurations
(issue #51): lohan's gap to torch AdamW(foreach=True) stays within 3x
torch's own spread, AdamW(fused=True) against AdamW(foreach=True), on the
same model, loss and data.

The chunk is the default rule's (lohan.chunked_loss.chunk_tokens_for) under
a budget of BUDGET_ROWS rows of fp32 logits, rounded down to 8: a
micro-batch's 30 tokens make chunks of 8, 8, 8 and 6, the last made over a
window of 8 rows, so every head product is over 8 rows.

Measured (8 draws, 6 steps, this project's CPU: an AVX-512 AMD EPYC, MKL,
2 threads): gap at most 0.46 of the bound (largest 6.4e-6, spread 1.5e-7
to 4.6e-6). The test fails without the rounding: chunks of 5 exceed the
bound in 5 of 8 draws (gap up to 8.4e-5), chunks of 8 whose last 6 rows
make their own product in 4 of 8 (up to 9.9e-5): MKL rounds a row of a
product of a few rows, not a multiple of 4, differently from the model's
30-row product (test_chunked_loss.py,
test_chunks_of_multiples_of_8_rows_give_the_models_row_gradients).

Measure: after N_STEPS steps, per parameter tensor max|w - w_ref| over
max|w_ref|, the largest over the model.

Floor: torch's spread can be 0 where fused and foreach round alike, and
lohan's gap is never 0: the daemon's Adam rounds differently from torch's
(a few ulps of a weight per step, test_optim_torch.py) and the chunked loss
adds the loss and the head's weight gradient in another order (ulps,
test_chunked_loss.py). So the bound is 3x max(spread, FLOOR), FLOOR = 1e-6
relative: about 8 fp32 ulps (eps 1.19e-7) of a tensor's largest element,
the few ulps a step of either rounding gives, not grown by training.

Excluded by construction, not tuned: GPT-2's attention key bias (true
gradient 0, computed gradient rounding noise that Adam turns into steps of
up to lr, test_engine.py): both torch runs take the same gradients so
their spread never sees it, while any rounding difference upstream moves
it; it is bounded by 2 * lr * steps as in the rest of the suite.
"""

from __future__ import annotations

import contextlib
import copy
import random
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Tuple

import pytest
import torch
from torch import nn

import lohan
from lohan import causal_lm, chunked_loss
from test_chunked_loss import VOCAB, _batch, _model
from test_engine import BETAS, EPS, FP32_LOSS_RTOL, LR, WD, engine_for

transformers = pytest.importorskip("transformers")

N_STEPS = 6
N_CONFIGS = 8
FLOOR = 1e-6
FACTOR = 3.0
# A micro-batch: ROWS sequences of SEQ tokens (30, not a multiple of 8:
# chunks of 8, 8, 8 and 6, the last 6 with counted labels).
SEQ, ROWS = 15, 2
# The default chunk's budget, in rows of fp32 logits: 13, rounded down to
# the chunk of 8 rows.
BUDGET_ROWS, CHUNK = 13, 8
# The first seed of the N_CONFIGS drawn (a run of 8 that covers every
# option, test_the_configurations_cover_every_option).
FIRST_SEED = 16

Batch = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class Config:
    """One draw of lohan.init's options that shape the arithmetic."""

    seed: int
    kind: str  # "gpt2" or "llama"
    lr: float
    betas: Tuple[float, float]
    eps: float
    weight_decay: float
    max_grad_norm: float  # 0: no clipping
    groups: bool  # blocks[1] its own lr and weight decay; "1d" not decayed
    accumulation: int  # micro-batches a step
    params: str  # "resident" or "offload"
    unit: str  # "block" or "sublayer" (param_unit when offloaded)

    def lohan_options(self) -> Dict[str, object]:
        options: Dict[str, object] = dict(
            lr=self.lr, betas=self.betas, eps=self.eps,
            weight_decay=self.weight_decay,
            max_grad_norm=self.max_grad_norm,
            grad_accumulation_steps=self.accumulation, params=self.params,
            job_name=f"spread-{self.seed}")
        if self.unit == "sublayer":
            key = "param_unit" if self.params == "offload" else (
                "recompute_unit")
            options[key] = "sublayer"
        return options


def draw(seed: int) -> Config:
    """A configuration from a generator seeded with `seed`."""
    rng = random.Random(seed)
    params = rng.choice(["resident", "offload"])
    return Config(
        seed=seed, kind=rng.choice(["gpt2", "llama"]),
        lr=10 ** rng.uniform(-4, -2),
        betas=(rng.choice([0.8, 0.9, 0.95]),
               rng.choice([0.95, 0.99, 0.999])),
        eps=10 ** rng.uniform(-10, -6),
        weight_decay=rng.choice([0.0, 0.01, 0.1]),
        max_grad_norm=rng.choice([0.0, 0.5, 5.0]),
        groups=rng.random() < 0.5, accumulation=rng.choice([1, 2, 3]),
        params=params, unit=rng.choice(["block", "sublayer"]))


CONFIGS = [draw(seed) for seed in range(FIRST_SEED, FIRST_SEED + N_CONFIGS)]


def test_the_configurations_cover_every_option():
    """The seeded draws reach each option's values (a changed generator
    that stops covering one fails here, not silently)."""
    assert {c.kind for c in CONFIGS} == {"gpt2", "llama"}
    assert {c.params for c in CONFIGS} == {"resident", "offload"}
    assert {(c.params, c.unit) for c in CONFIGS} >= {
        ("offload", "sublayer"), ("resident", "sublayer")}
    assert {c.groups for c in CONFIGS} == {False, True}
    assert {c.accumulation for c in CONFIGS} >= {1, 2}
    assert {c.max_grad_norm for c in CONFIGS} >= {0.0, 0.5}
    assert len({c.weight_decay for c in CONFIGS}) >= 2
    assert len({c.betas for c in CONFIGS}) >= 3


def batches(config: Config) -> List[List[Batch]]:
    """N_STEPS steps of `accumulation` micro-batches, each ROWS sequences
    of SEQ tokens, the first padded on the right (label -100, attention
    mask 0) and one label of the second ignored."""
    g = torch.Generator().manual_seed(100 + config.seed)
    steps = []
    for _ in range(N_STEPS):
        micro = []
        for _ in range(config.accumulation):
            ids = torch.randint(2, VOCAB, (ROWS, SEQ), generator=g)
            pad = int(torch.randint(6, SEQ, (), generator=g))
            mask = torch.ones_like(ids)
            mask[0, pad:] = 0
            labels = ids.clone()
            labels[0, pad:] = -100
            labels[1, int(torch.randint(0, SEQ, (), generator=g))] = -100
            micro.append({"input_ids": ids, "attention_mask": mask,
                          "labels": labels})
        steps.append(micro)
    return steps


def torch_groups(model: nn.Module, config: Config) -> List[Dict[str, object]]:
    """torch AdamW's groups for lohan.init's: the rest at the defaults,
    with "1d" parameters not decayed when groups are on."""
    if not config.groups:
        return [{"params": list(model.parameters())}]
    block = list(_blocks(model)[1].parameters())
    inside = {id(p) for p in block}
    rest = [p for p in model.parameters() if id(p) not in inside]
    return [{"params": [p for p in rest if p.dim() >= 2]},
            {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
            {"params": block, **_group_hyper(config)}]


def _group_hyper(config: Config) -> Dict[str, float]:
    return {"lr": 3 * config.lr, "weight_decay": 0.3 * config.weight_decay}


def _blocks(model: nn.Module) -> nn.ModuleList:
    return (model.transformer.h if hasattr(model, "transformer")
            else model.model.layers)


def train(model: nn.Module, data: List[List[Batch]],
          backward: Callable[[torch.Tensor], None],
          step: Callable[[], None]) -> List[float]:
    losses = []
    for micro in data:
        for batch in micro:
            loss = model(**batch).loss / len(micro)
            backward(loss)
            losses.append(loss.item())
        step()
    return losses


def train_torch(model: nn.Module, data: List[List[Batch]], config: Config,
                implementation: str) -> List[float]:
    """torch AdamW on the model's own loss; implementation "foreach" or
    "fused"."""
    opt = torch.optim.AdamW(torch_groups(model, config), lr=config.lr,
                            betas=config.betas, eps=config.eps,
                            weight_decay=config.weight_decay,
                            **{implementation: True})

    def step() -> None:
        if config.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(),
                                           config.max_grad_norm)
        opt.step()
        opt.zero_grad()

    return train(model, data, lambda loss: loss.backward(), step)


def train_lohan(model: nn.Module, data: List[List[Batch]], config: Config,
                socket: str) -> List[float]:
    options = config.lohan_options()
    if config.groups:
        options.update(no_weight_decay="1d", param_groups=[
            {"params": list(_blocks(model)[1].parameters()),
             **_group_hyper(config)}])
    with lohan.init(model, socket=socket, **options) as engine:
        losses = train(model, data, engine.backward, engine.step)
        assert model(**data[0][0]).logits is None  # chunked while training
        # Several chunks of CHUNK rows (one chunk holds no accumulator).
        width = model.get_output_embeddings().in_features
        assert engine._loss.working_bytes == chunked_loss.working_bytes(
            CHUNK, ROWS * SEQ, VOCAB, width)
    return losses


def _noise(model: nn.Module) -> Dict[str, slice]:
    """GPT-2's key bias elements (true gradient 0): see the top."""
    if not hasattr(model, "transformer"):
        return {}
    width = model.config.n_embd
    return {f"transformer.h.{i}.attn.c_attn.bias": slice(width, 2 * width)
            for i in range(len(_blocks(model)))}


def max_relative(model: nn.Module, reference: nn.Module,
                 noise: Dict[str, slice]) -> Tuple[float, str]:
    """The largest per-tensor max|w - w_ref| / max|w_ref|, and where,
    `noise`'s elements left out."""
    ref = dict(reference.named_parameters())
    worst, where = 0.0, ""
    for name, param in model.named_parameters():
        got, want = param.detach().clone(), ref[name].detach().clone()
        if name in noise:
            got[noise[name]] = want[noise[name]] = 0
        gap = ((got - want).abs().max() / want.abs().max()).item()
        if gap > worst:
            worst, where = gap, name
    return worst, where


def _noise_gap(model: nn.Module, reference: nn.Module,
               noise: Dict[str, slice]) -> float:
    ref = dict(reference.named_parameters())
    return max([(p.detach()[noise[n]] - ref[n].detach()[noise[n]]).abs()
                .max().item() for n, p in model.named_parameters()
                if n in noise], default=0.0)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"seed{c.seed}")
def test_several_chunks_train_within_torchs_own_adamw_spread(
        lohand, monkeypatch, config):
    monkeypatch.setattr(chunked_loss, "DEFAULT_CHUNK_LOGIT_BYTES",
                        4 * VOCAB * BUDGET_ROWS)
    assert chunked_loss.default_chunk_tokens(VOCAB) == CHUNK
    start = _model(config.kind)
    data = batches(config)
    foreach, fused, ours = (copy.deepcopy(start) for _ in range(3))
    want = train_torch(foreach, data, config, "foreach")
    train_torch(fused, data, config, "fused")
    got = train_lohan(ours, data, config, lohand.socket)
    noise = _noise(start)
    spread, spread_at = max_relative(fused, foreach, noise)
    gap, gap_at = max_relative(ours, foreach, noise)
    bound = FACTOR * max(spread, FLOOR)
    loss_gap = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    report = (f"{config}: lohan gap {gap:.3g} ({gap_at}), torch fused vs "
              f"foreach spread {spread:.3g} ({spread_at}), bound "
              f"{bound:.3g}; losses within {loss_gap:.3g}")
    print(report)
    assert gap <= bound, report
    assert _noise_gap(ours, foreach, noise) <= 2 * config.lr * N_STEPS, (
        report)


# ------------------------------------- through the same loss as the reference


@pytest.mark.parametrize("kind,params", [
    ("gpt2", "resident"), ("gpt2", "offload"), ("llama", "resident"),
    ("llama", "offload")])
def test_the_same_chunked_loss_trains_as_torch_adamw(lohand, kind, params):
    """Both torch runs train through the chunked loss lohan installs
    (chunks of 5 rows), so the gap is lohan's engine and Adam alone; the
    bound is the same 3x torch's own spread as above. The check can fail:
    the untrained model is far outside it."""
    start = _model(kind)
    foreach, fused, one_thread, ours = (copy.deepcopy(start)
                                        for _ in range(4))
    references = []
    for reference, implementation, threads in (
            (foreach, "foreach", torch.get_num_threads()),
            (fused, "fused", torch.get_num_threads()),
            (one_thread, "foreach", 1)):
        causal_lm.install(reference, True, 5)
        opt = torch.optim.AdamW(reference.parameters(), lr=LR, betas=BETAS,
                                eps=EPS, weight_decay=WD,
                                **{implementation: True})

        def torch_step(loss: torch.Tensor) -> None:
            loss.backward()
            opt.step()
            opt.zero_grad()

        with _threads(threads):
            references.append(_train(reference, torch_step))
    with engine_for(ours, lohand, params=params, loss_chunk_tokens=5,
                    job_name=f"chunked-{kind}-{params}") as engine:
        def lohan_step(loss: torch.Tensor) -> None:
            engine.backward(loss)
            engine.step()

        got = _train(ours, lohan_step)
        assert ours(**_batch()).logits is None  # chunked while training
    assert "forward" not in vars(ours)  # close() gave the forward back
    noise = _noise(start)
    spread = max(max_relative(fused, foreach, noise)[0],
                 max_relative(one_thread, foreach, noise)[0])
    gap, gap_at = max_relative(ours, foreach, noise)
    bound = FACTOR * max(spread, FLOOR)
    print(f"{kind} {params}: gap {gap:.3g} ({gap_at}), spread {spread:.3g}")
    assert gap <= bound, (gap, gap_at, spread)
    assert _noise_gap(ours, foreach, noise) <= 2 * LR * len(got)
    assert max(abs(a - b) / abs(b) for a, b in zip(got, references[0])) <= (
        FP32_LOSS_RTOL)
    assert max_relative(start, foreach, noise)[0] > bound


def _train(model: nn.Module, step: Callable[[torch.Tensor], None],
           steps: int = 3) -> List[float]:
    losses = []
    for _ in range(steps):
        loss = model(**_batch()).loss
        step(loss)
        losses.append(loss.item())
    return losses


@contextlib.contextmanager
def _threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to `count` for the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
