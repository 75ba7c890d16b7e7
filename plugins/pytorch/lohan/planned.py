"""A block whose saved tensors each follow their own decision (a
per-tensor plan from lohand's planner): "device" keeps the tensor where
autograd keeps it, "host" and "ssd" hand it to the ActivationStore (host
memory; "ssd" straight to the daemon's SSDs when the store reaches them),
"recompute" drops it and backward makes it again from the tensors it was
made of (recompute.py).

Decisions are by position: the n-th storage the block's forward saves a
candidate tensor over (not a parameter's, not under the store's minimum)
gets the n-th decision, for every tensor it saves over that storage, as
the profile counted them. A saved tensor that cannot be
made again in backward (it depends on the block's input, on a random
operator, or on something written in place since) is stored instead of
recomputed, and one beyond the decisions is stored too: the plan decides
the cost, never the values, which stay those of torch's own autograd.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from lohan.recompute import Recording, Replay, Value, recompute_flops

DECISIONS = ("device", "host", "ssd", "recompute")


class Stored:
    """A saved tensor handed to the store; brought back once, then held
    for any further unpack of the same saved tensor."""

    __slots__ = ("store", "handle", "tensor")

    def __init__(self, store: Any, handle: Any):
        self.store = store
        self.handle = handle
        self.tensor: Optional[torch.Tensor] = None

    def take(self) -> torch.Tensor:
        if self.tensor is None:
            self.tensor = self.store.get(self.handle)
            self.handle = None
        return self.tensor


class Recomputed:
    """A saved tensor made again in backward; until the block's forward
    has ended (and it is known whether it can be) it holds the tensor."""

    __slots__ = ("value", "tensor", "replay", "fallback")

    def __init__(self, value: Value, tensor: torch.Tensor):
        self.value = value
        self.tensor: Optional[torch.Tensor] = tensor
        self.replay: Optional[Replay] = None
        self.fallback: Optional[Stored] = None

    def take(self) -> torch.Tensor:
        if self.fallback is not None:
            return self.fallback.take()
        return self.replay.value(self.value)


def unpack(saved: Any) -> torch.Tensor:
    return saved.take() if isinstance(saved, (Stored, Recomputed)) else saved


def is_candidate(tensor: torch.Tensor, weights: set, min_bytes: int) -> bool:
    """A saved tensor a plan decides on: not over a parameter's storage,
    over a storage of at least `min_bytes` (what keeping it holds)."""
    storage = tensor.untyped_storage()
    return storage.nbytes() >= min_bytes and storage.data_ptr() not in weights


class StorageOrder:
    """Numbers the storages of a block's candidate saved tensors in the
    order its forward first saves one over each: the index a plan's
    decisions go by (views of one storage, such as attention's q, k and v
    of one product, share a decision: one of them kept keeps the storage).
    Holds a tensor of each storage until cleared (the forward's end), so no
    address is reused for another storage meanwhile."""

    def __init__(self) -> None:
        self._indices: Dict[int, Tuple[int, torch.Tensor]] = {}

    def index(self, tensor: torch.Tensor) -> Tuple[int, bool]:
        """The storage's index, and whether this is its first tensor."""
        pointer = tensor.untyped_storage().data_ptr()
        found = self._indices.get(pointer)
        if found is not None:
            return found[0], False
        self._indices[pointer] = (len(self._indices), tensor)
        return len(self._indices) - 1, True

    def __len__(self) -> int:
        return len(self._indices)

    def clear(self) -> None:
        self._indices.clear()


class _Packer:
    """The saved-tensor hooks of one call of a planned block."""

    def __init__(self, store: Any, decisions: Sequence[str], weights: set,
                 recording: Optional[Recording], min_bytes: int):
        self._store = store
        self._decisions = decisions
        self._weights = weights
        self._recording = recording
        self._min_bytes = min_bytes
        self._pending: List[Recomputed] = []
        self._order = StorageOrder()

    def pack(self, tensor: torch.Tensor) -> Any:
        if self._recording is None:  # nothing to recompute
            return self._pack(tensor, None)
        with self._recording.paused():
            return self._pack(tensor, self._recording.value_of(tensor))

    def _pack(self, tensor: torch.Tensor, value: Optional[Value]) -> Any:
        if not is_candidate(tensor, self._weights, self._min_bytes):
            self._hold(value, tensor)
            return tensor
        index, _ = self._order.index(tensor)
        decision = (self._decisions[index] if index < len(self._decisions)
                    else "host")
        if decision == "recompute":
            holder = Recomputed(value, tensor)
            self._pending.append(holder)
            return holder
        if decision == "device":
            self._hold(value, tensor)
            return tensor
        stored = Stored(self._store,
                        self._store.put(tensor, to_ssd=decision == "ssd"))
        if value is not None:
            value.saved = stored.take
        return stored

    @staticmethod
    def _hold(value: Optional[Value], tensor: torch.Tensor) -> None:
        """Backward may take `tensor` as it is for `value`."""
        if value is not None:
            value.saved = lambda: tensor

    def finish(self) -> int:
        """After the forward: every tensor to recompute that can be made
        again drops its copy; the others go to the store. Returns how many
        storages the forward saved candidates over."""
        replay = Replay()
        failed = (self._recording is None
                  or self._recording.failed is not None)
        for holder in self._pending:
            if failed or recompute_flops([holder.value]) is None:
                holder.fallback = Stored(self._store,
                                         self._store.put(holder.tensor))
                holder.value.saved = holder.fallback.take
            else:
                holder.replay = replay
            holder.tensor = None
        self._pending = []
        saved = len(self._order)
        self._order.clear()
        return saved


def planned_forward(original: Callable, store: Any, block: nn.Module,
                    decisions: Sequence[str], min_bytes: int,
                    prepare: Callable[[tuple, dict], tuple]) -> Callable:
    """The block's forward with each saved tensor placed by `decisions`.
    `prepare(args, kwargs)` gives the call as it is to run (without a
    key/value cache)."""
    unknown = set(decisions) - set(DECISIONS)
    if unknown:
        raise ValueError(f"activations: unknown per-tensor decisions "
                         f"{sorted(unknown)}; use {', '.join(DECISIONS)}")

    warned: List[bool] = []  # once per block

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        args, kwargs = prepare(args, kwargs)
        weights = {p.untyped_storage().data_ptr() for p in block.parameters()}
        # What backward may use as it is: the block's weights and buffers,
        # what it got by keyword (masks, position embeddings: its caller
        # keeps them) and its positional arguments but the floating-point
        # ones (those are its input, which backward does not have).
        available = list(block.parameters()) + list(block.buffers())
        available += [v for v in kwargs.values()
                      if isinstance(v, torch.Tensor)]
        available += [a for a in args if isinstance(a, torch.Tensor)
                      and not a.is_floating_point()]
        recording = (Recording(available) if "recompute" in decisions
                     else None)
        packer = _Packer(store, decisions, weights, recording, min_bytes)
        with torch.autograd.graph.saved_tensors_hooks(packer.pack, unpack):
            with recording or contextlib.nullcontext():
                output = original(*args, **kwargs)
        saved = packer.finish()
        if saved != len(decisions) and not warned:
            warned.append(True)
            warnings.warn(
                f"lohan: a planned block saved tensors over {saved} storages "
                f"and its plan decides {len(decisions)}: decisions go by "
                "position, so they may not fit this call (a different "
                "shape or code path than the profiled one); what is past "
                "them is stored. The values stay exact; the cost may not be "
                "the plan's", stacklevel=2)
        return output

    return forward
