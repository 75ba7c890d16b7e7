"""How lohan.init cuts a model into daemon layers (lohan.blocks.plan_layers)
and in which order backward hands them over (lohan.hooks.GradientRouter):
the parameters outside the blocks are split into the ones before the blocks
(embeddings) and the ones after them (final norm, head), so the head's
update runs while backward goes on instead of after it. No daemon needed."""

from __future__ import annotations

from typing import List

import torch
from torch import nn

from lohan.blocks import find_blocks, plan_layers
from lohan.hooks import GradientRouter


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


class LM(nn.Module):
    """Embeddings, blocks, final norm and a head, tied or not; a scale on
    the model itself (a parameter no submodule owns)."""

    def __init__(self, tied: bool, vocab: int = 11, dim: int = 8):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(3))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) * self.scale
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x))


def plan(model: nn.Module):
    return plan_layers(model, find_blocks(model))


def test_untied_head_and_final_norm_form_the_layer_after_the_blocks():
    model = LM(tied=False)
    layers = plan(model)
    assert [layer.names for layer in layers[:2]] == [
        ["scale", "embed.weight"],
        ["norm.weight", "norm.bias", "head.weight"]]
    assert all(layer.block is None for layer in layers[:2])
    assert [layer.block for layer in layers[2:]] == list(model.layers)
    assert [layer.index for layer in layers] == list(range(5))
    assert layers[2].names[0] == "layers.0.norm.weight"


def test_a_tied_head_stays_with_the_embeddings():
    model = LM(tied=True)
    layers = plan(model)
    # named_parameters() gives the shared weight once, as embed.weight: its
    # gradient is complete only when backward reaches the embeddings.
    assert layers[0].names == ["scale", "embed.weight"]
    assert layers[1].names == ["norm.weight", "norm.bias"]
    assert layers[0].params[1] is model.head.weight


def test_a_model_without_parameters_after_the_blocks_has_one_rest_layer():
    model = LM(tied=True)
    model.norm = nn.Identity()
    layers = plan(model)
    assert layers[0].names == ["scale", "embed.weight"]
    assert layers[1].block is model.layers[0]
    assert len(layers) == 4


def test_backward_hands_the_head_over_first_and_the_embeddings_last():
    torch.manual_seed(0)
    model = LM(tied=False)
    layers = plan(model)
    views = [torch.zeros(layer.numel) for layer in layers]
    order: List[int] = []
    router = GradientRouter(layers, views, 1, grad_ready=order.append)
    try:
        ids = torch.randint(0, 11, (2, 5))
        model(ids).square().mean().backward()
    finally:
        router.remove()
    # Head and final norm, the blocks last to first, then the embeddings.
    assert order == [1, 4, 3, 2, 0]
    for layer, view in zip(layers, views):
        assert torch.count_nonzero(view) > 0, layer.names
