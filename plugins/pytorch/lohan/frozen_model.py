"""A model lohan does not train (a DPO reference, a distillation teacher)
whose weights stay out of it between its uses: each block's parameters
come in just before the block runs and go again after it (the next
block's read one ahead), the rest of the model's (embeddings, head, final
norm) around each call of the whole model. Between calls every parameter
is an empty placeholder on the device. Where the weights wait:

- "host": in host memory (on the CPU the tensors given, not copied), as
  before a training engine is open;
- "ssd": on lohand's SSDs, through an open engine's activation area
  (`lohan.init(..., frozen_models=True)`): neither the device nor the
  training process holds them between uses.

`to_ssd(engine)` and `to_host()` move them, a tensor at a time.
params.FrozenWeights brings them in and lets them go, as it does for a
LoRA base's frozen block weights under params="offload". Not
thread-safe."""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Sequence

import torch
from torch import nn

from lohan.params import FrozenWeights, _malloc_trim

Value = Callable[[nn.Parameter], torch.Tensor]


class FrozenModel:
    """`model`'s weights held outside it (see the module's doc). Its
    parameters' values are `values[id(param)]` (host tensors, taken as
    they are: not copied on the CPU); `blocks` are its repeated blocks
    (lohan.find_blocks), `device` where it computes."""

    def __init__(self, model: nn.Module,
                 values: Mapping[int, torch.Tensor],
                 blocks: Sequence[nn.Module],
                 device: Any) -> None:
        self.model = model
        self.device = torch.device(device)
        self._params = list(model.parameters())  # each once
        self._shapes = {id(p): values[id(p)].shape for p in self._params}
        for param in self._params:
            param.requires_grad_(False)
        # The rest of the model is its last unit: what the blocks do not
        # hold, around the whole call.
        self._units: List[nn.Module] = [*blocks, model]
        self._weights = self._homes(lambda p: values[id(p)], None, None)
        self.where = "host"
        self._trim = _malloc_trim() if self.device.type == "cpu" else None
        self._hooks: List[Any] = []
        for unit in self._units:
            self._hooks.append(unit.register_forward_pre_hook(self._enter))
            self._hooks.append(unit.register_forward_hook(
                self._leave, always_call=True))

    def _homes(self, value: Value, host_bytes: Optional[int],
               store: Any) -> FrozenWeights:
        """The parameters' homes made anew from `value` (FrozenWeights
        sizes them by their shapes: for the moment, each a one-element
        tensor expanded to its shape)."""
        for param in self._params:
            param.data = torch.empty((), dtype=param.dtype,
                                     device=param.device).expand(
                                         self._shapes[id(param)])
        return FrozenWeights(self._units, self.device, host_bytes, store,
                             value)

    def _enter(self, module: nn.Module, args: Any) -> None:
        self._weights.materialize(module)

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        self._weights.release(module)
        if module is self.model:
            # Nothing stays (a block read ahead that did not run).
            self._weights.release_all()
            self.trim()

    def trim(self) -> None:
        """On the CPU, the C library's freed pages back to the system."""
        if self._trim is not None:
            self._trim(0)

    def value(self, param: nn.Parameter) -> torch.Tensor:
        """A parameter's values where they wait (read back from the SSDs,
        a host tensor)."""
        stored = self._weights.stored(param)
        if stored is None:
            raise KeyError("lohan: not a parameter of this frozen model")
        return stored[1]()

    def _reader(self) -> Value:
        """`value`, as the weights are now (they are about to move)."""
        weights = self._weights

        def value(param: nn.Parameter) -> torch.Tensor:
            stored = weights.stored(param)
            assert stored is not None
            return stored[1]()
        return value

    # ------------------------------------------------------------- moves

    def to_ssd(self, engine: Any) -> None:
        """The weights to lohand's SSDs through `engine`'s activation area
        (an engine opened with frozen_models=True), a tensor at a time;
        their host copies are let go."""
        store = getattr(engine, "_activations", None)
        if store is None or not getattr(store, "_buffers", None):
            raise RuntimeError(
                "lohan: this engine has no way to lohand's SSDs for a "
                "frozen model's weights: open it with frozen_models=True")
        self._weights = self._homes(self._reader(), 0, store)
        self.where = "ssd"
        self.trim()

    def to_host(self) -> None:
        """The weights back in host memory (read from the SSDs, before
        the engine closes and lohand drops them)."""
        if self.where != "host":
            self._weights = self._homes(self._reader(), None, None)
            self.where = "host"

    def own_copies(self) -> None:
        """In host memory, copies of the values given (which may change:
        a policy's own weights, say)."""
        if self.where == "host":
            read = self._reader()
            self._weights = self._homes(lambda p: read(p).clone(), None,
                                        None)

    @property
    def ssd_bytes(self) -> int:
        """The weights' bytes sent to lohand's SSDs (a piece lohand had no
        room for stays in host memory: the engine's
        activation_stats.ssd_refused_bytes counts it)."""
        return self._weights.ssd_bytes

    @property
    def host_bytes(self) -> int:
        """The weights' bytes in host memory."""
        return self._weights.host_bytes

    def close(self) -> None:
        """The model back to an ordinary one: every parameter in its own
        storage on the device, the hooks gone."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._weights.restore_all()
