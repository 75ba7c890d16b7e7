"""Activation plans (one mode per block: offload, swap, keep) through a real
lohand: the same bits as keeping everything, whatever each block does, and
the swapped tensors really leave (host memory, beyond the budget the
SSDs)."""
from typing import Any, List, Sequence, Tuple

import pytest
import torch

import lohan
import lohan.activations
from test_engine import (batches, engine_for, lm_loss, tiny_gpt,
                         train_lohan)

_runs = iter(range(1 << 30))


@pytest.fixture(autouse=True)
def swap_small_tensors(monkeypatch):
    """The test model's tensors are a few KiB: swap everything over 1 KiB
    (more tensors through the store, views and all, than the default
    64 KiB would send)."""
    monkeypatch.setattr(lohan.activations, "_MIN_SWAP_BYTES", 1024)


def _train(lohand, activations, **options) -> Tuple[List[float],
                                                    List[torch.Tensor],
                                                    Any]:
    model = tiny_gpt()
    engine = engine_for(model, lohand, activations=activations,
                        job_name=f"plan-{next(_runs)}", **options)
    losses = train_lohan(engine, model, batches(4))
    stats = engine.activation_stats
    engine.close()
    return losses, [p.detach().clone() for p in model.parameters()], stats


def _assert_same(a, b, what: str) -> None:
    assert a[0] == b[0], what
    for x, y in zip(a[1], b[1]):
        assert torch.equal(x, y), what


@pytest.mark.parametrize("plan", [
    ["swap", "swap", "swap"],
    ["offload", "swap", "keep"],
    ["keep", "offload", "swap"],
])
def test_every_plan_gives_the_bits_of_keep(lohand, plan: Sequence[str]):
    keep = _train(lohand, "keep")
    planned = _train(lohand, list(plan))
    _assert_same(keep, planned, str(plan))
    stats = planned[2]
    swapped = plan.count("swap")
    if swapped:
        # Each swapped block's large saved tensors went to the store every
        # step and all came back (nothing held after backward).
        assert stats.host_puts >= 4 * swapped * 2
        assert stats.gets == stats.host_puts
    assert stats.host_bytes == 0


def test_swapped_tensors_beyond_the_host_budget_go_to_the_ssds(lohand):
    keep = _train(lohand, "keep")
    planned = _train(lohand, ["swap", "swap", "offload"],
                     activation_host_bytes=0)
    _assert_same(keep, planned, "swap to SSD")
    stats = planned[2]
    assert stats.ssd_puts > 0 and stats.host_puts == 0
    assert stats.ssd_bytes == 0  # all freed after each backward


def test_bad_plans_are_refused_by_name(lohand):
    for plan, says in ((["swap"], "the model has 3 blocks, the plan 1"),
                       (["swap", "teleport", "keep"],
                        "block 1's mode 'teleport'")):
        with pytest.raises(ValueError, match=says):
            engine_for(tiny_gpt(), lohand, activations=plan,
                       job_name="plan-bad")
    with pytest.raises(ValueError, match="activations='offload'"):
        engine_for(tiny_gpt(), lohand, activations=["swap", "offload",
                                                    "offload"],
                   params="offload", job_name="plan-bad")
    with lohan.Client(lohand.socket) as client:
        assert all(j.name != "plan-bad" for j in client.jobs())


def _train_hf(lohand, activations) -> Tuple[List[float], List[torch.Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    engine = lohan.init(model, lr=1e-2, socket=lohand.socket,
                        job_name=f"plan-hf-{next(_runs)}",
                        activations=activations)
    losses = []
    for ids in batches(3)[:, 0]:
        loss = lm_loss(model, ids)
        loss.backward()
        engine.step()
        losses.append(loss.item())
    engine.close()
    return losses, [p.detach().clone() for p in model.parameters()]


def test_a_hugging_face_model_under_a_plan_gives_the_bits_of_keep(lohand):
    """transformers' GPT-2 blocks (keyword arguments, dropout: the same
    masks either way since nothing is recomputed in a swapped block)."""
    keep = _train_hf(lohand, "keep")
    for plan in (["swap", "swap"], ["swap", "offload"]):
        _assert_same(keep, _train_hf(lohand, plan), str(plan))
