"""What happens to each block's activations between forward and backward.

Policies (`lohan.init(..., activations=...)`):
- "keep": torch's default; every intermediate stays in memory.
- "recompute" (the default): only each block's inputs are kept; backward
  recomputes the block's forward (torch.utils.checkpoint, non-reentrant),
  so activation memory is one block's worth plus the block boundaries.

Offloading the kept block inputs to host memory or the SSD store (and the
per-block plan from the planner) is not built yet.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

POLICIES = ("keep", "recompute")


def install(model: nn.Module, blocks: Sequence[nn.Module],
            policy: str) -> Callable[[], None]:
    """Applies `policy` to every block; returns the function that undoes
    it."""
    if policy not in POLICIES:
        raise ValueError(f"activations={policy!r} is not supported; use one "
                         f"of {', '.join(POLICIES)}")
    if policy == "keep":
        return lambda: None
    # A key/value cache built during forward would be extended a second time
    # when backward recomputes the block; training does not use it.
    config = getattr(model, "config", None)
    restore_cache = None
    if config is not None and getattr(config, "use_cache", False):
        restore_cache = config.use_cache
        config.use_cache = False
    originals: List[tuple] = []
    for block in blocks:
        original = block.forward
        originals.append((block, original))

        def forward(*args, _original=original, **kwargs):
            if not torch.is_grad_enabled():
                return _original(*args, **kwargs)
            return checkpoint(_original, *args, use_reentrant=False, **kwargs)

        block.forward = forward

    def uninstall() -> None:
        for block, original in originals:
            block.forward = original
        if restore_cache is not None:
            config.use_cache = restore_cache

    return uninstall
