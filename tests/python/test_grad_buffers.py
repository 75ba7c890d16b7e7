"""Gradients accumulated into one buffer per layer (lohan/grad_buffers.py,
what the router does on a GPU): every parameter's `.grad` a view of it,
handed over as it is, the same values as the concatenated gradients; a
`.grad` cleared or replaced meanwhile, and a parameter without one, are
handled; training through it is the unbuffered training bit for bit."""

from __future__ import annotations

import functools
import warnings
from typing import List

import torch

import lohan.iteration
from lohan.hooks import GradientRouter
from test_engine import batches, engine_for, tiny_gpt, train_lohan
from test_layer_plan import LM, plan


def _router(buffered: bool):
    torch.manual_seed(0)
    model = LM(tied=False)
    layers = plan(model)
    views = [torch.zeros(layer.numel) for layer in layers]
    order: List[int] = []
    router = GradientRouter(layers, views, 1, grad_ready=order.append,
                            buffered=buffered)
    return model, layers, views, order, router


def test_every_grad_of_a_layer_is_a_view_of_one_buffer_handed_over_whole():
    torch.manual_seed(0)
    model = LM(tied=False)
    layers = plan(model)
    seen = {}
    # Each storage held to the end: a buffer handed over and freed could
    # otherwise come back at the same address as the next layer's.
    alive = []

    def look(layer_index: int):
        def hook(param: torch.Tensor) -> None:
            storage = param.grad.untyped_storage()
            alive.append(storage)
            seen.setdefault(layer_index, set()).add(storage.data_ptr())
        return hook

    # Before the router's: they run first, before a hand-over clears them.
    looks = [param.register_post_accumulate_grad_hook(look(layer.index))
             for layer in layers for param in layer.params]
    views = [torch.zeros(layer.numel) for layer in layers]
    order: List[int] = []
    router = GradientRouter(layers, views, 1, grad_ready=order.append,
                            buffered=True)
    try:
        ids = torch.randint(0, 11, (2, 5))
        model(ids).square().mean().backward()
    finally:
        router.remove()
        for handle in looks:
            handle.remove()
    assert order == [1, 4, 3, 2, 0]
    # One storage per layer, its buffer; a layer's own.
    assert sorted(seen) == [0, 1, 2, 3, 4]
    assert all(len(storages) == 1 for storages in seen.values())
    assert len(set.union(*seen.values())) == len(layers)


def test_the_buffer_holds_what_the_gradients_would_have_been():
    runs = []
    for buffered in (False, True):
        model, layers, views, order, router = _router(buffered)
        try:
            ids = torch.randint(0, 11, (2, 5),
                                generator=torch.Generator().manual_seed(1))
            for _ in range(2):  # two backward passes into one step's slot
                router.reset()
                model(ids).square().mean().backward()
        finally:
            router.remove()
        runs.append([view.clone() for view in views])
        assert all(p.grad is None for p in model.parameters())
    for plain, buffered in zip(*runs):
        assert torch.equal(plain, buffered)


def test_a_grad_cleared_or_replaced_meanwhile_and_one_never_made():
    model, layers, views, order, router = _router(buffered=True)
    head = layers[1]
    try:
        ids = torch.randint(0, 11, (2, 5))
        # Two passes without a hand-over between them (accumulation).
        router._steps = 2
        model(ids).square().mean().backward()
        weight = head.params[-1]
        weight.grad = torch.full_like(weight, 3.0)  # replaced
        head.params[0].grad = None                   # cleared
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model(ids).square().mean().backward()
    finally:
        router.remove()
    slot = views[1]
    offset = head.offsets[-1]
    # The replaced .grad, then the second pass added in place... into the
    # replacement (autograd accumulates into whatever .grad is).
    assert torch.all(slot[offset:] > 2.0)
    assert all(p.grad is None for p in model.parameters())


def test_training_through_buffers_is_the_unbuffered_training_bit_for_bit(
        lohand, monkeypatch):
    """params="offload" a sublayer at a time, two micro-batches a step:
    buffers made at a layer's first gradient, kept across the passes,
    handed over whole."""
    data = batches(3, micro=2)
    runs = []
    for buffered in (False, True):
        if buffered:
            monkeypatch.setattr(
                lohan.iteration, "GradientRouter",
                functools.partial(GradientRouter, buffered=True))
        model = tiny_gpt(sublayers=True)
        with engine_for(model, lohand, params="offload",
                        param_unit="sublayer", grad_accumulation_steps=2,
                        job_name=f"buffers-{buffered}") as engine:
            assert (engine._iteration.router._buffers is not None) == (
                buffered)
            losses = train_lohan(engine, model, data)
            masters = engine.master_weights()
        runs.append((losses, masters))
    (plain_losses, plain), (losses, masters) = runs
    assert losses == plain_losses
    for name, weight in plain.items():
        assert torch.equal(masters[name], weight), name
