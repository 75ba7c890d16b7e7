"""An engine's job on lohand: created (or resumed) with an arena the
daemon's host pool can hold, attached, its data plane open and the model
registered on it; and, at close, detached with the arena given back."""

from __future__ import annotations

import time
import warnings
from typing import Any, Dict, List, Mapping, Optional

import torch

from lohan.blocks import Layer, WIRE_NAMES
from lohan.client import (ArenaSizing, Client, DataPlane, DistributedRun,
                          Job, LohanError, Model, StatusCode, cut_model)
from lohan.model_spec import DTYPES
from lohan.options import MIB, EngineOptions
from lohan.sharding import Sharding
from lohan.spec_settings import settings_spec


def model_spec(options: EngineOptions, description: Mapping[str, Any],
               layers: int, dtype: torch.dtype, area_bytes: int,
               initial_iteration: int,
               sharding: Optional[Sharding] = None) -> Dict[str, Any]:
    """The engine's model as the daemon takes it (a ModelSpec as protobuf
    JSON's object, made by liblohan_client's cut of `description` into
    `layers` layers: their groups' element ranges), its buffers as
    `options.buffers` says: "resident" one gradient and one weight buffer
    per layer; "streamed" `options.stream_buffers` shared ones (fewer than
    the layers) through the daemon's SSDs; "auto" resident if the arena
    holds it, else the most shared ones up to stream_buffers that it
    holds (the daemon sizes a new job's arena so). With `sharding`
    (data-parallel ranks) the job's layers are this rank's shards."""
    streamed = min(options.stream_buffers, layers - 1) if layers > 1 else 0
    slots = 0 if options.buffers == "resident" else streamed
    spec = {
        **settings_spec(options),
        "dtype": DTYPES[WIRE_NAMES[dtype]],
        "activation_bytes": area_bytes, "grad_slots": slots,
        "weight_slots": slots,
        "arena_fit": ("ARENA_FIT_MOST" if options.buffers == "auto"
                      and slots > 0 else "ARENA_FIT_AS_GIVEN"),
        # Every layer is fetched before its weights are used (see
        # weights.Weights.copy_fetched_into_params and
        # ParameterResidency), so step() returns before the last updates
        # are done and they run during the next forward.
        "overlap_updates": True,
        "initial_iteration": initial_iteration}
    ranks = ({"rank": sharding.rank, "world": sharding.world}
             if sharding is not None else {})
    return cut_model({**description, **ranks, "spec": spec})["spec"]


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
    follow_share() moves the data plane to the arena lohand asks for;
    close() takes down whatever was opened."""

    def __init__(self, socket: Optional[str], job_name: str,
                 run: Optional[DistributedRun] = None) -> None:
        self.job_name = job_name
        # The distributed run a created job is one rank of (None: alone).
        self.run = run
        self.client: Optional[Client] = None
        self.job: Optional[Job] = None
        self.plane: Optional[DataPlane] = None
        self.remote: Optional[Model] = None
        # A job this session created: deleted if the engine fails to start.
        self.delete_on_failure = False
        self.slots = 0  # shared buffers per kind; 0: one per layer
        self.cuda = False  # gradients leave the GPU through the C library
        # How the daemon sized a job this session created (None: found).
        self.sizing: Optional[ArenaSizing] = None
        # The views into the arena, per layer. Changed in place when the
        # data plane moves (follow_share): the router, the iteration and
        # the parameter residency hold these very lists.
        self.grad_views: List[torch.Tensor] = []
        self.weight_views: List[torch.Tensor] = []
        self.staging: Optional[torch.Tensor] = None
        self.client = Client(socket)

    @property
    def buffers(self) -> str:
        """"resident" or "streamed": how the arena holds gradients and
        16-bit weights."""
        return "streamed" if self.slots else "resident"

    def open(self, resume: bool, spec: Mapping[str, Any]) -> None:
        """Finds (resume=True) or creates the job, its arena sized by the
        daemon for `spec`, attaches it and maps the arena."""
        try:
            self.job, created, sizing, self.plane = self.client.open_job(
                self.job_name, spec, resume, run=self.run)
        except LohanError as error:
            raise _with_hint(error, self.job_name,
                             bool(int(spec["activation_bytes"]))) from None
        self.delete_on_failure = created
        self.sizing = sizing if created else None
        if (created and spec["arena_fit"] == "ARENA_FIT_MOST"
                and sizing.stream_buffers):
            warnings.warn(
                "lohan: the daemon's host pool cannot hold one gradient and "
                "one weight buffer per layer "
                f"({sizing.resident_arena_bytes >> 20} MiB); streaming them "
                f"through {sizing.stream_buffers} shared buffers of each "
                f"({sizing.arena_bytes >> 20} MiB) and its SSDs instead",
                stacklevel=4)

    def register(self, spec: Mapping[str, Any], layers: List[Layer],
                 dtype: torch.dtype) -> Model:
        """Registers the model and maps its buffers (its layer_elements
        elements each: a layer, or this rank's shard of it)."""
        try:
            self.remote = remote = self.plane.register_model(self.job.id,
                                                             spec)
        except LohanError as error:
            raise _with_hint(error, self.job_name, False) from None
        self._map(layers, dtype)
        return remote

    def _map(self, layers: List[Layer], dtype: torch.dtype) -> None:
        """The registered layout's buffers as tensors (in place, into the
        lists others hold) and its shared buffer count."""
        remote = self.remote
        streamed = remote.grad_slots < len(layers)
        self.slots = remote.grad_slots if streamed else 0
        self.grad_views[:] = [
            torch.frombuffer(remote.grad_buffer(l.index), dtype=dtype)[
                :remote.layer_elements[l.index]] for l in layers]
        self.weight_views[:] = [
            torch.frombuffer(remote.weight_buffer(l.index), dtype=dtype)[
                :remote.layer_elements[l.index]] for l in layers]
        self.staging = torch.frombuffer(remote.staging, dtype=torch.float32)

    @property
    def arena_bytes(self) -> int:
        """The open data plane's arena (0 when none is open)."""
        return self.plane.size if self.plane is not None else 0

    def follow_share(self, layers: List[Layer], dtype: torch.dtype) -> bool:
        """Between steps, with nothing in flight and no tensor left over
        the arena but this session's views: moves the data plane to the
        arena lohand asked for at the last ITER_END (Client.follow_share:
        the model registered again, laid out anew, pinned again for
        CUDA) and maps the new layout's buffers. False when it did not
        move (the views are those of before). LohanError when the move
        failed: with arena_bytes 0 the job has no data plane, else nothing
        was done (the views are those of before)."""
        self._drop_views()
        try:
            return self.client.follow_share(self.job.id, self.plane,
                                            self.remote)
        finally:
            # The plane and model are the same objects; their buffers are
            # the new arena's (the old ones' when nothing moved).
            if self.arena_bytes:
                self._map(layers, dtype)

    def register_reverted(self, spec: Mapping[str, Any], layers: List[Layer],
                          dtype: torch.dtype) -> Model:
        """Registers the model again on a fresh data plane, the job going
        back to the commit before its last one (a data-parallel rank
        ahead of its peers, see rank_commits.rejoin_point)."""
        self._unmap()
        self.plane.close()
        self.plane = self.client.reopen_data_plane(self.job.id)
        return self.register({**spec, "revert_last_commit": True}, layers,
                             dtype)

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
        self._unmap()
        if self.plane is not None:
            self.plane.close()
            self.plane = None
        if self.client is not None:
            if self.job is not None:
                try:
                    self.client.close_job(
                        self.job.id, self.delete_on_failure or delete_job)
                except LohanError:
                    pass  # not attached, or the daemon is gone
            self.client.close()
            self.client = None

    def _unmap(self) -> None:
        """Lets go of every view into the arena (before the plane goes)."""
        self._drop_views()
        self.remote = None

    def _drop_views(self) -> None:
        # In place: whoever holds the lists holds no view into an arena
        # that a move or the close unmaps either.
        self.grad_views.clear()
        self.weight_views.clear()
        self.staging = None


def _with_hint(error: LohanError, job_name: str,
               activations: bool) -> LohanError:
    """lohan_job_open's refusal with what to change in lohan.init."""
    hints = {
        StatusCode.NOT_FOUND: (
            f"resume=True but you have no job named {job_name!r} on this "
            "daemon; start it without resume=True first (lohanctl jobs "
            "lists your jobs)"),
        StatusCode.ALREADY_EXISTS: (
            f"{error.message} (a job named {job_name!r} exists: pass "
            "resume=True to continue it, or another job_name)"),
    }
    if (error.code == StatusCode.FAILED_PRECONDITION
            and "another model layout" in error.message):
        hints[error.code] = (
            f"{error.message} (the model, blocks=, dtype, param_unit and "
            "amsgrad decide the layout: resume with those the job was "
            "made with, or save a checkpoint with engine.save(dir, "
            "optimizer_state=True) and start a new job from it with "
            "resume=dir)")
    if error.code == StatusCode.RESOURCE_EXHAUSTED and activations:
        hints[error.code] = (f"{error.message} (lower "
                             "activation_buffer_bytes to shrink the "
                             "activation area)")
    if error.code not in hints:
        return error
    return LohanError(error.code, hints[error.code])
