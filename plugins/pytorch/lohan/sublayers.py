"""A recomputed block's backward a sublayer at a time
(`recompute_unit="sublayer"`): while backward makes a block's forward
again, each of its sublayers (attention, MLP) runs under a non-reentrant
checkpoint, so the block's backward holds what lies between the sublayers
(their inputs, the residual stream) and one sublayer's saved tensors at a
time, made again just before its own backward. The price: each
sublayer's forward a third time. The arithmetic is the same: the
sublayers replay the same operators, random ones from the same RNG state.

With weights streamed a sublayer at a time (`param_unit="sublayer"`,
params.py) each sublayer's weights are held around each of its runs,
forward included; its checkpoint's recompute holds them too, so its
backward finds them.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

UNITS = ("block", "sublayer")

# A sublayer holds at least this share of its block's parameters and less
# than SUBLAYER_MAX (a child holding nearly all is the block again).
SUBLAYER_MIN, SUBLAYER_MAX = 0.1, 0.9


_MEANING = {
    "recompute_unit": "a recomputed block's backward one attention or MLP "
                      "at a time",
    "param_unit": "offloaded weights streamed one attention or MLP at a "
                  "time",
}


def check_unit(unit: object, option: str) -> str:
    if unit not in UNITS:
        raise ValueError(f"{option}={unit!r}: use 'block' (the default) or "
                         f"'sublayer' ({_MEANING[option]})")
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


def one_at_a_time(function: Callable[..., Any], parts: List[nn.Module],
                  weights: Optional[Callable[[nn.Module], Any]] = None
                  ) -> Callable[..., Any]:
    """`function` (a block's forward) with, while it runs with gradients,
    each of the block's sublayers, `parts` (sublayers(block), found while
    the block's parameters still had their shapes), under a non-reentrant
    checkpoint.
    `weights(sublayer)` (weights streamed a sublayer at a time): a context
    holding the sublayer's weights, entered around each run of it, the
    checkpoint's recompute included (whose saved tensors then keep the
    weights until the sublayer's backward is done). Without sublayers,
    `function` itself."""
    if not parts:
        return function

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        grad = torch.is_grad_enabled()
        if not grad and weights is None:
            return function(*args, **kwargs)
        owned = [(part, vars(part).get("forward")) for part in parts]
        for part in parts:
            forward = part.forward
            if weights is not None:
                forward = _holding(forward, weights, part)
            part.forward = _checkpointed(forward) if grad else forward
        try:
            return function(*args, **kwargs)
        finally:
            for part, own in owned:
                if own is not None:
                    part.forward = own
                else:
                    del part.forward

    return run


def _holding(forward: Callable[..., Any],
             weights: Callable[[nn.Module], Any],
             part: nn.Module) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with weights(part):
            return forward(*args, **kwargs)

    return run


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
