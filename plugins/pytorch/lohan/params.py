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
  weights from the daemon, and `model.state_dict()` gets the weights in
  place of the placeholders from a hook (engine.py), as host tensors.

With param_unit="sublayer" a block is several layers: its own (the
norms), materialized around the whole block as above, and one per
sublayer, materialized around each run of that sublayer (sublayers.py):
forward, the block's recompute, and the sublayer's own recompute in the
block's backward, after which the weights stay until the sublayer's
gradients are complete (accumulating a parameter's gradient needs it in
its shape) and the gradient router lets them go. Each layer's weights are
copied to the device one ahead, in the order the previous step used them
(Schedule), else by the direction of travel; a layer whose next run
follows at once (a block's last sublayer from the block's recompute into
its own, the last block from forward into its recompute) keeps the
weights it has on the device.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import (Any, Callable, ContextManager, Dict, FrozenSet,
                    Iterator, List, Optional, Set, Tuple)

import torch
from torch import nn

from lohan.blocks import Layer
from lohan.devices import to_device

MODES = ("auto", "resident", "offload")


def resolve_mode(mode: str, device: Optional[torch.device]) -> str:
    """"auto": offload when the model computes on an accelerator (its
    weights then need not all fit it) or `device` is None (a model too
    large to hold whole: built on the meta device), else resident."""
    if mode not in MODES:
        raise ValueError(f"params={mode!r} is not supported; use one of "
                         f"{', '.join(MODES)}")
    if mode != "auto":
        return mode
    return "offload" if device is None or device.type != "cpu" else (
        "resident")


def _malloc_trim() -> Optional[Callable[[int], int]]:
    """The C library's malloc_trim (glibc), None without it."""
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


class FrozenWeights:
    """The blocks' frozen parameters (requires_grad=False: a LoRA model's
    base weights, say) under params="offload". The daemon does not train
    them, so their home between uses is a host copy kept here: the tensor
    itself for a CPU model, a pinned copy made once for a GPU model (whose
    device memory then holds only the running block's), up to `host_bytes`
    (None: all of them); beyond that, the daemon's SSDs (through `store`,
    the activation store's arena area: read back each time the block
    runs). Like the trained weights, they are placeholders between uses and
    the next block's are copied to the device one block ahead (on a side
    stream on a GPU). Not thread-safe."""

    def __init__(self, blocks: List[nn.Module], device: torch.device,
                 host_bytes: Optional[int] = None, store: Any = None,
                 value: Optional[Callable[[nn.Parameter],
                                          torch.Tensor]] = None):
        """`device`: where the blocks compute (their parameters may still
        be on the CPU: a model larger than the GPU). `value(param)`: a
        parameter's values for its home (default: its own data; for a
        model built on meta, read from the checkpoint)."""
        value = value or (lambda param: param.data)
        self._store = store
        self._order: List[nn.Module] = []
        # Per block: (parameter, its home: a host tensor or an SSD handle,
        # its placeholder).
        self._homes: Dict[int, List[Tuple[nn.Parameter, Any,
                                          torch.Tensor]]] = {}
        self.host_bytes = 0  # frozen weights in host memory
        self.ssd_bytes = 0   # on the daemon's SSDs
        seen = set()
        for block in blocks:
            frozen = []
            for param in block.parameters():
                if param.requires_grad or id(param) in seen:
                    continue
                seen.add(id(param))
                nbytes = param.numel() * param.element_size()
                data = value(param)
                if host_bytes is not None and (
                        self.host_bytes + nbytes > host_bytes):
                    home = store.keep_on_ssd(data.to("cpu"))
                    self.ssd_bytes += nbytes
                else:
                    home = (data if device.type == "cpu"
                            and data.device.type == "cpu"
                            else data.to("cpu").pin_memory())
                    self.host_bytes += nbytes
                placeholder = torch.empty(0, dtype=param.dtype, device=device)
                frozen.append((param, home, placeholder))
            if frozen:
                self._homes[id(block)] = frozen
                self._order.append(block)
        self._home_of = {id(param): home for entries in self._homes.values()
                         for param, home, _ in entries}
        self._position = {id(b): n for n, b in enumerate(self._order)}
        self._travel = Travel()
        self._live: Dict[int, int] = {}
        self._ready: Dict[int, List[Tuple[torch.Tensor, Any]]] = {}
        self.prefetched = 0
        self.release_all()

    def __bool__(self) -> bool:
        return bool(self._order)

    def homes(self, block: nn.Module) -> Dict[int, torch.Tensor]:
        """The block's frozen parameters' values on the host, by
        id(param)."""
        return {id(param): self._on_host(home)
                for param, home, _ in self._homes.get(id(block), [])}

    def stored(self, param: nn.Parameter
               ) -> Optional[Tuple[torch.Size, Callable[[], torch.Tensor]]]:
        """A frozen parameter's shape and a reader of its host values
        (from the SSDs when it lives there); None for one not kept here."""
        home = self._home_of.get(id(param))
        if home is None:
            return None
        return home.shape, lambda: self._on_host(home)

    def _on_host(self, home: Any, pinned: bool = False) -> torch.Tensor:
        """A home's values in host memory: the host copy, or read from the
        SSDs (into pinned memory with `pinned`: a GPU copy follows)."""
        return home if isinstance(home, torch.Tensor) else self._store.get(
            home, pinned=pinned)

    def _copy(self, home: Any,
              device: torch.device) -> Tuple[torch.Tensor, Any]:
        # On the CPU the host copy is the parameter's storage (one read
        # from the SSDs is a fresh tensor already).
        return to_device(self._on_host(home, pinned=device.type == "cuda"),
                         device, private=False)

    def materialize(self, block: nn.Module) -> None:
        key = id(block)
        if key not in self._homes:
            return
        depth = self._live.get(key, 0)
        self._live[key] = depth + 1
        if depth:
            return
        ready = self._ready.pop(key, None)
        if ready is not None:
            self.prefetched += 1
        else:
            ready = [self._copy(home, placeholder.device)
                     for _, home, placeholder in self._homes[key]]
        for (param, _, placeholder), (tensor, event) in zip(
                self._homes[key], ready):
            if event is not None:
                current = torch.cuda.current_stream(placeholder.device)
                current.wait_event(event)
                tensor.record_stream(current)
            param.data = tensor
        self._travel.enter(self._position[key])

    def release(self, block: nn.Module) -> None:
        key = id(block)
        if key not in self._homes or self._live.get(key, 0) == 0:
            return
        self._live[key] -= 1
        if self._live[key]:
            return
        del self._live[key]
        for param, _, placeholder in self._homes[key]:
            param.data = placeholder
        position = self._position[key]
        nxt = self._travel.next(position, len(self._order))
        if nxt is None or self._travel.last != position:
            return
        following = self._order[nxt]
        if id(following) in self._ready or id(following) in self._live:
            return
        self._ready[id(following)] = [
            self._copy(home, placeholder.device)
            for _, home, placeholder in self._homes[id(following)]]

    def release_all(self) -> None:
        self._live.clear()
        self._ready.clear()
        self._travel.reset()
        for entries in self._homes.values():
            for param, _, placeholder in entries:
                param.data = placeholder

    def restore_all(self, device: Optional[torch.device] = None,
                    skip: FrozenSet[int] = frozenset()) -> None:
        """Every frozen parameter but those in `skip` (ids) back in its own
        storage on `device` (None: where the blocks compute), for good (the
        engine is closing)."""
        self._ready.clear()
        self._live.clear()
        for entries in self._homes.values():
            for param, home, placeholder in entries:
                if id(param) in skip:
                    continue
                tensor, event = self._copy(home, device or placeholder.device)
                if event is not None:
                    event.synchronize()
                    _owned_by_compute_stream(tensor)
                param.data = tensor


def _owned_by_compute_stream(tensor: torch.Tensor) -> None:
    """`tensor` was made on a copy stream and stays as a parameter's
    storage: when it is freed, the allocator must also wait for the compute
    stream's kernels that used it before handing the memory out again."""
    tensor.record_stream(torch.cuda.current_stream(tensor.device))


class Travel:
    """Which way blocks are being run: forward upwards, backward
    downwards; the same block twice in a row (the last block's forward,
    then its recompute) is where forward turns into backward."""

    def __init__(self):
        self.last: Optional[int] = None
        self.heading = 1

    def reset(self) -> None:
        self.last = None
        self.heading = 1

    def enter(self, position: int) -> None:
        if self.last is None:
            self.heading = 1
        elif position != self.last:
            self.heading = 1 if position > self.last else -1
        else:
            self.heading = -self.heading
        self.last = position

    def next(self, position: int, count: int) -> Optional[int]:
        """The position expected after `position`, if any."""
        nxt = position + self.heading
        return nxt if 0 <= nxt < count else None


class Schedule:
    """The order layers were entered in the previous step, which the next
    repeats when the model is called the same way (the usual training
    loop): the layer expected next is the one that followed the last
    entered then. Weights streamed below the block zigzag (a block's
    units forward, again in its recompute, then backwards in its
    backward), which no direction rule predicts. A step that departs from
    the record predicts nothing more (Travel takes over)."""

    def __init__(self) -> None:
        self._previous: List[int] = []
        self._current: List[int] = []
        self._matched = 0  # leading entries of _previous this step repeats
        self.following = False

    # Entries kept per step: a step that makes more (forward calls
    # without steps, say an evaluation) predicts nothing for the next.
    LIMIT = 1 << 16

    def new_step(self) -> None:
        if len(self._current) > self.LIMIT:
            self._previous = []
        elif self._current:
            self._previous = self._current
        self._current = []
        self._matched = 0
        self.following = bool(self._previous)

    def enter(self, layer: int) -> None:
        if len(self._current) <= self.LIMIT:
            self._current.append(layer)
        if not self.following:
            return
        if (self._matched < len(self._previous)
                and self._previous[self._matched] == layer):
            self._matched += 1
        else:
            self.following = False

    def next(self, ahead: int = 1) -> Optional[int]:
        """The layer expected `ahead` entries after the last entered (None:
        past the step's last); only while `following`."""
        position = self._matched + ahead - 1
        if position < len(self._previous):
            return self._previous[position]
        return None


class Both:
    """Runs materialize/release on several residencies in turn."""

    def __init__(self, *parts):
        self._parts = [p for p in parts if p]

    def __bool__(self) -> bool:
        return bool(self._parts)

    def materialize(self, block: nn.Module) -> None:
        for part in self._parts:
            part.materialize(block)

    def release(self, block: nn.Module) -> None:
        for part in reversed(self._parts):
            part.release(block)

    def differentiating(self, block: nn.Module) -> ContextManager[None]:
        stack = contextlib.ExitStack()
        for part in self._parts:
            if hasattr(part, "differentiating"):
                stack.enter_context(part.differentiating(block))
        return stack


class ParameterResidency:
    """Moves block weights in and out of their parameters ("offload"),
    one block ahead: when block i starts, the daemon is asked (without
    waiting) for the weights of the block that runs next (i+1 in forward,
    i-1 in backward); when block i is done, those weights are copied to the
    device (on a GPU: on a side stream, overlapping block i's kernels
    still running), so block i+1 finds them there.
    Not thread-safe: the training loop and autograd call it on one
    thread."""

    def __init__(self, layers: List[Layer], remote, weight_views:
                 List[torch.Tensor], device: torch.device,
                 whole: Optional[Callable[[int, torch.Tensor],
                                          torch.Tensor]] = None):
        """`whole(layer, flat)` (data-parallel ranks, whose arena holds a
        shard of each layer): the layer's whole flat weights from this
        rank's shard of them, gathered from every rank (a collective: the
        ranks materialize blocks in the same order)."""
        self._remote = remote
        self._whole = whole
        self._views = weight_views  # per layer, into the arena
        blocks = [layer for layer in layers if layer.block is not None]
        # A block's own layer by the block, a unit layer by its module.
        self._by_module: Dict[int, Layer] = {
            id(l.block if l.unit is None else l.unit): l for l in blocks}
        # Neighbours in layer order (forward runs them in this order).
        self._order: List[Layer] = blocks
        self._position: Dict[int, int] = {
            l.index: n for n, l in enumerate(blocks)}
        self._layers: Dict[int, Layer] = {l.index: l for l in blocks}
        self._placeholders: Dict[int, List[torch.Tensor]] = {}
        for layer in blocks:
            self._placeholders[layer.index] = [
                torch.empty(0, dtype=p.dtype, device=device)
                for p in layer.params]
        self._live: Dict[int, int] = {}  # layer -> nested materializations
        # Which (layer, step) each arena weight buffer holds: layers may
        # share a buffer (a streamed layout), and weights change each step.
        self._holds: Dict[int, Tuple[int, int]] = {}
        # FETCH_PARAMS in flight per buffer: (layer, step, ticket).
        self._pending: Dict[int, Tuple[int, int, int]] = {}
        # Weights copied to the device ahead of their block: layer ->
        # (flat tensor, event of the copy or None).
        self._ready: Dict[int, Tuple[torch.Tensor, Any]] = {}
        self._step = 0
        self._travel = Travel()
        self._schedule = Schedule()
        # The device weights each materialized layer's parameters view.
        self._flats: Dict[int, torch.Tensor] = {}
        # Blocks whose backward runs (nesting depth), and unit layers held
        # until their gradients are in (see differentiating).
        self._differentiating: Dict[int, int] = {}
        self._awaiting: Set[int] = set()
        self.fetches = 0      # FETCH_PARAMS requests
        self.prefetched = 0   # blocks whose weights were on the device early
        self.copied_bytes = 0  # weights copied to the device (the link's)
        # GPU copies out of a weight buffer still in flight: a fetch into
        # that buffer waits for them (a streamed layout reuses buffers).
        self._copies: Dict[int, Any] = {}
        # On the CPU a block's weights are heap memory: glibc raises its
        # mmap threshold past their size once such a copy is freed and
        # then keeps later ones in its arenas, so the process would grow
        # towards every block's weights; malloc_trim hands a released
        # block's pages back (tens of microseconds).
        self._trim = _malloc_trim() if device.type == "cpu" else None

    @property
    def layers(self) -> List[Layer]:
        return list(self._order)

    def current_weights(self, layer: Layer) -> torch.Tensor:
        """The layer's current weights, flat, in a private host tensor (for
        a state_dict between steps)."""
        flat = self._fetch(layer).clone()
        return flat if self._whole is None else self._whole(layer.index, flat)

    def layer_of(self, module: nn.Module) -> Optional[Layer]:
        """The layer whose weights `module` (a block, or a unit of one)
        materializes."""
        return self._by_module.get(id(module))

    def holds(self, layer: Layer) -> bool:
        """Whether the layer's weights are offloaded here."""
        return layer.index in self._layers

    def layers_of(self, block: nn.Module) -> List[Layer]:
        """The block's offloaded layers: its own and its units'."""
        return [layer for layer in self._order if layer.block is block]

    def new_step(self) -> None:
        """The daemon has new weights: fetch again before the next use."""
        self._settle()
        self._ready.clear()
        self._step += 1
        self._travel.reset()
        self._schedule.new_step()

    def forget_arena(self) -> None:
        """Before the data plane moves (share_move.py): every fetch and
        GPU copy out of the arena done, and nothing remembered by buffer
        address (the new arena's buffers may lie at the old addresses and
        hold nothing yet). Its weight views are the session's lists,
        mapped anew in place."""
        self._settle()
        for event in self._copies.values():
            event.synchronize()
        self._copies.clear()
        self._holds.clear()

    def _settle(self) -> None:
        """Waits for every fetch in flight (their errors surface here)."""
        pending, self._pending = self._pending, {}
        for address, (layer, step, ticket) in pending.items():
            self._remote.wait(ticket)
            self._holds[address] = (layer, step)

    def _free_buffer(self, address: int) -> None:
        """Before a fetch overwrites a buffer: wait for what reads it."""
        pending = self._pending.pop(address, None)
        if pending is not None:
            layer, step, ticket = pending
            self._remote.wait(ticket)
            self._holds[address] = (layer, step)
        copy = self._copies.pop(address, None)
        if copy is not None:
            copy.synchronize()

    def _fetch(self, layer: Layer) -> torch.Tensor:
        """The layer's current weights in its arena buffer (waits)."""
        view = self._views[layer.index]
        address = view.data_ptr()
        pending = self._pending.get(address)
        if pending is not None and pending[:2] == (layer.index, self._step):
            self._free_buffer(address)  # ours: just wait for it
        if self._holds.get(address) != (layer.index, self._step):
            self._free_buffer(address)
            self._remote.fetch_params(layer.index)
            self.fetches += 1
            self._holds[address] = (layer.index, self._step)
        return view

    def _request(self, layer: Layer) -> None:
        """Asks for the layer's weights without waiting (if its buffer does
        not hold them yet)."""
        address = self._views[layer.index].data_ptr()
        wanted = (layer.index, self._step)
        if (self._holds.get(address) == wanted
                or (address in self._pending
                    and self._pending[address][:2] == wanted)):
            return
        if any(self._views[other].data_ptr() == address
               for other, depth in self._live.items() if depth):
            return  # the buffer is the running block's own (one buffer)
        self._free_buffer(address)
        self._pending[address] = (
            layer.index, self._step,
            self._remote.submit_fetch_params(layer.index))
        self.fetches += 1

    def _to_device(self, layer: Layer, source: torch.Tensor,
                   device: torch.device) -> Tuple[torch.Tensor, Any]:
        """A private copy of `source` (the layer's arena buffer) on
        `device`; on a GPU asynchronous on the copy stream, with its event,
        which a fetch into that buffer waits for. Data-parallel ranks: the
        whole layer gathered from the copy of this rank's shard, on the
        compute stream (no event then)."""
        flat, event = to_device(source, device, private=True)
        self.copied_bytes += source.numel() * source.element_size()
        if event is not None:
            self._copies[source.data_ptr()] = event
        if self._whole is None:
            return flat, event
        if event is not None:
            torch.cuda.current_stream(device).wait_event(event)
            flat.record_stream(torch.cuda.current_stream(device))
        return self._whole(layer.index, flat), None

    def _neighbour(self, position: int) -> Optional[Layer]:
        """The layer expected after the last entered (at `position`): as in
        the previous step, else by the direction of travel."""
        if self._schedule.following:
            index = self._schedule.next()
            return None if index is None else self._layers[index]
        nxt = self._travel.next(position, len(self._order))
        return None if nxt is None else self._order[nxt]

    def materialize(self, module: nn.Module) -> None:
        layer = self.layer_of(module)
        if layer is None:
            return
        depth = self._live.get(layer.index, 0)
        self._live[layer.index] = depth + 1
        if depth:
            return  # nested (a block calling itself, or a recompute)
        device = self._placeholders[layer.index][0].device
        ready = self._ready.pop(layer.index, None)
        if ready is not None:
            flat, event = ready
            if event is not None:
                current = torch.cuda.current_stream(device)
                current.wait_event(event)
                flat.record_stream(current)
            self.prefetched += 1
        else:
            flat, event = self._to_device(layer, self._fetch(layer), device)
            if event is not None:
                current = torch.cuda.current_stream(device)
                current.wait_event(event)
                flat.record_stream(current)
        self._assign(layer, flat)
        position = self._position[layer.index]
        self._travel.enter(position)
        self._schedule.enter(layer.index)
        nxt = self._neighbour(position)
        if nxt is None:
            return
        if nxt.index not in self._ready:
            self._request(nxt)
        if nxt.block is layer.block and nxt.unit is not None:
            # The block's first unit runs while the block's own weights
            # stay: no release in between to stage it at.
            self._stage(nxt)
        self._request_second()

    def _request_second(self) -> None:
        """Asks for the layer after the next too (as in the previous
        step), so that a unit's weights are in the arena before the one
        ahead of it is done, unless that would take the next's buffer."""
        if not self._schedule.following:
            return
        second, after = self._schedule.next(1), self._schedule.next(2)
        if second is None or after is None or after in self._ready:
            return
        if (self._views[after].data_ptr()
                == self._views[second].data_ptr()):
            return
        self._request(self._layers[after])

    @contextlib.contextmanager
    def differentiating(self, block: nn.Module) -> Iterator[None]:
        """While the block's backward runs: a unit's weights materialized
        then (its recompute) stay until the unit's gradients are complete
        (`gradients_taken`), since accumulating a parameter's gradient
        needs the parameter in its shape; at the end, any still held go."""
        key = id(block)
        self._differentiating[key] = self._differentiating.get(key, 0) + 1
        try:
            yield
        finally:
            self._differentiating[key] -= 1
            if not self._differentiating[key]:
                del self._differentiating[key]
                for index in sorted(self._awaiting):
                    if self._layers[index].block is block:
                        self.gradients_taken(index)

    def gradients_taken(self, index: int) -> None:
        """Every parameter of layer `index` has its gradient from the
        running backward call: a unit held for it goes."""
        if index in self._awaiting:
            self._awaiting.discard(index)
            self._let_go(self._layers[index])

    def release(self, module: nn.Module) -> None:
        layer = self.layer_of(module)
        if layer is None or self._live.get(layer.index, 0) == 0:
            return
        if (self._live[layer.index] == 1 and layer.unit is not None
                and id(layer.block) in self._differentiating):
            self._awaiting.add(layer.index)  # until its gradients are in
            return
        self._let_go(layer)

    def _let_go(self, layer: Layer) -> None:
        self._live[layer.index] -= 1
        if self._live[layer.index] == 0:
            del self._live[layer.index]
            flat = self._flats.pop(layer.index, None)
            self._drop(layer)
            if flat is not None and self._runs_again(layer):
                # Its next run follows at once (a block's last sublayer,
                # or the last block, from forward into its recompute): the
                # weights on the device serve it without crossing again.
                self._ready[layer.index] = (flat, None)
                return
            del flat  # freed before the next layer's copy is made
            if self._trim is not None:
                self._trim(0)
            self._stage_next(layer)

    def _runs_again(self, layer: Layer) -> bool:
        """Whether, as in the previous step, the layer just released is
        the next one to run."""
        return (self._schedule.following
                and self._schedule.next() == layer.index)

    def _stage_next(self, layer: Layer) -> None:
        """Copies the weights of the layer expected next to the device now
        that the running one is done (its kernels may still run)."""
        position = self._position[layer.index]
        if not self._schedule.following and self._travel.last != position:
            return  # another block ran meanwhile (a nested call)
        nxt = self._neighbour(position)
        if nxt is not None:
            self._stage(nxt)

    def _stage(self, nxt: Layer) -> None:
        """Copies the weights of `nxt`, expected next, to the device ahead
        of its use, once they are in its arena buffer."""
        if nxt.index in self._ready or nxt.index in self._live:
            return
        address = self._views[nxt.index].data_ptr()
        wanted = (nxt.index, self._step)
        pending = self._pending.get(address)
        if pending is not None and pending[:2] == wanted:
            self._free_buffer(address)  # wait for our fetch
        if self._holds.get(address) != wanted:
            return
        device = self._placeholders[nxt.index][0].device
        # One layer staged at a time: a copy made for a guess that did not
        # come true (another order than expected) goes.
        self._ready.clear()
        self._ready[nxt.index] = self._to_device(
            nxt, self._views[nxt.index], device)

    def _assign(self, layer: Layer, flat: torch.Tensor) -> None:
        """The layer's parameters become views of `flat` (kept for its
        next run if that follows at once)."""
        self._flats[layer.index] = flat
        for param, offset, shape in zip(layer.params, layer.offsets,
                                        layer.shapes):
            param.data = flat[offset:offset + shape.numel()].view(shape)

    def _drop(self, layer: Layer) -> None:
        for param, placeholder in zip(layer.params,
                                      self._placeholders[layer.index]):
            param.data = placeholder

    def restore_all(self, device: Optional[torch.device] = None,
                    skip: FrozenSet[int] = frozenset()) -> None:
        """Gives every block its current weights in its own storage on
        `device` (None: where the blocks compute) for good (the engine is
        closing), but a layer with a parameter in `skip` (ids)."""
        self._settle()
        self._ready.clear()
        self._live.clear()
        for layer in self._order:
            if any(id(p) in skip for p in layer.params):
                continue
            self._live.clear()
            self._travel.reset()
            flat, event = self._to_device(
                layer, self._fetch(layer),
                device or self._placeholders[layer.index][0].device)
            if event is not None:
                event.synchronize()
                _owned_by_compute_stream(flat)
            self._assign(layer, flat)
        self._flats.clear()

    def release_all(self) -> None:
        """Every block back to its placeholder (at step(), whatever a
        forward left materialized, e.g. one whose backward never ran)."""
        self._live.clear()
        self._flats.clear()
        self._awaiting.clear()
        self._ready.clear()
        self._travel.reset()
        for layer in self._order:
            self._drop(layer)
