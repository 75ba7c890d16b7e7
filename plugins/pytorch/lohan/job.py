"""An engine's job on lohand: created (or resumed) with an arena the
daemon's host pool can hold, attached, its data plane open and the model
registered on it; and, at close, detached with the arena given back."""

from __future__ import annotations

import time
import warnings
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from lohan.blocks import Layer, WIRE_NAMES
from lohan.client import (Client, DataPlane, Job, LohanError, Model,
                          StatusCode)
from lohan.groups import ParamGroup, Range
from lohan.options import MIB, EngineOptions

# How long close() and a reopen wait for the daemon to take back an arena
# (it does so as soon as it sees the data-plane connection close).
ARENA_RETURN_SECONDS = 30.0
SLOT_ALIGNMENT = 4096  # the daemon's slot allocator rounds every slot up

# The number of shared buffers per kind for an arena of a given size (0:
# one per layer).
SlotsForArena = Callable[[int], int]


def round_up(value: int, unit: int) -> int:
    return (value + unit - 1) // unit * unit


def host_pool_bytes(layer_elements: List[int], element_bytes: int,
                    activation_bytes: int = 0, stream_buffers: int = 0) -> int:
    """Arena size for a model: per layer a gradient and a weight slot (or,
    streamed, `stream_buffers` of each as large as the largest layer), the
    fp32 staging slot of the largest layer, the activation area, and 1 MiB
    for the rings, the error texts and the layout table; rounded up to
    whole MiB."""
    if 0 < stream_buffers < len(layer_elements):
        slots = 2 * stream_buffers * round_up(
            max(layer_elements) * element_bytes, SLOT_ALIGNMENT)
    else:
        slots = sum(2 * round_up(n * element_bytes, SLOT_ALIGNMENT)
                    for n in layer_elements)
    staging = round_up(max(layer_elements) * 4, SLOT_ALIGNMENT)
    activations = round_up(activation_bytes, SLOT_ALIGNMENT)
    return round_up(slots + staging + activations + MIB, MIB)



def measure_sync_copy(host: torch.Tensor, device: torch.device) -> float:
    """Bytes per second of a synchronous copy of `host` (the arena, which
    CUDA sees as pageable memory when it cannot be pinned) to `device` and
    back, the best of three: what each step pays when gradients and
    weights cannot move asynchronously."""
    on_device = torch.empty_like(host, device=device)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        on_device.copy_(host)
        host.copy_(on_device)
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * host.numel() * host.element_size() / best


def sync_fallback_message(reason: str, step_bytes: int,
                          rate: float) -> str:
    """The warning for a GPU model whose copies fall back to synchronous
    tensor copies: why, and what it costs a step (`step_bytes`, gradients
    out and weights in, at `rate` bytes per second)."""
    seconds = step_bytes / rate if rate > 0 else float("inf")
    return (f"lohan: the model is on a GPU but liblohan_client cannot use "
            f"CUDA ({reason}); gradients and weights move by synchronous "
            f"tensor copies: about {seconds:.3g} s a step "
            f"({step_bytes / MIB:.0f} MiB at {rate / 1e9:.2f} GB/s, "
            "measured now) that would otherwise overlap compute")

class JobSession:
    """The job, its data plane and the registered model, with the arena's
    gradient and weight buffers (per layer, in the training dtype) and
    its fp32 staging slot as tensors. Each part is None until opened;
    close() takes down whatever was opened."""

    def __init__(self, socket: Optional[str], job_name: str) -> None:
        self.job_name = job_name
        self.client: Optional[Client] = None
        self.job: Optional[Job] = None
        self.plane: Optional[DataPlane] = None
        self.remote: Optional[Model] = None
        # A job this session created: deleted if the engine fails to start.
        self.delete_on_failure = False
        self.slots = 0  # shared buffers per kind; 0: one per layer
        self.cuda = False  # gradients leave the GPU through the C library
        self.grad_views: List[torch.Tensor] = []
        self.weight_views: List[torch.Tensor] = []
        self.staging: Optional[torch.Tensor] = None
        self.client = Client(socket)

    @property
    def buffers(self) -> str:
        """"resident" or "streamed": how the arena holds gradients and
        16-bit weights."""
        return "streamed" if self.slots else "resident"

    def open(self, resume: bool, buffers: str, stream_buffers: int,
             elements: List[int], element_bytes: int,
             area_bytes: int) -> None:
        """Opens (resume=True: finds) the job, attaches it and maps its
        arena; see open_job_with_buffers for `buffers`."""
        self.job, slots_for_arena = self._open_job_with_buffers(
            resume, buffers, stream_buffers, elements, element_bytes,
            area_bytes)
        self.client.attach_job(self.job.id)
        self.plane = self._open_data_plane()
        self.slots = slots_for_arena(self.plane.size)

    def register(self, options: EngineOptions, layers: List[Layer],
                 dtype: torch.dtype, area_bytes: int, exempt: List[Range],
                 groups: Sequence[ParamGroup],
                 initial_iteration: int) -> Model:
        """Registers the model's layers with the job's optimizer settings
        and maps its buffers."""
        self.remote = self.plane.register_model(
            self.job.id, layer_elements=[layer.numel for layer in layers],
            dtype=WIRE_NAMES[dtype], lr=options.lr, betas=options.betas,
            eps=options.eps, weight_decay=options.weight_decay,
            adamw=options.adamw, amsgrad=options.amsgrad,
            bf16_moments=bool(options.bf16_moments),
            no_weight_decay=exempt,
            param_groups=[(g.lr_scale, g.weight_decay, g.ranges)
                          for g in groups],
            max_grad_norm=options.max_grad_norm,
            clip_schedule=options.clip_schedule,
            skip_nonfinite=options.skip_nonfinite,
            chunk_elements=options.chunk_elements,
            activation_bytes=area_bytes, grad_slots=self.slots,
            weight_slots=self.slots,
            # Every layer is fetched before its weights are used (see
            # weights.Weights.copy_fetched_into_params and
            # ParameterResidency), so step() returns before the last
            # updates are done and they run during the next forward.
            overlap_updates=True,
            in_order_service=options.service == "in-order",
            initial_iteration=initial_iteration)
        remote = self.remote
        self.grad_views = [
            torch.frombuffer(remote.grad_buffer(l.index), dtype=dtype)[
                :l.numel] for l in layers]
        self.weight_views = [
            torch.frombuffer(remote.weight_buffer(l.index), dtype=dtype)[
                :l.numel] for l in layers]
        self.staging = torch.frombuffer(remote.staging, dtype=torch.float32)
        return remote

    def setup_cuda(self, device: torch.device) -> bool:
        """For a model on a GPU: pins the arena for DMA and lets the C
        library copy gradients out on torch's stream. False (plain tensor
        copies, synchronous) for a CPU model, or when the library cannot
        use CUDA here (the reason is warned once). Sets `cuda`."""
        if device.type != "cuda":
            return False
        available, reason = self.remote.cuda_available()
        if not available:
            step_bytes = 2 * sum(view.numel() * view.element_size()
                                 for view in self.grad_views)
            largest = max(self.grad_views, key=lambda view: view.numel())
            rate = measure_sync_copy(largest, device)
            warnings.warn(sync_fallback_message(reason, step_bytes, rate),
                          stacklevel=4)
            return False
        # On the model's device, whatever torch's current device is (a job
        # on cuda:N without torch.cuda.set_device must put nothing on GPU 0):
        # the C library switches to it for the call and back.
        self.plane.cuda_register(device=device.index)
        self.cuda = True
        return True

    def close(self, delete_job: bool) -> None:
        """Unmaps the arena (the views into it go first), waits until the
        daemon has taken it back, detaches the job (deleting it with
        `delete_job`, or if the engine did not start) and disconnects."""
        self.grad_views = []
        self.weight_views = []
        self.staging = None
        self.remote = None
        if self.plane is not None:
            self.plane.close()
            self.plane = None
            if self.client is not None and self.job is not None:
                self._wait_for_arena_return()
        if self.client is not None:
            if self.job is not None:
                try:
                    self.client.detach_job(self.job.id)
                    if self.delete_on_failure or delete_job:
                        self.client.delete_job(self.job.id)
                except LohanError:
                    pass  # not attached, or the daemon is gone
            self.client.close()
            self.client = None

    def _open_job_with_buffers(
            self, resume: bool, buffers: str, stream_buffers: int,
            elements: List[int], element_bytes: int,
            area_bytes: int) -> Tuple[Job, SlotsForArena]:
        """The job, and a function of the arena's size giving the number
        of shared buffers per kind (0: one per layer). "auto" asks for one
        gradient and one weight buffer per layer and, if the daemon's host
        pool cannot hold that, streams the gradients and 16-bit weights
        through `stream_buffers` shared ones (the daemon spills them to its
        SSDs). A resumed job keeps the arena it was created with: resident
        if that holds the model, else streamed."""
        layers = len(elements)
        streamed = min(stream_buffers, layers - 1) if layers > 1 else 0
        resident_bytes = host_pool_bytes(elements, element_bytes, area_bytes)
        streamed_bytes = host_pool_bytes(elements, element_bytes, area_bytes,
                                         streamed)
        if resume:
            def by_arena(arena: int) -> int:
                if buffers == "resident" or (buffers == "auto"
                                             and arena >= resident_bytes):
                    return 0
                return streamed
            return self._open_job(True, 0), by_arena
        if buffers == "streamed" and streamed:
            return (self._open_job(False, streamed_bytes),
                    lambda arena: streamed)
        if buffers == "resident" or not streamed:
            return (self._open_job(False, resident_bytes),
                    lambda arena: 0)
        try:
            return (self._open_job(False, resident_bytes),
                    lambda arena: 0)
        except LohanError as error:
            if error.code != StatusCode.RESOURCE_EXHAUSTED:
                raise
            refusal = error
        return self._open_streamed(refusal, streamed, elements,
                                   element_bytes, area_bytes)

    def _open_streamed(self, refusal: LohanError, streamed: int,
                       elements: List[int], element_bytes: int,
                       area_bytes: int) -> Tuple[Job, SlotsForArena]:
        """After the pool refused a buffer per layer (`refusal`): the job
        with the most shared buffers (up to `streamed`) the pool holds."""
        resident_bytes = host_pool_bytes(elements, element_bytes, area_bytes)
        for count in range(streamed, 0, -1):
            need = host_pool_bytes(elements, element_bytes, area_bytes, count)
            try:
                job = self._open_job(False, need)
            except LohanError as error:
                if error.code != StatusCode.RESOURCE_EXHAUSTED:
                    raise
                refusal = error
                continue
            warnings.warn(
                f"lohan: the daemon's host pool cannot hold one gradient and "
                f"one weight buffer per layer ({resident_bytes >> 20} MiB); "
                f"streaming them through {count} shared buffers of each "
                f"({need >> 20} MiB) and its SSDs instead",
                stacklevel=7)
            return job, (lambda arena, count=count: count)
        smallest = host_pool_bytes(elements, element_bytes, area_bytes, 1)
        raise LohanError(
            StatusCode.RESOURCE_EXHAUSTED,
            f"{refusal.message}. This model needs {resident_bytes >> 20} MiB "
            f"of the daemon's host pool with a buffer per layer, and at least "
            f"{smallest >> 20} MiB streaming through one shared buffer of "
            f"each: start lohand with a larger pool (--host-pool-size, "
            f"[pool] host_pool_size)" +
            (f", or lower activation_buffer_bytes (the activation area is "
             f"{area_bytes >> 20} MiB of it)" if area_bytes else "")) from None

    def _open_job(self, resume: bool, pool_bytes: int) -> Job:
        client = self.client
        mine = [job for job in client.jobs() if job.name == self.job_name
                and job.owner_uid == client.caller_uid]
        if resume:
            if not mine:
                raise LohanError(
                    StatusCode.NOT_FOUND,
                    f"resume=True but you have no job named "
                    f"{self.job_name!r} on this daemon; start it without "
                    "resume=True first (lohanctl jobs lists your jobs)")
            return mine[0]
        try:
            job = client.create_job(self.job_name, host_pool_bytes=pool_bytes)
            self.delete_on_failure = True
            return job
        except LohanError as error:
            if error.code == StatusCode.ALREADY_EXISTS:
                raise LohanError(
                    error.code,
                    f"{error.message} (a job named {self.job_name!r} exists: "
                    "pass resume=True to continue it, or another job_name)"
                ) from None
            raise

    def _open_data_plane(self) -> DataPlane:
        # The daemon frees a job's arena when it sees the previous data
        # plane's connection close; a quick reopen can race it.
        deadline = time.monotonic() + ARENA_RETURN_SECONDS
        while True:
            try:
                return self.client.open_data_plane(self.job.id)
            except LohanError as error:
                if (error.code != StatusCode.ALREADY_EXISTS
                        or time.monotonic() > deadline):
                    raise
            time.sleep(0.01)

    def _wait_for_arena_return(self) -> None:
        """So that the job can be reopened as soon as close() returns."""
        deadline = time.monotonic() + ARENA_RETURN_SECONDS
        try:
            while time.monotonic() < deadline:
                arenas = self.client.status().get("pool", {}).get(
                    "arenas", [])
                if all(a.get("job_id") != self.job.id for a in arenas):
                    return
                time.sleep(0.01)
        except LohanError:
            pass  # the daemon is gone: nothing to wait for
