"""The model's tensors as save_pretrained writes them (pretrained.py's
OutTensor: a name, a shape, a dtype and a reader called when the writer
reaches it): a trained parameter rounded from its fp32 master, read from
lohand a layer at a time; a frozen one and a buffer as the model holds
them; and for a peft model, its base with the adapters merged as peft
merges them."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from lohan.blocks import Layer
from lohan.params import FrozenWeights
from lohan.pretrained import OutTensor
from lohan.starting_weights import base_model_name



class SavedTensors:
    """Reads the model's tensors for a save. A layer's masters are read
    into the arena's staging slot when one of its parameters is first
    asked for and kept until another layer's are (every reader here shares
    that one slot). Between steps only; not thread-safe."""

    def __init__(self, model: nn.Module, layers: List[Layer], remote: Any,
                 staging: torch.Tensor,
                 whole: Callable[[Layer, torch.Tensor], torch.Tensor],
                 frozen: Optional[FrozenWeights]) -> None:
        """`whole(layer, flat)`: the layer's flat vector from this rank's
        part of it (data-parallel ranks gather: a collective)."""
        self._model = model
        self._remote = remote
        self._staging = staging
        self._whole = whole
        self._frozen = frozen
        self._where: Dict[int, Tuple[Layer, int, torch.Size]] = {
            id(param): (layer, offset, shape) for layer in layers
            for param, offset, shape in zip(layer.params, layer.offsets,
                                            layer.shapes)}
        self._current: Tuple[Optional[int], Optional[torch.Tensor]] = (
            None, None)

    def _held(self, param: nn.Parameter
              ) -> Tuple[torch.Size, Callable[[], torch.Tensor]]:
        """An untrained parameter's shape and a reader of its values (a
        frozen block parameter's from its home)."""
        stored = self._frozen.stored(param) if self._frozen else None
        return stored or (param.shape, lambda: param)

    def _master(self, param: nn.Parameter, dtype: torch.dtype
                ) -> torch.Tensor:
        layer, offset, shape = self._where[id(param)]
        if self._current[0] != layer.index:
            self._remote.read_weights(layer.index)
            self._current = (layer.index, self._whole(layer, self._staging))
        return self._current[1][offset:offset + shape.numel()].view(
            shape).to(dtype)

    def all(self, dtype: torch.dtype,
            trained_only: bool = False) -> List[OutTensor]:
        """Every parameter (a tied one under its first name) and persistent
        buffer, in the model's order, floating-point ones in `dtype`
        (`trained_only`: the trained parameters alone)."""
        tensors: List[OutTensor] = []
        for name, param in self._model.named_parameters():
            if id(param) in self._where:
                tensors.append(OutTensor(
                    name, self._where[id(param)][2], dtype,
                    lambda p=param: self._master(p, dtype)))
            elif not trained_only:
                shape, value = self._held(param)
                tensors.append(_held(name, shape, value, param, dtype))
        for module_name, module in (() if trained_only else
                                    self._model.named_modules()):
            for name, buffer in module._buffers.items():
                if buffer is not None and (
                        name not in module._non_persistent_buffers_set):
                    tensors.append(_held(
                        f"{module_name}.{name}" if module_name else name,
                        buffer.shape, lambda b=buffer: b, buffer, dtype))
        return tensors

    def merged(self, dtype: torch.dtype,
               adapter_dtype: torch.dtype) -> List[OutTensor]:
        """A peft model's base as its own model names it, each adapted
        layer's weight with its active adapters merged as peft's merge
        does (`weight += get_delta_weight(adapter)`, the adapters as
        trained, in `adapter_dtype`), the adapters left out; then
        floating-point ones in `dtype`."""
        adapted = {f"{name}.base_layer.weight": module
                   for name, module in self._model.named_modules()
                   if callable(getattr(module, "get_delta_weight", None))
                   and hasattr(module, "base_layer")}
        tensors: List[OutTensor] = []
        for tensor in self.all(dtype):
            if ".lora_" in tensor.name:
                continue
            name = base_model_name(tensor.name)
            module = adapted.get(tensor.name)
            read = tensor.read if module is None else self._merge(
                module, adapter_dtype, dtype)
            tensors.append(OutTensor(name, tensor.shape, tensor.dtype, read))
        return tensors

    def _merge(self, module: nn.Module, adapter_dtype: torch.dtype,
               dtype: torch.dtype) -> Callable[[], torch.Tensor]:
        base = module.base_layer.weight

        def base_value() -> torch.Tensor:
            if id(base) in self._where:  # a trained base
                return self._master(base, base.dtype).clone()
            return self._held(base)[1]().detach().to("cpu", copy=True)

        def read() -> torch.Tensor:
            merged = base_value()
            for adapter in module.active_adapters:
                if adapter not in module.lora_A:
                    continue
                parts = [module.lora_A[adapter].weight,
                         module.lora_B[adapter].weight]
                held = [p.data for p in parts]
                try:
                    for part in parts:
                        part.data = self._master(part, adapter_dtype).to(
                            held[0].device)
                    merged += module.get_delta_weight(adapter).to(
                        merged.device)
                finally:
                    for part, data in zip(parts, held):
                        part.data = data
            return merged.to(dtype)
        return read


def _held(name: str, shape: torch.Size,
          value: Callable[[], torch.Tensor], like: torch.Tensor,
          dtype: torch.dtype) -> OutTensor:
    """A tensor the model holds (a frozen parameter, a buffer), read when
    its turn comes."""
    out = dtype if like.is_floating_point() else like.dtype

    def read() -> torch.Tensor:
        return value().detach().to(out)
    return OutTensor(name, shape, out, read)
