"""A recomputed block's backward a sublayer at a time
(`recompute_unit="sublayer"`): while backward makes a block's forward
again, each of its sublayers (attention, MLP) runs under a non-reentrant
checkpoint, so the block's backward holds what lies between the sublayers
(their inputs, the residual stream) and one sublayer's saved tensors at a
time, made again just before its own backward. The price: each
sublayer's forward a third time. The arithmetic is the same: the
sublayers replay the same operators, random ones from the same RNG state.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

UNITS = ("block", "sublayer")

# A sublayer holds at least this share of its block's parameters and less
# than SUBLAYER_MAX (a child holding nearly all is the block again).
SUBLAYER_MIN, SUBLAYER_MAX = 0.1, 0.9


def check_unit(unit: object) -> str:
    if unit not in UNITS:
        raise ValueError(f"recompute_unit={unit!r}: use 'block' (the "
                         "default) or 'sublayer' (a recomputed block's "
                         "backward one attention or MLP at a time)")
    return unit


def sublayers(block: nn.Module) -> List[nn.Module]:
    """The block's children recomputed one at a time: those holding a
    tenth to nine tenths of its parameters that are modules of modules
    (attention, MLP). A norm holds too few; a lone Linear saves only its
    input, which its checkpoint would keep as well."""
    total = sum(p.numel() for p in block.parameters())
    parts = []
    for child in block.children():
        held = sum(p.numel() for p in child.parameters())
        if (SUBLAYER_MIN * total <= held < SUBLAYER_MAX * total
                and next(child.children(), None) is not None):
            parts.append(child)
    return parts


def one_at_a_time(function: Callable[..., Any],
                  block: nn.Module) -> Callable[..., Any]:
    """`function` (the block's forward) with, while it runs with gradients,
    each of the block's sublayers under a non-reentrant checkpoint.
    Without sublayers, `function` itself."""
    parts = sublayers(block)
    if not parts:
        return function

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return function(*args, **kwargs)
        owned = [(part, vars(part).get("forward")) for part in parts]
        for part in parts:
            part.forward = _checkpointed(part.forward)
        try:
            return function(*args, **kwargs)
        finally:
            for part, own in owned:
                if own is not None:
                    part.forward = own
                else:
                    del part.forward

    return run


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
