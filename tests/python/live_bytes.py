"""What a device holds, counted on any device (the CPU included): the
bytes of every tensor storage the ops make while a `LiveBytes` mode is
active, live now and at their peak. Autograd's backward on the CPU runs
in the calling thread, under the mode too. Storages made before the mode
(parameters, inputs given) are not counted."""

from __future__ import annotations

import weakref
from typing import Any, Dict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """`with LiveBytes() as live: ...`; then live.peak and live.now."""

    def __init__(self) -> None:
        super().__init__()
        self.now = self.peak = 0
        self._live: Dict[int, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self._track(item.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self._live:
            return  # a view, or an op's output in place
        self._live[key] = size
        self.now += size
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.now -= self._live.pop(key)
