"""peft over a base built on the meta device (lohan.init(model,
weights=PATH)): `get_peft_model` is peft's, but what peft makes (the
adapters) keeps the values peft gave it instead of following its base
layer onto meta, where it would have none. The adapters then start as
peft starts them on a loaded base with the same seed: the same random
numbers are drawn in the same order, on the CPU. Imports peft only when
used."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn


@contextlib.contextmanager
def nothing_moves_onto_meta() -> Iterator[None]:
    """Inside it, `module.to("meta")` leaves a module where it is (a dtype
    it also names still applies)."""
    move = nn.Module.to

    def to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "meta":
            return self if dtype is None else move(self, dtype=dtype)
        return move(self, *args, **kwargs)

    nn.Module.to = to
    try:
        yield
    finally:
        nn.Module.to = move


def get_peft_model(model: nn.Module, config: Any, **kwargs: Any) -> Any:
    """peft.get_peft_model(model, config, **kwargs), a meta base's adapters
    kept with their values (see the module's doc)."""
    import peft
    with nothing_moves_onto_meta():
        return peft.get_peft_model(model, config, **kwargs)
