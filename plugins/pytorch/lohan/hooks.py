"""Hands gradients to the daemon layer by layer as backward produces them.

A post-accumulate-grad hook on every trainable parameter counts the
backward passes that reached it since the last hand-over. When every
parameter of a layer has been reached `accumulation_steps` times, its
gradients (torch's accumulated sum, exactly what an optimizer would see) are
copied flat into the layer's gradient slot, the parameters' `.grad` are
cleared, and the daemon is told the layer is ready: its update starts while
backward goes on through the earlier layers.

A block recomputed by the offload policy is differentiated once per call,
inside the outer backward, so its parameters can be reached several times
in one pass (a model called twice before one backward). For those the
policy tells the router when the block's pass is complete (block_passed);
the hooks that fire inside such a block's own backward only note that a
gradient arrived, except in the block's last call of the step's last
pass: there a layer is complete once that call has reached each of its
parameters, and is handed over at once (with weights streamed a sublayer
at a time, a sublayer's layer before the next sublayer's backward runs).
Whenever a call has reached every parameter of a layer the router says so
(`reached_in_call`: that sublayer's weights can go). Where gradients are
handed over from a GPU, each layer's accumulate into one buffer
(grad_buffers.py), which is handed over as it is.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import (TYPE_CHECKING, Callable, Iterator, List, Optional,
                    Protocol)

import torch
from torch.utils.hooks import RemovableHandle

from lohan.blocks import Layer
from lohan.grad_buffers import GradBuffers

if TYPE_CHECKING:
    from lohan.sharding import GradientReducer


def has_lohan_hook(param: torch.Tensor) -> bool:
    """Whether an engine's hook is on `param` (an engine not closed yet)."""
    hooks = getattr(param, "_post_accumulate_grad_hooks", None) or {}
    return any(getattr(h, "_lohan_hook", False) for h in hooks.values())


class GradientSink(Protocol):
    """Where a GradientRouter hands each layer's gradients: the step in
    progress (iteration.Iteration), which begins the daemon's iteration
    at the first one."""

    # Whether device_grad_ready takes gradients on a GPU (copied into the
    # slot on a stream); else they are copied into the slot here.
    device_copies: bool

    def claim_grad_buffer(self, layer: int) -> None:
        """Before the layer's gradient slot is written: waits until the
        daemon is done with what the slot held (shared slots)."""

    def grad_ready(self, layer: int) -> None:
        """The layer's gradient is in its slot."""

    def device_grad_ready(self, layer: int, flat: torch.Tensor) -> None:
        """`flat`: the layer's gradients back to back on its GPU, to be
        copied into its slot."""


class HostSink:
    """A GradientSink that only hears `grad_ready(layer)`: no shared slots,
    gradients copied into the slots here."""

    device_copies = False

    def __init__(self, grad_ready: Callable[[int], None]) -> None:
        self.grad_ready = grad_ready

    def claim_grad_buffer(self, layer: int) -> None:
        pass

    def device_grad_ready(self, layer: int, flat: torch.Tensor) -> None:
        raise AssertionError("HostSink takes no device gradients")


class GradientRouter:
    """Hooks every parameter of `layers` and hands each layer's
    gradients to its GradientSink once they are complete."""

    def __init__(self, layers: List[Layer], grad_views: List[torch.Tensor],
                 accumulation_steps: int,
                 sink: Optional[GradientSink] = None, *,
                 grad_ready: Optional[Callable[[int], None]] = None,
                 reducer: Optional[GradientReducer] = None,
                 buffered: Optional[bool] = None) -> None:
        """`sink` takes each layer's gradients (the first begins the
        step); `grad_ready` alone stands for HostSink(grad_ready).
        `reducer` (data-parallel ranks, sharding.py): each layer's
        gradients go to it flat instead, and it hands the sink this
        rank's reduced shard. `buffered` (None: where the sink takes
        device gradients) accumulates each layer's gradients into one
        buffer (grad_buffers.py) that is handed over as it is."""
        if sink is None:
            if grad_ready is None:
                raise TypeError("GradientRouter needs a sink or grad_ready")
            sink = HostSink(grad_ready)
        self._layers = layers
        self._grad_views = grad_views
        self._steps = accumulation_steps
        self._sink = sink
        self._reducer = reducer
        self._arrivals: List[List[int]] = [[0] * len(l.params) for l in layers]
        self._waiting: List[int] = [len(l.params) for l in layers]
        self.handed: List[bool] = [False] * len(layers)
        # Per layer: inside its block's own backward (offload policy), and
        # the block passes completed since the last hand-over.
        self._inner: List[int] = [0] * len(layers)
        self._passes: List[int] = [0] * len(layers)
        # Inside a call of a layer's block: which of the layer's parameters
        # that call has reached (else None), whether it is the block's
        # last call in the step's last pass, and the layers handed over
        # inside such a call this step.
        self._call_arrivals: List[Optional[List[bool]]] = [None] * len(
            layers)
        self._final: List[bool] = [False] * len(layers)
        self._handed_early: List[bool] = [False] * len(layers)
        # Told when a call of a layer's block has reached every parameter
        # of the layer (weights streamed below the block are then let go).
        self.reached_in_call: Callable[[int], None] = lambda layer: None
        self._handles: List[RemovableHandle] = []
        for layer in layers:
            for position, param in enumerate(layer.params):
                self._handles.append(param.register_post_accumulate_grad_hook(
                    self._hook(layer.index, position)))
        self._buffers: Optional[GradBuffers] = None
        if sink.device_copies if buffered is None else buffered:
            self._buffers = GradBuffers(layers)
            self._handles.extend(self._buffers.handles)

    def _hook(self, layer: int,
              position: int) -> Callable[[torch.Tensor], None]:
        def on_grad(param: torch.Tensor) -> None:
            self._arrived(layer, position, param)
        on_grad._lohan_hook = True  # type: ignore[attr-defined]
        return on_grad

    def _again(self, layer: int) -> RuntimeError:
        return RuntimeError(
            f"lohan: layer {layer} got a gradient again after it was "
            "handed to the daemon in this step. Call engine.step() after "
            "each backward, or pass grad_accumulation_steps=k to "
            "lohan.init to accumulate k backward passes per step")

    @contextlib.contextmanager
    def inside(self, layer: int, last_call: bool = False) -> Iterator[None]:
        """While one call of the layer's block is differentiated.
        `last_call`: no other call of the block is left to differentiate;
        in the step's last pass the layer is then complete as soon as each
        of its parameters has been reached in this call, and is handed
        over then (a unit layer before the rest of its block's backward
        runs)."""
        if self.handed[layer]:
            raise self._again(layer)
        self._inner[layer] += 1
        final = last_call and self._passes[layer] + 1 == self._steps
        self._call_arrivals[layer] = [False] * len(self._layers[layer].params)
        self._final[layer] = final
        try:
            yield
        finally:
            self._inner[layer] -= 1
            self._call_arrivals[layer] = None

    def block_passed(self, layer: int) -> None:
        """Every call of the layer's block in this backward has been
        differentiated: one more pass."""
        if self._handed_early[layer]:
            return  # complete inside its last call
        if self.handed[layer]:
            raise self._again(layer)
        self._passes[layer] += 1
        if self._passes[layer] == self._steps:
            self.hand_over(layer)

    def _arrived(self, layer: int, position: int, param: torch.Tensor) -> None:
        if self._inner[layer]:
            # Counted by block_passed, unless this is the last call of
            # the last pass.
            reached = self._call_arrivals[layer]
            if reached is None:
                return
            reached[position] = True
            if not all(reached):
                return
            self._call_arrivals[layer] = None
            if self._final[layer]:
                self._passes[layer] += 1
                self._handed_early[layer] = True
                self.hand_over(layer)
            self.reached_in_call(layer)
            return
        if self.handed[layer]:
            raise self._again(layer)
        count = self._arrivals[layer][position] + 1
        self._arrivals[layer][position] = count
        if count == self._steps:
            self._waiting[layer] -= 1
            if self._waiting[layer] == 0:
                self.hand_over(layer)

    def hand_over(self, layer: int) -> None:
        """Copies the layer's gradients into its slot (zeros where a
        parameter has none), clears them and signals the daemon."""
        spec = self._layers[layer]
        flat: Optional[torch.Tensor] = None
        if self._buffers is not None:
            missing = [name for name, reached in zip(
                spec.names, self._buffers.reached[layer]) if not reached]
            flat = self._buffers.take(layer)
        else:
            missing = [name for name, param in zip(spec.names, spec.params)
                       if param.grad is None]
        device = spec.params[0].device
        # Sizes from the layout: a parameter whose weights are offloaded is
        # an empty placeholder here when it got no gradient.
        sizes = spec.sizes()
        if self._reducer is not None:
            if flat is None:
                flat = self._flat_gradients(spec, sizes)
            self.handed[layer] = True
            self._warn_missing(missing)
            self._reducer.add(layer, flat)
            return
        if device.type == "cuda" and self._sink.device_copies:
            if flat is None:
                flat = self._flat_gradients(spec, sizes)
        elif flat is not None:
            self._sink.claim_grad_buffer(layer)
            self._grad_views[layer].copy_(flat)
            flat = None
        else:
            self._sink.claim_grad_buffer(layer)
            view = self._grad_views[layer]
            for param, offset, size in zip(spec.params, spec.offsets, sizes):
                target = view[offset:offset + size]
                if param.grad is None:
                    target.zero_()
                else:
                    target.copy_(param.grad.reshape(-1))
                    param.grad = None
        self._warn_missing(missing)
        self.handed[layer] = True
        if flat is not None:
            self._sink.device_grad_ready(layer, flat)
        else:
            self._sink.grad_ready(layer)

    def _flat_gradients(self, spec: Layer, sizes: List[int]) -> torch.Tensor:
        """The layer's gradients back to back on its device (zeros for a
        parameter without one); its parameters' .grad cleared."""
        device = spec.params[0].device
        flat = torch.cat([
            (param.grad if param.grad is not None else
             torch.zeros(size, dtype=self._grad_views[spec.index].dtype,
                         device=device)).reshape(-1)
            for param, size in zip(spec.params, sizes)])
        for param in spec.params:
            param.grad = None
        return flat

    @staticmethod
    def _warn_missing(missing: List[str]) -> None:
        if missing:
            warnings.warn(
                "lohan: no gradient this step for " + ", ".join(missing[:5]) +
                (" ..." if len(missing) > 5 else "") +
                "; the daemon updates them with a zero gradient (moments "
                "decay, weight decay applies), unlike torch.optim which "
                "skips parameters whose .grad is None", stacklevel=4)

    def flush(self) -> None:
        """Hands over every layer not handed over yet (a step() after fewer
        backward passes than grad_accumulation_steps, or unused
        parameters)."""
        for layer in range(len(self._layers)):
            if not self.handed[layer]:
                self.hand_over(layer)

    def any_gradient(self) -> bool:
        return any(self.handed) or any(
            p.grad is not None for l in self._layers for p in l.params)

    def finish_reductions(self) -> Optional[float]:
        """Data-parallel ranks: waits until every layer's shard is handed
        to the sink and returns the sum of squares of this rank's shards
        (None without a reducer). After flush()."""
        return self._reducer.finish() if self._reducer is not None else None

    def reset(self) -> None:
        if self._reducer is not None:
            self._reducer.reset()
        if self._buffers is not None:
            self._buffers.reset()
        for layer in range(len(self._layers)):
            self._arrivals[layer] = [0] * len(self._layers[layer].params)
            self._waiting[layer] = len(self._layers[layer].params)
            self.handed[layer] = False
            self._passes[layer] = 0
            self._handed_early[layer] = False
            self._call_arrivals[layer] = None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
