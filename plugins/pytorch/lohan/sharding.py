"""Data-parallel ranks (torch.distributed): each rank's job on its node's
lohand holds one shard of every layer's states.

Layer i's flat vector (n elements) is cut into W equal shards of
s = ceil(n / W) elements, the last ones padded with zeros; rank r owns
elements [r*s, r*s + s). Every rank's optimizer work, host-pool and SSD
bytes are then 1/W of the model's (to within W-1 elements per layer),
whatever the layers' sizes, which sharding whole layers cannot promise.
The padding stays zero: its gradient is always zero, so AdamW keeps
weight and moments at zero and adds nothing to the norm.

Per step each rank reduce-scatters every layer's gradient as backward
completes it (the SUM divided by W: the mean over ranks, as DDP), hands
its shard to its daemon, and after the update all-gathers the new
weights. Collectives run in one fixed layer order on every rank (see
`backward_order`), whatever order backward completes layers in: ranks
must issue them in the same order.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import (Any, Callable, Deque, Dict, List, Optional,
                    TypeVar)

import torch
import torch.distributed as dist
from torch import nn

from lohan.blocks import Layer, after_the_blocks

T = TypeVar("T")
# torch.distributed's store key where a rank that stops says why.
FAILURE_KEY = "lohan/failure"


class RankFailure(RuntimeError):
    """A collective across the data-parallel ranks failed: another rank (or
    its daemon) stopped, or the network did. The message names the rank
    and its error when that rank could say."""


@dataclass(frozen=True)
class Piece:
    """Where one parameter overlaps this rank's shard of its layer: its
    flat elements [begin, end) go to the shard at `at`."""

    position: int  # the parameter's index in the layer
    begin: int
    end: int
    at: int


def process_group_of(option: object) -> Optional[dist.ProcessGroup]:
    """lohan.init's process_group: None means torch.distributed's default
    group when it is initialized with more than one rank; False: train
    this process alone whatever torch.distributed says; else the group
    given. The group returned (None: alone) has at least two ranks."""
    if option is False:
        return None
    if option is None:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = dist.group.WORLD
    elif isinstance(option, dist.ProcessGroup):
        group = option
    else:
        raise TypeError("process_group must be a torch.distributed "
                        "ProcessGroup, None (the default group, when "
                        "torch.distributed is initialized) or False, got "
                        f"{type(option).__name__}")
    return group if dist.get_world_size(group) > 1 else None


def backward_order(model: nn.Module, blocks: List[nn.Module],
                   layers: List[Layer]) -> List[int]:
    """The layers in the order backward usually completes them: the rest
    after the blocks (the head), the blocks last to first, then the rest
    before them (the embeddings, which a tied head finishes last)."""
    after = after_the_blocks(model, blocks)
    rest = [layer for layer in layers if layer.block is None]
    tail = [layer.index for layer in rest if after(layer.names[0])]
    head = [layer.index for layer in rest if not after(layer.names[0])]
    in_blocks = [layer.index for layer in layers if layer.block is not None]
    return tail + in_blocks[::-1] + head


class Sharding:
    """This rank's shard of every layer, and the collectives over them.
    Every method that runs a collective must be called by every rank of
    the group, in the same order."""

    def __init__(self, group: dist.ProcessGroup, layers: List[Layer],
                 device: torch.device) -> None:
        """`device`: the model's; NCCL's collectives run on it, so host
        tensors (the arena's staging, scalars) go through it."""
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self._layers = layers
        self.shard = [math.ceil(layer.numel / self.world) for layer in layers]
        self._pieces = [self._pieces_of(layer) for layer in layers]
        self._scatter_supported = True
        self._store = _store_of(group)
        on_device = dist.get_backend(group) == "nccl"
        self._collective_device = device if on_device else None

    def publish_failure(self, error: BaseException) -> None:
        """Tells the other ranks why this one stops (they name it when
        their next collective fails). Best effort: the store may be gone
        too."""
        if self._store is None or isinstance(error, RankFailure):
            return
        try:
            self._store.set(FAILURE_KEY, f"rank {self.rank}: {error}")
        except Exception:  # noqa: BLE001 - the store's own failure
            pass

    def run(self, what: str, collective: Callable[[], T]) -> T:
        """`collective()`, its failure raised as a RankFailure that says
        which rank stopped and why, when it said so."""
        try:
            return collective()
        except RuntimeError as error:  # gloo/NCCL: a peer vanished
            raise RankFailure(self._failure_message(what, error)) from error

    def settle(self) -> None:
        """Waits until every rank has come this far (a barrier) before this
        one goes on to stop: a rank that ended at once after a collective
        could otherwise cut it short for a rank it still relays to (gloo's
        ring), which would then hear of a vanished peer instead of the
        outcome. Best effort: a rank that is really gone fails it, and
        what happens next is the caller's either way."""
        try:
            dist.barrier(group=self.group)
        except RuntimeError:
            pass

    def _failure_message(self, what: str, error: BaseException) -> str:
        why = ("another rank stopped (killed, out of memory, or its script "
               "ended) or the network failed; that rank's own output says "
               "which")
        if self._store is not None:
            try:
                if self._store.check([FAILURE_KEY]):
                    why = self._store.get(FAILURE_KEY).decode()
            except Exception:  # noqa: BLE001 - the store went with it
                pass
        return (f"lohan: {what} across the {self.world} data-parallel ranks "
                f"failed: {why} ({error}). Every rank stops; resume with "
                "lohan.init(..., resume=True) on the same ranks, or from "
                "your last engine.save")

    def begin(self, index: int) -> int:
        return self.rank * self.shard[index]

    def padded(self, index: int) -> int:
        return self.shard[index] * self.world

    def _pieces_of(self, layer: Layer) -> List[Piece]:
        size = math.ceil(layer.numel / self.world)
        first, last = self.rank * size, self.rank * size + size
        pieces = []
        for position, (offset, count) in enumerate(zip(layer.offsets,
                                                       layer.sizes())):
            begin, end = max(offset, first), min(offset + count, last)
            if begin < end:
                pieces.append(Piece(position, begin - offset, end - offset,
                                    begin - first))
        return pieces

    def pieces(self, index: int) -> List[Piece]:
        """The parameters of layer `index` that overlap this rank's
        shard, in order."""
        return self._pieces[index]

    def fill(self, index: int, shard: torch.Tensor,
             flat_param: Callable[[int], torch.Tensor]) -> None:
        """Writes this rank's shard of layer `index` into `shard` (its
        first shard[index] elements): `flat_param(position)` is a
        parameter's flat values; the padding is zeros."""
        size = self.shard[index]
        target = shard[:size]
        target.zero_()
        for piece in self._pieces[index]:
            count = piece.end - piece.begin
            target[piece.at:piece.at + count].copy_(
                flat_param(piece.position)[piece.begin:piece.end])

    def gather(self, index: int, shard: torch.Tensor) -> torch.Tensor:
        """Every rank's shard of layer `index` (this rank's: the first
        shard[index] elements of `shard`) back to back: the layer's flat
        vector, padding at the end."""
        size = self.shard[index]
        where = self._collective_device or shard.device
        whole = torch.empty(self.padded(index), dtype=shard.dtype,
                            device=where)
        part = shard[:size].to(where).contiguous()
        self.run(f"gathering layer {index}'s weights",
                 lambda: dist.all_gather_into_tensor(whole, part,
                                                     group=self.group))
        return whole.to(shard.device)

    def reduce(self, index: int, flat: torch.Tensor) -> "Pending":
        """Starts the mean over ranks of layer `index`'s flat gradient
        (padded(index) elements, fp32); its shard when `Pending.wait`s."""
        size = self.shard[index]
        if self._scatter_supported:
            out = torch.empty(size, dtype=flat.dtype, device=flat.device)
            try:
                work = dist.reduce_scatter_tensor(
                    out, flat, op=dist.ReduceOp.SUM, group=self.group,
                    async_op=True)
                return Pending(self, index, work, out)
            except (RuntimeError, NotImplementedError) as error:
                if "support" not in str(error):
                    raise RankFailure(self._failure_message(
                        f"reducing layer {index}'s gradients",
                        error)) from error
                # A backend without reduce-scatter (older gloo): the same
                # sums from an all-reduce, W times the traffic.
                self._scatter_supported = False
        work = self.run(
            f"reducing layer {index}'s gradients",
            lambda: dist.all_reduce(flat, op=dist.ReduceOp.SUM,
                                    group=self.group, async_op=True))
        begin = self.begin(index)
        return Pending(self, index, work, flat[begin:begin + size])

    def sum(self, value: float) -> float:
        """`value` summed over the ranks, in float64."""
        total = torch.tensor([value], dtype=torch.float64,
                             device=self._collective_device)
        self.run("summing over the ranks", lambda: dist.all_reduce(
            total, op=dist.ReduceOp.SUM, group=self.group))
        return float(total.item())

    def exchange(self, what: str, value: Any) -> List[Any]:
        """Every rank's `value` (picklable, small), by rank."""
        values: List[Any] = [None] * self.world
        self.run(what, lambda: dist.all_gather_object(values, value,
                                                      group=self.group))
        return values

    def gather_int(self, what: str, value: int) -> List[int]:
        """Every rank's `value`, by rank (one all-gather of an int64)."""
        where = self._collective_device
        mine = torch.tensor([int(value)], dtype=torch.int64, device=where)
        every = torch.empty(self.world, dtype=torch.int64, device=where)
        self.run(what, lambda: dist.all_gather_into_tensor(every, mine,
                                                           group=self.group))
        return [int(v) for v in every.cpu().tolist()]

    def agree(self, values: List[int]) -> Optional[List[int]]:
        """None when every rank passed the same values; else the indices
        where they differ."""
        mine = torch.tensor([int(v) for v in values], dtype=torch.int64,
                            device=self._collective_device)
        low, high = mine.clone(), mine.clone()
        self.run("comparing the ranks' jobs", lambda: (
            dist.all_reduce(low, op=dist.ReduceOp.MIN, group=self.group),
            dist.all_reduce(high, op=dist.ReduceOp.MAX, group=self.group)))
        differ = (low != high).nonzero().flatten().cpu().tolist()
        return differ or None


def _store_of(group: dist.ProcessGroup) -> Optional[dist.Store]:
    """torch.distributed's key-value store (torchrun's agent holds it, so
    it outlives a rank), for the default group; None otherwise."""
    if group is not dist.group.WORLD:
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, AttributeError, ValueError):
        return None


class Pending:
    """A layer's gradient reduction in flight."""

    def __init__(self, sharding: Sharding, index: int, work: dist.Work,
                 out: torch.Tensor) -> None:
        self.index = index
        self._sharding = sharding
        self._work = work
        self._out = out

    def done(self) -> bool:
        return self._work.is_completed()

    def wait(self) -> torch.Tensor:
        """The mean over ranks of this rank's shard."""
        self._sharding.run(f"reducing layer {self.index}'s gradients",
                           self._work.wait)
        return self._out.div_(self._sharding.world)


class GradientReducer:
    """Reduces each layer's gradient as the GradientRouter hands it over,
    in `order` (the same on every rank): a layer that completes before one
    ahead of it in the order waits. Each shard goes to `deliver(layer,
    shard)` once reduced; the sum of squares of what it delivered (as the
    daemon counts it, in the training dtype) is summed for the global
    norm. `first()` runs before the step's first reduction: at the same
    point of the collectives on every rank, unlike a delivery (which
    happens whenever a reduction is seen done), so what it runs may use
    collectives itself."""

    def __init__(self, sharding: Sharding, order: List[int],
                 dtype: torch.dtype,
                 deliver: Callable[[int, torch.Tensor], None],
                 first: Callable[[], None] = lambda: None) -> None:
        self._sharding = sharding
        self._first = first
        self._order = order
        self._dtype = dtype
        self._deliver = deliver
        self._next = 0  # position in _order of the next layer to reduce
        self._ready: Dict[int, torch.Tensor] = {}
        self._pending: Deque[Pending] = deque()
        # Summed where the shards are (no GPU sync per layer).
        self._squares: Optional[torch.Tensor] = None

    def add(self, index: int, flat: torch.Tensor) -> None:
        """Layer `index`'s gradient, flat (its own dtype, numel elements):
        reduced once every layer ahead of it in the order has been."""
        if self._next == 0 and not self._ready:
            self._first()
        padded = torch.zeros(self._sharding.padded(index),
                             dtype=torch.float32, device=flat.device)
        padded[:flat.numel()].copy_(flat)
        self._ready[index] = padded
        while (self._next < len(self._order)
               and self._order[self._next] in self._ready):
            layer = self._order[self._next]
            self._pending.append(
                self._sharding.reduce(layer, self._ready.pop(layer)))
            self._next += 1
        while self._pending and self._pending[0].done():
            self._hand(self._pending.popleft())

    def _hand(self, pending: Pending) -> None:
        shard = pending.wait().to(self._dtype)
        squares = shard.double().square().sum()
        self._squares = (squares if self._squares is None
                         else self._squares + squares)
        self._deliver(pending.index, shard)

    def finish(self) -> float:
        """Waits for every reduction (every layer must have been added)
        and returns the sum of squares of this rank's shards."""
        if self._next != len(self._order):
            missing = [i for i in self._order[self._next:]
                       if i not in self._ready]
            raise AssertionError(f"layers {missing} were not handed over")
        while self._pending:
            self._hand(self._pending.popleft())
        total = 0.0 if self._squares is None else float(self._squares.item())
        self.reset()
        return total

    def reset(self) -> None:
        """Forgets the step: reductions in flight are waited for (every
        rank runs them) and dropped."""
        while self._pending:
            self._pending.popleft().wait()
        self._ready.clear()
        self._next = 0
        self._squares = None
