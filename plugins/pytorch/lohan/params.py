"""Where a block's weights are between its uses (`lohan.init(...,
params=...)`).

- "resident": every parameter keeps its own storage, as in plain PyTorch;
  step() copies the new weights into it.
- "offload": a block's parameters hold an empty placeholder except while
  the block runs. Just before its forward (and before its recompute in
  backward) the engine asks the daemon for the layer's current weights
  (FETCH_PARAMS into the layer's weight buffer in the job's arena, once per
  step and buffer) and copies them into a fresh buffer on the parameters'
  device (a copy even on the CPU: parameters never point into the arena,
  which goes away when the engine closes). After the block (after its backward,
  when its gradients have been handed over) the parameters go back to the
  placeholder. Device memory then holds the weights of the block running,
  not of the model; `engine.master_weights()` / `engine.save()` read the
  weights from the daemon, and `model.state_dict()` shows placeholders for
  offloaded blocks.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from lohan.blocks import Layer

MODES = ("auto", "resident", "offload")


def resolve_mode(mode: str, layers: List[Layer]) -> str:
    """"auto": offload when the blocks' parameters are on an accelerator
    (their weights then need not all fit it), else resident."""
    if mode not in MODES:
        raise ValueError(f"params={mode!r} is not supported; use one of "
                         f"{', '.join(MODES)}")
    if mode != "auto":
        return mode
    on_device = any(p.device.type != "cpu" for layer in layers
                    if layer.block is not None for p in layer.params)
    return "offload" if on_device else "resident"


class ParameterResidency:
    """Moves block weights in and out of their parameters ("offload").
    Not thread-safe: the training loop and autograd call it on one
    thread."""

    def __init__(self, layers: List[Layer], remote, weight_views:
                 List[torch.Tensor]):
        self._remote = remote
        self._views = weight_views  # per layer, into the arena
        self._by_block: Dict[int, Layer] = {
            id(layer.block): layer for layer in layers
            if layer.block is not None}
        self._placeholders: Dict[int, List[torch.Tensor]] = {}
        self._shapes: Dict[int, List[torch.Size]] = {}
        for layer in self._by_block.values():
            self._shapes[layer.index] = [p.shape for p in layer.params]
            self._placeholders[layer.index] = [
                torch.empty(0, dtype=p.dtype, device=p.device)
                for p in layer.params]
        self._live: Dict[int, int] = {}  # layer -> nested materializations
        # Which (layer, step) each arena weight buffer holds: layers may
        # share a buffer (a streamed layout), and weights change each step.
        self._holds: Dict[int, Tuple[int, int]] = {}
        self._step = 0
        self.fetches = 0
        # GPU copies out of a weight buffer still in flight: a fetch into
        # that buffer waits for them (a streamed layout reuses buffers).
        self._copies: Dict[int, "torch.cuda.Event"] = {}

    @property
    def layers(self) -> List[Layer]:
        return list(self._by_block.values())

    def layer_of(self, block: nn.Module) -> Optional[Layer]:
        return self._by_block.get(id(block))

    def new_step(self) -> None:
        """The daemon has new weights: fetch again before the next use."""
        self._step += 1

    def _fetch(self, layer: Layer) -> torch.Tensor:
        view = self._views[layer.index]
        address = view.data_ptr()
        if self._holds.get(address) != (layer.index, self._step):
            copy = self._copies.pop(address, None)
            if copy is not None:
                copy.synchronize()
            self._remote.fetch_params(layer.index)
            self.fetches += 1
            self._holds[address] = (layer.index, self._step)
        return view

    def materialize(self, block: nn.Module) -> None:
        layer = self.layer_of(block)
        if layer is None:
            return
        depth = self._live.get(layer.index, 0)
        self._live[layer.index] = depth + 1
        if depth:
            return  # nested (a block calling itself, or a recompute)
        device = self._placeholders[layer.index][0].device
        source = self._fetch(layer)
        # From the pinned arena this copy is asynchronous on a GPU.
        flat = source.to(device, copy=True, non_blocking=True)
        if device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            self._copies[source.data_ptr()] = event
        for param, offset, shape in zip(layer.params, layer.offsets,
                                        self._shapes[layer.index]):
            param.data = flat[offset:offset + shape.numel()].view(shape)

    def release(self, block: nn.Module) -> None:
        layer = self.layer_of(block)
        if layer is None or self._live.get(layer.index, 0) == 0:
            return
        self._live[layer.index] -= 1
        if self._live[layer.index] == 0:
            self._drop(layer)

    def _drop(self, layer: Layer) -> None:
        for param, placeholder in zip(layer.params,
                                      self._placeholders[layer.index]):
            param.data = placeholder

    def restore_all(self) -> None:
        """Gives every block its current weights in its own storage for
        good (the engine is closing)."""
        self._live.clear()
        for layer in self._by_block.values():
            self.materialize(layer.block)
        self._live.clear()

    def release_all(self) -> None:
        """Every block back to its placeholder (at step(), whatever a
        forward left materialized, e.g. one whose backward never ran)."""
        self._live.clear()
        for layer in self._by_block.values():
            self._drop(layer)
