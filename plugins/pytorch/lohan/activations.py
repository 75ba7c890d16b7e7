"""What happens to each block's activations between forward and backward.

Policies (`lohan.init(..., activations=...)`):
- "keep": torch's default; every intermediate stays in memory.
- "recompute": only each block's inputs are kept, where they are; backward
  recomputes the block's forward (torch.utils.checkpoint, non-reentrant).
- "offload" (the default): as "recompute", and each block's input leaves
  the device: it goes to host memory (pinned; for a CPU model it already
  is there and stays put) up to `activation_host_bytes`, and beyond that to
  the daemon's SSDs through the job's arena (ACT_PUT); backward brings it
  back just before the block is recomputed. Activation memory on the device
  is then one block's intermediates.
- A plan: one mode per block (a list, in the blocks' order; what
  `lohanctl plan` decides per block): "offload" as above; "swap": nothing
  is recomputed, every tensor autograd saves inside the block (but its
  parameters and tensors under 64 KiB) goes to the same store as block
  inputs do (host memory, beyond the budget the SSDs) and comes back when
  backward needs it; "keep": torch's default for that block; or a list
  of per-tensor decisions ("device", "host", "ssd", "recompute"), one per
  tensor the block saves (planned.py).
- "auto": the first iteration runs as "offload" and profiles the device
  and every block (profile.py); lohand's planner then decides per saved
  tensor and the plan applies from the second iteration on.

The recompute of "offload" is our own autograd.Function (the input must be
handed to the store, which torch's checkpoint keeps in a closure). It
replays the forward with the RNG state and autocast settings of the
original run, so dropout and mixed precision recompute the same values.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import checkpoint

from lohan.client import LohanError, StatusCode
from lohan.devices import copy_stream
from lohan.planned import DECISIONS, Stored, planned_forward, unpack
from lohan.sublayers import one_at_a_time

POLICIES = ("keep", "recompute", "offload")
# The modes a plan gives each block.
BLOCK_MODES = ("offload", "swap", "keep")
# Saved tensors smaller than this stay where autograd keeps them (a norm's
# statistics, a mask): storing them would cost more than they hold.
_MIN_SWAP_BYTES = 64 * 1024


@dataclass
class ActivationStats:
    """Block inputs handed to the store since the engine opened."""

    host_puts: int = 0
    host_bytes: int = 0       # now held in host memory
    host_peak_bytes: int = 0
    ssd_puts: int = 0
    ssd_bytes: int = 0        # now held on the daemon's SSDs
    ssd_peak_bytes: int = 0
    gets: int = 0
    prefetched: int = 0       # SSD inputs read ahead of their recompute
    shared: int = 0           # puts of a tensor stored already (not again)
    # Pieces the daemon had no SSD space for (the job's limit, its owner's
    # quota or fair share, a full array): kept in host memory instead.
    ssd_refused: int = 0
    ssd_refused_bytes: int = 0


class _Handle:
    """One stored tensor. Dropped handles (a forward whose graph was thrown
    away) give their storage back on the store's next call."""

    __slots__ = ("store", "tensor", "ids", "nbytes", "shape", "dtype",
                 "device", "prefetch", "copied", "counted", "version",
                 "host_pieces", "pending", "__weakref__")

    def __init__(self, store: "ActivationStore", nbytes: int,
                 shape: torch.Size, dtype: torch.dtype,
                 device: torch.device):
        self.store = store
        self.tensor: Optional[torch.Tensor] = None  # host copy or original
        self.ids: List[Tuple[int, int, int]] = []  # SSD: (id, offset, len)
        self.nbytes = nbytes
        self.shape = shape
        self.dtype = dtype
        self.device = device
        # SSD, fetched ahead: (buffer, ticket of its ACT_GET).
        self.prefetch: Optional[Tuple["_Buffer", int]] = None
        self.copied: Any = None  # GPU -> host: the copy's CUDA event
        self.counted = False  # in the store's stats (a put that finished)
        # A tensor kept as it is (no copy): its version at the put. Changed
        # in place before backward, the recompute would see other values.
        self.version: Optional[int] = None
        # SSD pieces the daemon refused, kept in host memory instead (by
        # their index in ids), and puts not yet answered.
        self.host_pieces: Dict[int, torch.Tensor] = {}
        self.pending = 0

    def __del__(self) -> None:
        store = self.store
        if store is not None:
            store._dropped.append((self.tensor is not None,
                                   self.nbytes if self.counted else 0,
                                   self.ids, self.prefetch))


class _Buffer:
    """One half of the arena's activation area: the request using it (a
    put's ticket, and the handle and piece it holds until the put is
    answered) and the handle a prefetch keeps it for."""

    __slots__ = ("offset", "view", "ticket", "piece", "reserved")

    def __init__(self, offset: int, view: torch.Tensor):
        self.offset = offset
        self.view = view
        self.ticket: Optional[int] = None
        self.piece: Optional[Tuple["weakref.ref[_Handle]", int, int]] = None
        self.reserved = False


class ActivationStore:
    """Host memory up to `host_bytes` (None: no limit), the daemon's SSDs
    beyond, through `remote`'s activation area. The area is two buffers:
    a put copies a piece into one and goes on while the daemon writes it
    (ACT_PUT without waiting), and backward's get of one block input starts
    the ACT_GET of the next one it will need (the most recent input still on
    the SSDs) into the other, so that read overlaps the block's recompute.
    Not thread-safe: autograd calls it on one thread."""

    def __init__(self, host_bytes: Optional[int], remote: Any = None,
                 area: Optional[torch.Tensor] = None,
                 device_copies: bool = False):
        self.host_limit = host_bytes
        self._remote = remote
        # The client library copies GPU tensors into the (pinned) area on a
        # stream and submits their puts once copied (see _write_pieces).
        self._device_copies = device_copies
        self._buffers: List[_Buffer] = []
        if area is not None:
            half = area.numel() // 2 // 4096 * 4096
            if half == 0:
                raise ValueError("the activation area needs two pages")
            self._buffers = [_Buffer(0, area[:half]),
                             _Buffer(half, area[half:2 * half])]
        self._next_buffer = 0
        self._ids = itertools.count(1)
        self._dropped: List[Tuple[Any, ...]] = []
        # Inputs on the SSDs not brought back yet, in put order (backward
        # wants them newest first).
        self._on_ssd: List["weakref.ref[_Handle]"] = []
        # (storage, offset, shape, stride, dtype, device, version) ->
        # (the tensor, its handle), both weakly: what is stored now.
        self._stored: Dict[tuple, Tuple[Any, Any]] = {}
        # _stored is cleared of dead entries once it has doubled since the
        # last time (a swapped block puts many tensors per forward).
        self._prune_at = 64
        self.stats = ActivationStats()
        self._closed = False

    @property
    def piece_bytes(self) -> int:
        return self._buffers[0].view.numel() if self._buffers else 0

    def sweep(self) -> None:
        """Gives back the storage of spent and dropped tensors."""
        self._sweep()

    def _sweep(self) -> None:
        while self._dropped:
            on_host, nbytes, ids, prefetch = self._dropped.pop()
            if on_host:
                self.stats.host_bytes -= nbytes
                continue
            self.stats.ssd_bytes -= nbytes
            if self._closed:
                continue
            if prefetch is not None:  # read ahead, then never asked for
                buffer, ticket = prefetch
                buffer.reserved = False
                try:
                    self._remote.wait(ticket)
                except LohanError:
                    pass  # it is being dropped anyway
            for activation_id, _, _ in ids:
                try:
                    self._remote.act_free(activation_id)
                except LohanError as error:
                    # A piece whose put failed (a full SSD, say) was never
                    # held: that failure was reported where it surfaced.
                    if error.code != StatusCode.NOT_FOUND:
                        raise

    def _buffer(self) -> _Buffer:
        """A buffer free for a new request (its last put is finished)."""
        for _ in range(len(self._buffers)):
            buffer = self._buffers[self._next_buffer]
            self._next_buffer = (self._next_buffer + 1) % len(self._buffers)
            if not buffer.reserved:
                break
        else:  # both kept for prefetches: cannot happen with one at a time
            raise RuntimeError("lohan: no free activation buffer")
        if buffer.ticket is not None:
            self._wait_put(buffer)
        return buffer

    def _wait_put(self, buffer: _Buffer) -> None:
        """Waits for the buffer's put. One the daemon had no SSD space for
        (RESOURCE_EXHAUSTED: the job's limit, its owner's quota or fair
        share, a full array) keeps its piece in host memory: its bytes are
        still in the buffer. Any other failure: the other put in flight is
        waited for too (it most likely failed the same way, and must not
        surface again later) and the first error is raised."""
        ticket, buffer.ticket = buffer.ticket, None
        piece, buffer.piece = buffer.piece, None
        handle = piece[0]() if piece is not None else None
        if handle is not None:
            handle.pending -= 1
        try:
            self._remote.wait(ticket)
        except LohanError as error:
            if (error.code == StatusCode.RESOURCE_EXHAUSTED
                    and piece is not None):
                _, index, length = piece
                if handle is not None:
                    handle.host_pieces[index] = buffer.view[:length].clone()
                self.stats.ssd_refused += 1
                self.stats.ssd_refused_bytes += length
                return
            for other in self._buffers:
                if other.ticket is not None:
                    pending, other.ticket = other.ticket, None
                    other.piece = None
                    try:
                        self._remote.wait(pending)
                    except LohanError:
                        pass
            raise

    def drain(self) -> None:
        """Waits for the puts in flight (their errors surface here)."""
        for buffer in self._buffers:
            if buffer.ticket is not None:
                self._wait_put(buffer)

    def _to_host(self, tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        """A pinned host copy of a GPU tensor, made on a side stream once
        the compute stream has produced the tensor, so the copy overlaps
        the next kernels; returns it with the copy's event."""
        device = tensor.device
        stream = copy_stream(device, outbound=True)
        produced = torch.cuda.Event()
        produced.record(torch.cuda.current_stream(device))
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        with torch.cuda.stream(stream):
            stream.wait_event(produced)
            host.copy_(tensor, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(stream)
        # The allocator must not hand the tensor's memory to another
        # kernel before the copy has read it.
        tensor.record_stream(stream)
        return host, copied

    def put(self, tensor: torch.Tensor, to_ssd: bool = False) -> _Handle:
        """Stores `tensor`: in host memory while it fits the budget (and
        not `to_ssd`), else on the daemon's SSDs (when the store reaches
        them; host memory otherwise)."""
        self._sweep()
        # The same tensor given to several blocks (an encoder's output to
        # every decoder block, a shared mask) is stored once.
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
               tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype,
               tensor.device, tensor._version)
        known = self._stored.get(key)
        if known is not None:
            source, stored = known[0](), known[1]()
            if source is tensor and stored is not None:
                self.stats.shared += 1
                return stored
        nbytes = tensor.numel() * tensor.element_size()
        handle = _Handle(self, nbytes, tensor.shape, tensor.dtype,
                         tensor.device)
        if len(self._stored) >= self._prune_at:
            self._stored = {k: v for k, v in self._stored.items()
                            if v[0]() is not None and v[1]() is not None}
            self._prune_at = max(64, 2 * len(self._stored))
        self._stored[key] = (weakref.ref(tensor), weakref.ref(handle))
        stats = self.stats
        fits = (self.host_limit is None
                or stats.host_bytes + nbytes <= self.host_limit)
        if (fits and not to_ssd) or not self._buffers:
            if tensor.device.type == "cpu":
                handle.tensor = tensor  # already in host memory
                handle.version = tensor._version
            else:
                handle.tensor, handle.copied = self._to_host(tensor)
            handle.counted = True
            stats.host_puts += 1
            stats.host_bytes += nbytes
            stats.host_peak_bytes = max(stats.host_peak_bytes,
                                        stats.host_bytes)
            return handle
        self._write_pieces(handle, tensor)
        self._on_ssd.append(weakref.ref(handle))
        handle.counted = True
        stats.ssd_puts += 1
        stats.ssd_bytes += nbytes
        stats.ssd_peak_bytes = max(stats.ssd_peak_bytes, stats.ssd_bytes)
        return handle

    def _write_pieces(self, handle: _Handle, tensor: torch.Tensor) -> None:
        """The tensor's bytes to the daemon's SSDs (ACT_PUT), a buffer's
        worth at a time, without waiting for the last ones. A GPU tensor's
        pieces are copied into the area on the outbound copy stream, once
        the compute stream has produced the tensor, and each put goes out
        when its copy is done (the client library's stream callback): the
        forward does not wait for them."""
        source = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        on_device = source.device.type == "cuda" and self._device_copies
        if on_device:
            stream = copy_stream(source.device, outbound=True)
            stream.wait_stream(torch.cuda.current_stream(source.device))
            # The allocator must not reuse the memory before the copies
            # have read it.
            source.record_stream(stream)
        for begin in range(0, handle.nbytes, self.piece_bytes):
            length = min(self.piece_bytes, handle.nbytes - begin)
            buffer = self._buffer()
            activation_id = next(self._ids)
            buffer.piece = (weakref.ref(handle), len(handle.ids), length)
            handle.pending += 1
            if on_device:
                buffer.ticket = self._remote.submit_act_put_from_device(
                    activation_id, buffer.offset, length,
                    source.data_ptr() + begin, source.device.index,
                    stream.cuda_stream)
            else:
                buffer.view[:length].copy_(source[begin:begin + length])
                buffer.ticket = self._remote.submit_act_put(
                    activation_id, buffer.offset, length)
            handle.ids.append((activation_id, begin, length))

    def keep_on_ssd(self, tensor: torch.Tensor) -> _Handle:
        """Stores a CPU tensor on the daemon's SSDs for as long as the
        handle is held, to be read with get() any number of times (frozen
        block weights). Not counted as an activation, nor read ahead."""
        if not self._buffers:
            raise RuntimeError("lohan: no activation area to reach the SSDs")
        self._sweep()
        handle = _Handle(self, tensor.numel() * tensor.element_size(),
                         tensor.shape, tensor.dtype, tensor.device)
        self._write_pieces(handle, tensor)
        return handle

    def get(self, handle: _Handle,
            pinned: Optional[bool] = None) -> torch.Tensor:
        """The stored tensor, on its original device; the handle is spent
        (its storage goes back at the next sweep), but for one from
        keep_on_ssd, which may be read again. Read from the SSDs, it lands
        in pinned host memory when `pinned` (default: when it goes back to
        a GPU), so the copy up is asynchronous (torch's pinned allocator
        keeps the buffer until that copy is done)."""
        if (handle.version is not None
                and handle.tensor._version != handle.version):
            raise RuntimeError(
                "lohan: a block's input was modified in place after the "
                f"block ran (version {handle.version} -> "
                f"{handle.tensor._version}); backward would recompute the "
                "block from other values. Use an out-of-place op (x = x + y, "
                "not x += y), as torch's autograd requires of tensors it "
                "saved for backward")
        self.stats.gets += 1
        if handle.tensor is not None:
            tensor = handle.tensor
            if tensor.device != handle.device:
                if handle.copied is not None:  # the copy out is done first
                    torch.cuda.current_stream(handle.device).wait_event(
                        handle.copied)
                tensor = tensor.to(handle.device, non_blocking=True)
            return tensor
        self._on_ssd = [ref for ref in self._on_ssd
                        if ref() is not None and ref() is not handle]
        if handle.pending > 0:
            self.drain()  # which of its pieces the daemon took
        if pinned is None:
            pinned = handle.device.type == "cuda"
        out = torch.empty(handle.nbytes, dtype=torch.uint8, pin_memory=pinned)
        if handle.prefetch is not None:
            buffer, ticket = handle.prefetch
            handle.prefetch = None
            try:
                self._remote.wait(ticket)
                _, begin, length = handle.ids[0]
                out[begin:begin + length].copy_(buffer.view[:length])
            finally:
                buffer.reserved = False
            self.stats.prefetched += 1
        else:
            for index, (activation_id, begin, length) in enumerate(
                    handle.ids):
                kept = handle.host_pieces.get(index)
                if kept is not None:
                    out[begin:begin + length].copy_(kept)
                    continue
                buffer = self._buffer()
                self._remote.wait(self._remote.submit_act_get(
                    activation_id, buffer.offset, length))
                out[begin:begin + length].copy_(buffer.view[:length])
        self._prefetch_next()
        return (out.view(handle.dtype).view(handle.shape)
                .to(handle.device, non_blocking=True))

    def _prefetch_next(self) -> None:
        """Starts reading the input backward will want next, if it is one
        piece (larger ones are read when asked for)."""
        while self._on_ssd and self._on_ssd[-1]() is None:
            self._on_ssd.pop()
        if not self._on_ssd:
            return
        candidate = self._on_ssd[-1]()
        if (candidate.prefetch is not None or len(candidate.ids) != 1
                or candidate.pending > 0 or candidate.host_pieces):
            return
        buffer = self._buffer()
        activation_id, _, length = candidate.ids[0]
        buffer.reserved = True
        candidate.prefetch = (buffer, self._remote.submit_act_get(
            activation_id, buffer.offset, length))

    def close(self) -> None:
        """Forgets the store (the daemon drops a session's activations when
        its data plane closes)."""
        self._closed = True
        self._dropped.clear()
        self._on_ssd.clear()
        self._stored.clear()
        self._remote = None
        self._buffers = []


# ------------------------------------------------------------ recompute


def _autocast_state() -> List[Tuple[str, torch.dtype]]:
    state = []
    for device_type in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device_type):
            state.append((device_type, torch.get_autocast_dtype(device_type)))
    return state


# Marks where the Function's tensor outputs go among a block's output
# leaves (a leaf may itself be None).
_TENSOR = object()


class BlockPasses:
    """Tells the gradient router when a block's backward pass is complete.
    A block recomputed here is differentiated once per call (its own
    backward inside the outer one), so one outer backward can reach its
    parameters several times (a model called twice before one backward);
    the block's gradients are complete once every call of it that is
    still to be differentiated has been. `inner(block)` is a context held
    while one call's gradients accumulate; `done(block)` says the block has
    no call left to differentiate. Calls whose graph is dropped without a
    backward stop counting when it goes (then the step hands the layer
    over)."""

    def __init__(self, inner: Callable[[nn.Module], Any],
                 done: Callable[[nn.Module], None]):
        self._inner = inner
        self._done = done
        self._live: Dict[int, int] = {}

    def called(self, block: nn.Module, replay: "_Replay") -> None:
        key = id(block)
        self._live[key] = self._live.get(key, 0) + 1
        replay.finalizer = weakref.finalize(replay, self._forget, key)

    def _forget(self, key: int) -> None:
        self._live[key] -= 1

    def inner(self, block: nn.Module) -> Any:
        return self._inner(block)

    def differentiated(self, block: nn.Module, replay: "_Replay") -> None:
        replay.finalizer.detach()
        key = id(block)
        self._live[key] -= 1
        if self._live[key] == 0:
            self._done(block)


class _Replay:
    """What a block's recompute needs besides its stored inputs."""

    def __init__(self, function: Callable, args_spec: Any,
                 leaves: List[Any], stored: List[int], store: ActivationStore,
                 weights: "_Weights"):
        self.function = function
        self.weights = weights
        self.args_spec = args_spec
        self.leaves = leaves      # non-stored leaves, None where stored
        self.stored = stored      # leaf positions of stored tensors
        self.store = store
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng: List[Tuple[int, torch.Tensor]] = []
        self.autocast = _autocast_state()
        self.output_spec: Any = None
        self.output_leaves: List[Any] = []  # _TENSOR where a tensor goes
        self.handles: List[_Handle] = []
        self.block: Optional[nn.Module] = None
        self.passes: Optional[BlockPasses] = None
        self.finalizer: Any = None
        self.differentiated = False
        self.observer: Any = None  # a profile.Profiler in its iteration

    def capture_cuda_rng(self, devices: Sequence[int]) -> None:
        self.cuda_rng = [(d, torch.cuda.get_rng_state(d)) for d in devices]

    def call(self, inputs: Sequence[torch.Tensor]) -> Any:
        leaves = list(self.leaves)
        for position, tensor in zip(self.stored, inputs):
            leaves[position] = tensor
        args, kwargs = pytree.tree_unflatten(leaves, self.args_spec)
        return self.function(*args, **kwargs)


class _OffloadedBlock(torch.autograd.Function):
    @staticmethod
    def forward(ctx, replay: _Replay, anchor: torch.Tensor,
                *inputs: torch.Tensor):
        del anchor  # makes the outputs require grad even if no input does
        observer = replay.observer
        with torch.no_grad(), replay.weights, (
                observer.forward(replay.block, inputs) if observer
                else contextlib.nullcontext()):
            output = replay.call(inputs)
        flat, replay.output_spec = pytree.tree_flatten(output)
        ctx.replay = replay
        ctx.needs_grad = [t.requires_grad for t in inputs]
        replay.handles = [replay.store.put(t) for t in inputs]
        tensors = tuple(t for t in flat if isinstance(t, torch.Tensor))
        ctx.mark_non_differentiable(
            *[t for t in tensors if not t.is_floating_point()])
        replay.output_leaves = [_TENSOR if isinstance(t, torch.Tensor)
                                else t for t in flat]
        return tensors

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        replay: _Replay = ctx.replay
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(
                "lohan: activations='offload' recomputes each block inside "
                "loss.backward() and accumulates its parameters' gradients "
                "there; torch.autograd.grad() or backward(inputs=...) "
                "through a block is not supported with it. Use "
                "activations='recompute' or 'keep' for that")
        if replay.differentiated:
            raise RuntimeError(
                "lohan: a block's backward ran a second time over the same "
                "forward (backward(retain_graph=True) twice): "
                "activations='offload' stores each block input for one "
                "backward. Run the forward again, or use "
                "activations='recompute' or 'keep'")
        replay.differentiated = True
        with (replay.observer.backward(replay.block) if replay.observer
              else contextlib.nullcontext()):
            return _OffloadedBlock._differentiate(replay, ctx.needs_grad,
                                                  grads)

    @staticmethod
    def _differentiate(replay: _Replay, needs_grad: List[bool],
                       grads: Sequence[torch.Tensor]) -> tuple:
        inputs = []
        for handle, needs in zip(replay.handles, needs_grad):
            tensor = replay.store.get(handle).detach()
            inputs.append(tensor.requires_grad_(needs))
        replay.handles = []
        devices = [d for d, _ in replay.cuda_rng]
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(
                devices=devices, enabled=True,
                device_type="cuda" if devices else "cpu"))
            torch.set_rng_state(replay.cpu_rng)
            for device, state in replay.cuda_rng:
                torch.cuda.set_rng_state(state, device)
            for device_type, dtype in replay.autocast:
                stack.enter_context(torch.autocast(device_type, dtype=dtype))
            stack.enter_context(torch.enable_grad())
            # The weights stay until the block's backward is done (and its
            # gradients handed over).
            stack.enter_context(replay.weights)
            with (replay.observer.recompute(replay.block) if replay.observer
                  else contextlib.nullcontext()):
                output = replay.call(inputs)
            flat = [t for t in pytree.tree_flatten(output)[0]
                    if isinstance(t, torch.Tensor)]
            outputs, output_grads = [], []
            for tensor, grad in zip(flat, grads):
                if tensor.requires_grad and grad is not None:
                    outputs.append(tensor)
                    output_grads.append(grad)
            if outputs:
                if replay.passes is not None:
                    stack.enter_context(replay.passes.inner(replay.block))
                torch.autograd.backward(outputs, output_grads)
        if replay.passes is not None:
            replay.passes.differentiated(replay.block, replay)
        return (None, None, *[t.grad if needs else None
                              for t, needs in zip(inputs, needs_grad)])


# Keyword arguments through which Hugging Face blocks get a key/value cache.
_CACHE_KEYWORDS = ("past_key_value", "past_key_values", "layer_past", "cache")


def _is_cache(value: Any) -> bool:
    """A Hugging Face Cache object (by class name: no import needed)."""
    return any(c.__name__ == "Cache" for c in type(value).__mro__)


def _without_caches(args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """The call without its key/value cache, as Hugging Face does under
    gradient checkpointing: a block recomputed in backward would extend the
    cache a second time (and see a longer one). Training needs none."""
    if any(_is_cache(a) for a in args):
        args = tuple(None if _is_cache(a) else a for a in args)
    if any(k in kwargs for k in _CACHE_KEYWORDS + ("use_cache",)):
        kwargs = dict(kwargs)
        for key in _CACHE_KEYWORDS:
            if key in kwargs:
                kwargs[key] = None
        if "use_cache" in kwargs:
            kwargs["use_cache"] = False
    return args, kwargs


class _Weights:
    """`with weights:` holds a block's parameters materialized (see
    params.py); a no-op without parameter offload."""

    def __init__(self, block: nn.Module, residency: Any):
        self._block = block
        self._residency = residency

    def __enter__(self) -> None:
        if self._residency is not None:
            self._residency.materialize(self._block)

    def __exit__(self, *exc: Any) -> None:
        if self._residency is not None:
            self._residency.release(self._block)


def _offloaded_forward(original: Callable, store: ActivationStore,
                       anchor: torch.Tensor, warned: List[bool],
                       weights: _Weights, block: nn.Module,
                       passes: Optional[BlockPasses],
                       observer: Callable[[], Any]):
    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            with weights:
                return original(*args, **kwargs)
        args, kwargs = _without_caches(args, kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        positional = len(pytree.tree_flatten(args)[0])
        stored = [i for i, leaf in enumerate(leaves[:positional])
                  if isinstance(leaf, torch.Tensor)
                  and leaf.is_floating_point()]
        # A keyword tensor that needs a gradient would be cut off from it:
        # such a call falls back to torch's checkpoint (inputs kept).
        if any(isinstance(leaf, torch.Tensor) and leaf.requires_grad
               for leaf in leaves[positional:]):
            if not warned[0]:
                warned[0] = True
                warnings.warn("lohan: a block gets a keyword tensor that "
                              "needs a gradient; its inputs are kept in "
                              "place (recompute without offload)",
                              stacklevel=2)
            # Offloaded weights stay until step() releases them: the
            # checkpoint's recompute runs outside this wrapper.
            weights.__enter__()
            return checkpoint(original, *args, use_reentrant=False, **kwargs)
        inputs = [leaves[i] for i in stored]
        kept = [None if i in set(stored) else leaf
                for i, leaf in enumerate(leaves)]
        replay = _Replay(original, spec, kept, stored, store, weights)
        # Every GPU a tensor of the call is on (keyword ones too: a block
        # given its hidden states by keyword still draws dropout masks on
        # their device), else the current one if CUDA is in use: the
        # recompute must replay the same RNG.
        devices = sorted({
            leaf.device.index if leaf.device.index is not None
            else torch.cuda.current_device()
            for leaf in leaves
            if isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda"})
        if not devices and torch.cuda.is_initialized():
            devices = [torch.cuda.current_device()]
        if devices:
            replay.capture_cuda_rng(devices)
        replay.block = block
        replay.observer = observer()
        if passes is not None:
            replay.passes = passes
            passes.called(block, replay)
        tensors = _OffloadedBlock.apply(replay, anchor, *inputs)
        tensors = iter(tensors)
        flat = [next(tensors) if leaf is _TENSOR else leaf
                for leaf in replay.output_leaves]
        return pytree.tree_unflatten(flat, replay.output_spec)

    return forward


def _swapped_forward(original: Callable, store: ActivationStore,
                     block: nn.Module):
    """The block's forward with every tensor autograd saves in it (but its
    parameters and small ones) in `store` until backward needs it."""

    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        args, kwargs = _without_caches(args, kwargs)
        weights = {p.untyped_storage().data_ptr() for p in block.parameters()}

        def pack(tensor: torch.Tensor) -> Any:
            if (tensor.numel() * tensor.element_size() < _MIN_SWAP_BYTES
                    or tensor.untyped_storage().data_ptr() in weights):
                return tensor
            return Stored(store, store.put(tensor))

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return original(*args, **kwargs)

    return forward


def block_modes(policy: Any, blocks: int) -> List[Any]:
    """Each block's mode for `policy` (a policy name, or a plan: one mode
    per block, a name of BLOCK_MODES or a per-tensor list of DECISIONS);
    ValueError saying what is wrong."""
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(f"activations={policy!r} is not supported; use "
                             f"one of {', '.join(POLICIES)}, or a plan (one "
                             f"of {', '.join(BLOCK_MODES)} per block)")
        return [policy] * blocks
    modes = list(policy)
    if len(modes) != blocks:
        raise ValueError(f"activations: a plan has one mode per block; the "
                         f"model has {blocks} blocks, the plan {len(modes)}")
    for index, mode in enumerate(modes):
        if isinstance(mode, str):
            if mode not in BLOCK_MODES:
                raise ValueError(
                    f"activations: block {index}'s mode {mode!r} is not one "
                    f"of {', '.join(BLOCK_MODES)} (or a list of per-tensor "
                    f"decisions: {', '.join(DECISIONS)})")
            continue
        decisions = list(mode)
        unknown = [d for d in decisions if d not in DECISIONS]
        if unknown:
            raise ValueError(f"activations: block {index}'s decision "
                             f"{unknown[0]!r} is not one of "
                             f"{', '.join(DECISIONS)}")
        modes[index] = decisions
    return modes


def uses_store(policy: Any) -> bool:
    """Whether `policy` hands tensors to an ActivationStore."""
    if isinstance(policy, str):
        return policy == "offload"
    return any(not isinstance(mode, str) or mode in ("offload", "swap")
               for mode in policy)


class _PolicyForward:
    """The forward a policy sets on a block instance. A copy of the block
    (copy.deepcopy: an EMA or teacher model) or a pickled one
    (torch.save(model)) gets the block's own forward instead: the policy,
    its stores and its weights belong to this engine and this block."""

    def __init__(self, block: nn.Module, function: Callable):
        self._block = block
        self._function = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._function(*args, **kwargs)

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        twin = memo.get(id(self._block))
        return self if twin is None else _own_forward(twin)

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_own_forward, (self._block,))


def _own_forward(block: nn.Module) -> Callable:
    """The block's class forward, bound to it."""
    return type(block).forward.__get__(block)


def install(model: nn.Module, blocks: Sequence[nn.Module], policy: Any,
            store: Optional[ActivationStore] = None,
            residency: Any = None,
            passes: Optional[BlockPasses] = None,
            observer: Callable[[], Any] = lambda: None,
            unit: str = "block") -> Callable[[], None]:
    """Applies `policy` (a name, or a plan: one of BLOCK_MODES per block)
    to every block (`store` for "offload" and "swap"; with `residency`, a
    params.ParameterResidency, the blocks' weights are materialized around
    each run; `observer()`, the profile.Profiler of a profiling iteration
    or None, watches each "offload" block; `unit` "sublayer": a recomputed
    block's backward one sublayer at a time, sublayers.py); returns the
    function that undoes it."""
    modes = block_modes(policy, len(blocks))
    if all(mode == "keep" for mode in modes):
        return lambda: None
    if uses_store(modes) and store is None:
        raise ValueError("the offload policy needs an ActivationStore")
    if residency is not None and any(mode != "offload" for mode in modes):
        raise ValueError(f"params='offload' needs activations='offload' "
                         f"(with {policy!r} autograd would keep the "
                         "offloaded weights it saved for backward)")
    # A key/value cache built during forward would be extended a second time
    # when backward recomputes the block; training does not use it.
    config = getattr(model, "config", None)
    restore_cache = None
    if config is not None and getattr(config, "use_cache", False):
        restore_cache = config.use_cache
        config.use_cache = False
    anchor = torch.empty(0, requires_grad=True)
    warned = [False]
    originals: List[tuple] = []
    for block, mode in zip(blocks, modes):
        if mode == "keep":
            continue
        original = block.forward
        # A forward set on the instance before (someone else's wrapper)
        # goes back; else the class's shows through again.
        originals.append((block, block.__dict__.get("forward")))
        if unit == "sublayer" and mode in ("offload", "recompute"):
            original = one_at_a_time(original, block)
        if not isinstance(mode, str):  # per saved tensor
            block.forward = _PolicyForward(block, planned_forward(
                original, store, block, mode, _MIN_SWAP_BYTES,
                _without_caches))
            continue
        if mode == "swap":
            block.forward = _PolicyForward(
                block, _swapped_forward(original, store, block))
            continue
        if mode == "offload":
            block.forward = _PolicyForward(block, _offloaded_forward(
                original, store, anchor, warned, _Weights(block, residency),
                block, passes, observer))
            continue

        def forward(*args, _original=original, **kwargs):
            if not torch.is_grad_enabled():
                return _original(*args, **kwargs)
            args, kwargs = _without_caches(args, kwargs)
            return checkpoint(_original, *args, use_reentrant=False, **kwargs)

        block.forward = _PolicyForward(block, forward)

    def uninstall() -> None:
        for block, own in originals:
            if own is not None:
                block.forward = own
            elif isinstance(block.__dict__.get("forward"), _PolicyForward):
                del block.forward
        if restore_cache is not None:
            config.use_cache = restore_cache

    return uninstall
