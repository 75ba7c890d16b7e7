"""One buffer per layer that its parameters' gradients accumulate into.

Handed over on a GPU, a layer's gradients must be one tensor (its slot is
filled by one copy). Concatenating them at hand-over makes a second copy
of them all beside the first; instead, when a layer's first gradient
arrives (a tensor pre-hook, before autograd accumulates it), every
parameter of the layer gets a `.grad` that is a view of one zeroed buffer,
and autograd adds each gradient into its view in place (as DDP's
gradient_as_bucket_view does). The buffer is then handed over as it is.
A `.grad` replaced or cleared by someone else in the meantime is copied
in, or zeroed, at hand-over.
"""

from __future__ import annotations

from typing import Callable, List, Optional

import torch
from torch.utils.hooks import RemovableHandle

from lohan.blocks import Layer


class GradBuffers:
    """Buffers for `layers`, their hooks on every parameter. Not
    thread-safe: autograd's hooks and the training loop run on one
    thread (a CPU or one GPU's autograd thread)."""

    def __init__(self, layers: List[Layer]) -> None:
        self._layers = layers
        self._buffers: List[Optional[torch.Tensor]] = [None] * len(layers)
        # Which parameters a gradient reached since the last hand-over.
        self.reached: List[List[bool]] = [[False] * len(l.params)
                                          for l in layers]
        self.handles: List[RemovableHandle] = []
        for layer in layers:
            for position, param in enumerate(layer.params):
                self.handles.append(param.register_hook(
                    self._before(layer.index, position)))

    def _before(self, layer: int,
                position: int) -> Callable[[torch.Tensor], None]:
        def on_grad(grad: torch.Tensor) -> None:
            self.reached[layer][position] = True
            if self._buffers[layer] is None:
                self._give(layer, grad)
        return on_grad

    def _give(self, layer: int, grad: torch.Tensor) -> None:
        """Every parameter of the layer a `.grad` in one new buffer (one
        it has already is copied in)."""
        spec = self._layers[layer]
        buffer = torch.zeros(spec.numel, dtype=grad.dtype, device=grad.device)
        for param, offset, shape in zip(spec.params, spec.offsets,
                                        spec.shapes):
            view = buffer[offset:offset + shape.numel()].view(shape)
            if param.grad is not None:
                view.copy_(param.grad)
            param.grad = view
        self._buffers[layer] = buffer

    def take(self, layer: int) -> Optional[torch.Tensor]:
        """The layer's gradients back to back in its buffer (None if none
        arrived), its parameters' `.grad` cleared."""
        buffer, self._buffers[layer] = self._buffers[layer], None
        spec = self._layers[layer]
        if buffer is not None:
            for param, offset, shape in zip(spec.params, spec.offsets,
                                            spec.shapes):
                region = buffer[offset:offset + shape.numel()]
                if param.grad is None:
                    region.zero_()  # cleared by someone since
                elif param.grad.data_ptr() != region.data_ptr():
                    region.copy_(param.grad.reshape(-1))  # replaced
                param.grad = None
        self.reached[layer] = [False] * len(spec.params)
        return buffer

    def reset(self) -> None:
        """A step begins: no buffer is held."""
        self._buffers = [None] * len(self._layers)
        self.reached = [[False] * len(l.params) for l in self._layers]
