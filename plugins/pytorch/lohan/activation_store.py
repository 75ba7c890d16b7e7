"""Where activations wait between forward and backward: `ActivationStore`
holds block inputs (and a swapped block's saved tensors) in host memory up
to a budget and beyond it on the daemon's SSDs through the job's arena
(ACT_PUT / ACT_GET / ACT_FREE, in pieces through two page-aligned
buffers), reading the next one backward needs ahead; `ActivationStats`
counts what it did. activations.py applies the policies over it."""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from lohan.client import LohanError, StatusCode
from lohan.devices import copy_stream

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
        self._next_buffer = 0
        self.rebind(area)
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

    def rebind(self, area: Optional[torch.Tensor]) -> None:
        """The arena's activation area (None: none, everything stays in
        host memory), split in its two buffers."""
        self._buffers = []
        self._next_buffer = 0
        if area is not None:
            half = area.numel() // 2 // 4096 * 4096
            if half == 0:
                raise ValueError("the activation area needs two pages")
            self._buffers = [_Buffer(0, area[:half]),
                             _Buffer(half, area[half:2 * half])]

    def release_area(self) -> None:
        """Before the data plane moves (share_move.py): every request
        through the area answered, the spent tensors given back, and the
        area let go (rebind gives the new arena's). A put's error
        surfaces here."""
        self.drain()
        self._sweep()
        self.rebind(None)

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
