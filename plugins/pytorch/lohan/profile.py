"""The client's half of the machine profile, measured in the first
iteration of `activations="auto"` (the paper's profiling iteration: every
block recomputed, its input offloaded): the device's compute rate on the
blocks' forward, the host-device link each way (on a machine without a GPU
the device is the CPU and the copy a memcpy: the same code, measured), each
block's forward and backward time, and, for every tensor autograd saves
inside a block, its bytes and the FLOPs to make it again from the others
(recompute.py). `ClientProfile.message()` is PlanJobRequest.profile
(proto/lohan.proto) as protobuf JSON.

One block (the first recomputed in backward: the last) is recorded
operator by operator; the others are only timed, so the recording's own
cost stays out of the times. Every block is taken to save what that one
saves (a model's blocks alike).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils._python_dispatch import (TorchDispatchMode,
                                          _get_current_dispatch_mode,
                                          _pop_mode_temporarily)

from lohan.planned import StorageOrder, is_candidate
from lohan.recompute import Recording, _flops, recompute_flops

# Bytes copied to time the host-device link (each way, best of a few).
_LINK_PROBE_BYTES = 64 << 20
_LINK_PROBE_ROUNDS = 3


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_link(device: torch.device,
                 nbytes: int = _LINK_PROBE_BYTES) -> Dict[str, float]:
    """Bytes per second host to device and device to host: pinned host
    memory and the device on a GPU, two host buffers on the CPU."""
    cuda = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    host.fill_(1)
    other = torch.empty(nbytes, dtype=torch.uint8, device=device)
    rates = {}
    for name, (dst, src) in (("h2d", (other, host)), ("d2h", (host, other))):
        best = float("inf")
        for _ in range(_LINK_PROBE_ROUNDS):
            _synchronize(device)
            start = time.perf_counter()
            dst.copy_(src, non_blocking=cuda)
            _synchronize(device)
            best = min(best, time.perf_counter() - start)
        rates[name] = nbytes / max(best, 1e-9)
    return rates


def host_available_bytes() -> int:
    """MemAvailable of /proc/meminfo (0 if unknown)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def device_bytes(device: torch.device) -> int:
    """Memory the job may use on the device: what is free there plus what
    torch holds for it already (its weights and caches count as the
    job's); the host's available memory for the CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device))
    return host_available_bytes()


class _OpCounter(TorchDispatchMode):
    """FLOPs of the operators outside the blocks (the head's products)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0.0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.flops += _flops(func, args, kwargs, out)
        return out


@dataclass
class SavedTensor:
    name: str
    bytes: int
    recompute_flops: float
    always_offloaded: bool


@dataclass
class BlockTimes:
    forward: List[float] = field(default_factory=list)
    backward: List[float] = field(default_factory=list)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class Profiler:
    """Hooks of the profiling iteration. The activation policy calls
    `forward(block)` around each block's forward (no gradients),
    `recompute(block)` around its recompute in backward and
    `backward(block)` around the whole of its backward; the engine calls
    `model_forward()` around the model's forward and `finish()` after the
    step."""

    def __init__(self, device: torch.device, min_bytes: Any):
        self._device = device
        self._min_bytes = min_bytes  # a function: read at use (tests set it)
        self.times = BlockTimes()
        self.block_flops = 0.0
        self.tensors: List[SavedTensor] = []
        self.recorded: Optional[nn.Module] = None
        self.tokens_shape: Optional[torch.Size] = None
        self.outside_flops = 0.0
        self.outside_saved_bytes = 0
        self._started: Optional[float] = None
        self.iteration_seconds = 0.0

    def started(self) -> None:
        """The profiling iteration's first forward begins."""
        if self._started is None:
            self._started = time.perf_counter()

    @contextlib.contextmanager
    def model_forward(self, model: nn.Module) -> Iterator[None]:
        """Counts the FLOPs and saved bytes outside the blocks (of one
        forward: the largest, with gradient accumulation)."""
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        saved = [0]

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.untyped_storage().data_ptr() not in weights:
                saved[0] += tensor.numel() * tensor.element_size()
            return tensor

        counter = _OpCounter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with counter:
                yield
        self.outside_flops = max(self.outside_flops, counter.flops)
        self.outside_saved_bytes = max(self.outside_saved_bytes, saved[0])

    @contextlib.contextmanager
    def _timed(self, into: List[float]) -> Iterator[None]:
        _synchronize(self._device)
        start = time.perf_counter()
        yield
        _synchronize(self._device)
        into.append(time.perf_counter() - start)

    @contextlib.contextmanager
    def forward(self, block: nn.Module,
                inputs: Sequence[torch.Tensor]) -> Iterator[None]:
        if self.tokens_shape is None and inputs:
            self.tokens_shape = inputs[0].shape
        # The outside counter is not the blocks' (their FLOPs come from the
        # recorded one; counting them would slow the timed forward).
        top = _get_current_dispatch_mode()
        with contextlib.ExitStack() as stack:
            if isinstance(top, _OpCounter):
                stack.enter_context(_pop_mode_temporarily())
            stack.enter_context(self._timed(self.times.forward))
            yield

    @contextlib.contextmanager
    def backward(self, block: nn.Module) -> Iterator[None]:
        recorded_now = self.recorded is None
        times: List[float] = []
        with self._timed(times):
            yield
        if not recorded_now:
            self.times.backward.extend(times)

    @contextlib.contextmanager
    def recompute(self, block: nn.Module) -> Iterator[None]:
        """Records the first block recomputed: what it saves and what that
        costs to make again."""
        if self.recorded is not None:
            yield
            return
        self.recorded = block
        weights = {p.untyped_storage().data_ptr() for p in block.parameters()}
        recording = Recording(list(block.parameters())
                              + list(block.buffers()))
        order = StorageOrder()
        # Per storage (StorageOrder's index): its bytes and its tensors.
        saved: List[Tuple[int, List[Any]]] = []

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            with recording.paused():
                value = recording.value_of(tensor)
                value.saved = lambda: tensor
                if is_candidate(tensor, weights, self._min_bytes()):
                    index, first = order.index(tensor)
                    if first:
                        saved.append((tensor.untyped_storage().nbytes(), []))
                    saved[index][1].append(value)
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with recording:
                yield
        order.clear()
        self.block_flops = recording.flops
        for nbytes, values in saved:
            flops = (None if recording.failed is not None
                     else recompute_flops(values))
            self.tensors.append(SavedTensor(values[0].name, nbytes,
                                            flops or 0.0, flops is None))

    def finish(self) -> None:
        if self._started is not None:
            self.iteration_seconds = time.perf_counter() - self._started


@dataclass
class ModelSizes:
    """The model as lohan streams it (parameters per part)."""
    blocks: int
    parameters: int
    block_parameters: int
    largest_layer_parameters: int
    head_parameters: int
    first_layer_parameters: int


def profile_message(profiler: Profiler, sizes: ModelSizes,
                    device: torch.device) -> Dict[str, Any]:
    """ClientProfile (proto/lohan.proto) as protobuf JSON."""
    link = measure_link(device)
    forward_seconds = _mean(profiler.times.forward)
    shape = profiler.tokens_shape
    batch, seq = ((int(shape[0]), int(shape[1])) if shape is not None
                  and len(shape) >= 3 else (1, 1))
    block_flops = profiler.block_flops
    return {
        "deviceBytes": str(device_bytes(device)),
        "deviceFlops": (block_flops / forward_seconds
                        if forward_seconds > 0 else 0.0),
        "hostToDeviceBytesPerSecond": link["h2d"],
        "deviceToHostBytesPerSecond": link["d2h"],
        "deviceIsHost": device.type == "cpu",
        "blocks": sizes.blocks,
        "parameters": str(sizes.parameters),
        "blockParameters": str(sizes.block_parameters),
        "largestLayerParameters": str(sizes.largest_layer_parameters),
        "headParameters": str(sizes.head_parameters),
        "firstLayerParameters": str(sizes.first_layer_parameters),
        "forwardFlops": profiler.outside_flops + sizes.blocks * block_flops,
        "blockForwardFlops": block_flops,
        "outsideSavedBytes": str(profiler.outside_saved_bytes),
        "blockTensors": [
            {"name": t.name, "bytes": str(t.bytes),
             "recomputeFlops": t.recompute_flops,
             "alwaysOffloaded": t.always_offloaded}
            for t in profiler.tensors],
        "blockForwardSeconds": forward_seconds,
        "blockBackwardSeconds": _mean(profiler.times.backward),
        "iterationSeconds": profiler.iteration_seconds,
        "batch": str(batch),
        "seq": str(seq),
    }
