"""A Python client of lohand's control plane, over liblohan_client's C ABI."""

from __future__ import annotations

import ctypes
import enum
import json
import math
from dataclasses import dataclass
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence,
                    Tuple, Union)

from lohan import _native
from lohan.model_spec import DTYPES, ModelSpec


class StatusCode(enum.IntEnum):
    """The canonical status codes lohan uses everywhere (same as gRPC's)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class LohanError(RuntimeError):
    """A failed lohan call: `code` is a StatusCode, the text says what to do.

    A data plane lohand closed fails every request left with one reason:
    ABORTED when lohand closed it on purpose (given way to another user's
    job within its share, or `lohanctl drain` / `kill`), UNAVAILABLE when
    lohand is stopping or was lost; the text names who for and the
    iteration the job keeps. Either way: open the job again
    (lohan.init(..., resume=True)).

    `field`: for a spec's value refused by the checks liblohan_client runs
    before a spec leaves the process (lohand's own rules), the ModelSpec
    field it names ("adam.eps"); "" otherwise."""

    def __init__(self, code: int, message: str, field: str = ""):
        try:
            self.code = StatusCode(code)
        except ValueError:
            self.code = StatusCode.UNKNOWN
        self.message = message
        self.field = field
        super().__init__(f"{self.code.name}: {message}")


def _check(status: int) -> None:
    if status != 0:
        lib = _native.library()
        raise LohanError(status, lib.lohan_last_error().decode(errors="replace"),
                         lib.lohan_last_error_field().decode(errors="replace"))


SpecArg = Union[ModelSpec, Mapping[str, Any]]
_DTYPE_NAMES = {wire: name for name, wire in DTYPES.items()}


def spec_object(spec: SpecArg) -> Dict[str, Any]:
    """A ModelSpec as protobuf JSON's object: `spec` itself when it is one
    already (what the plugin builds, lohan_model_cut), else the
    dataclass's translation."""
    return spec.to_proto() if isinstance(spec, ModelSpec) else dict(spec)


def proto_json(value: Any) -> bytes:
    """`value` as protobuf JSON text: non-finite floats as the strings
    protobuf reads ("Infinity", "NaN"), so the library, not the JSON
    parser, says what is wrong with them."""
    def finite(item: Any) -> Any:
        if isinstance(item, float) and not math.isfinite(item):
            return "NaN" if item != item else (
                "Infinity" if item > 0 else "-Infinity")
        if isinstance(item, dict):
            return {key: finite(v) for key, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [finite(v) for v in item]
        return item
    return json.dumps(finite(value)).encode()


def cut_model(description: Mapping[str, Any]) -> Dict[str, Any]:
    """liblohan_client's cut of a ModelDescription (proto/model_cut.proto):
    the ModelCut as protobuf JSON's object. ValueError with the library's
    words for a description it refuses (a group naming what the model
    does not have, ...)."""
    lib = _native.library()
    cut = ctypes.c_void_p()
    status = lib.lohan_model_cut_create(proto_json(description),
                                        ctypes.byref(cut))
    if status == StatusCode.INVALID_ARGUMENT:
        raise ValueError(lib.lohan_last_error().decode(errors="replace"))
    _check(status)
    try:
        return json.loads(lib.lohan_model_cut_json(cut).decode())
    finally:
        lib.lohan_model_cut_destroy(cut)


def take_text(text: ctypes.c_void_p) -> str:
    """A string the library allocated for a caller, freed."""
    try:
        return ctypes.string_at(text).decode()
    finally:
        _native.library().lohan_string_free(text)


@dataclass(frozen=True)
class ArenaSizing:
    """How the daemon sized a job's arena for its model (ArenaSizing in
    proto/lohan.proto)."""
    arena_bytes: int
    stream_buffers: int  # shared buffers of each kind; 0: one per layer
    resident_arena_bytes: int  # what one buffer per layer takes


@dataclass(frozen=True)
class DistributedRun:
    """The distributed run a job is one rank of (JobSpec.run): data-parallel
    ranks, one job each on its node's daemon. The daemon checks it: name 1
    to 64 of [A-Za-z0-9._-], world_size >= 2, rank < world_size; one job
    per rank of a run per owner on a daemon."""
    name: str
    rank: int
    world_size: int


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    owner_uid: int
    attached: bool
    attached_pid: int

    @staticmethod
    def _from_handle(handle: int) -> "Job":
        lib = _native.library()
        return Job(
            id=lib.lohan_job_info_id(handle).decode(),
            name=lib.lohan_job_info_name(handle).decode(),
            owner_uid=lib.lohan_job_info_owner_uid(handle),
            attached=lib.lohan_job_info_state(handle) == 2,
            attached_pid=lib.lohan_job_info_attached_pid(handle),
        )


# Adam moments by torch's optimizer state names (LOHAN_STATE_* in
# lohan_client.h).
STATE_PARTS = {"exp_avg": 1, "exp_avg_sq": 2, "max_exp_avg_sq": 3}


def _view(address: Optional[int], size: int) -> memoryview:
    """`size` bytes at `address`; empty when there are none (NULL: no data
    plane)."""
    if not address or not size:
        return memoryview(bytearray())
    return memoryview((ctypes.c_uint8 * size).from_address(address)).cast("B")


def _release(view: Optional[memoryview]) -> None:
    """Lets go of a view into an arena that is going, unless something
    still exports it (a tensor over it: whoever made that drops it)."""
    if view is not None:
        try:
            view.release()
        except BufferError:
            pass


class Model:
    """A model registered with the daemon (see lohan_client.h, "Training
    through the data plane"). Buffers are memoryviews into the job's arena;
    they are invalid once the DataPlane is closed, and once it moves
    (Client.follow_share: the attributes then describe the new arena)."""

    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p,
                 layer_elements: List[int], dtype: str):
        self._lib = lib
        self._handle = handle
        self.layer_elements = list(layer_elements)
        self.dtype = dtype
        self._dependents: List[Callable[[], None]] = []
        self.staging: Optional[memoryview] = None
        self.activations: Optional[memoryview] = None
        self._read_layout()

    def _read_layout(self) -> None:
        """What the registration says (again after a move)."""
        lib, handle = self._lib, self._handle
        # Committed iterations when the model was registered.
        self.iteration = lib.lohan_model_iteration(handle)
        # The job kept the commit before its last one (a data-parallel
        # rank's): ModelSpec.revert_last_commit goes back to it.
        self.previous_commit_kept = bool(
            lib.lohan_model_previous_commit_kept(handle))
        # Gradient / weight buffers: the layers, or K shared ones.
        self.grad_slots = lib.lohan_model_grad_slots(handle)
        self.weight_slots = lib.lohan_model_weight_slots(handle)
        _release(self.staging)
        _release(self.activations)
        staging_bytes = lib.lohan_model_staging_bytes(handle)
        self.staging = _view(lib.lohan_model_staging(handle), staging_bytes)
        area = ctypes.c_uint64()
        address = lib.lohan_model_activation_buffer(handle, ctypes.byref(area))
        # Swapped activations go through here (act_put / act_get).
        self.activations = _view(address, area.value) if area.value else None

    @property
    def handle(self) -> ctypes.c_void_p:
        """The lohan_model handle (for liblohan_client's other calls)."""
        return self._handle

    @property
    def num_layers(self) -> int:
        return len(self.layer_elements)

    @property
    def arena_asked(self) -> int:
        """What lohand asked of the job's arena at the end of the last
        iteration (lohan_model_arena_asked): 0 nothing; else the arena
        bytes its next data plane gets (fewer than now: give way to
        another user's share of the host pool; more: the pool has room
        again). Client.follow_share moves it."""
        asked = ctypes.c_uint64()
        _check(self._lib.lohan_model_arena_asked(self._handle,
                                                 ctypes.byref(asked)))
        return asked.value

    def _layer(self, layer: int) -> int:
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} of {self.num_layers}")
        return layer

    def layer_initialized(self, layer: int) -> bool:
        return bool(self._lib.lohan_model_layer_initialized(
            self._handle, self._layer(layer)))

    def grad_buffer(self, layer: int) -> memoryview:
        layer = self._layer(layer)
        return _view(self._lib.lohan_model_grad_buffer(self._handle, layer),
                     self._lib.lohan_model_layer_bytes(self._handle, layer))

    def weight_buffer(self, layer: int) -> memoryview:
        layer = self._layer(layer)
        return _view(self._lib.lohan_model_weight_buffer(self._handle, layer),
                     self._lib.lohan_model_layer_bytes(self._handle, layer))

    def init_weights(self, layer: int) -> None:
        _check(self._lib.lohan_model_init_weights(self._handle,
                                                  self._layer(layer)))

    def read_weights(self, layer: int) -> None:
        _check(self._lib.lohan_model_read_weights(self._handle,
                                                  self._layer(layer)))

    @staticmethod
    def _part(part: str) -> int:
        if part not in STATE_PARTS:
            raise ValueError(f"optimizer state part {part!r} is not one of "
                             f"{sorted(STATE_PARTS)}")
        return STATE_PARTS[part]

    def read_state(self, layer: int, part: str) -> None:
        """Copies the layer's committed Adam moment `part` ("exp_avg",
        "exp_avg_sq", or "max_exp_avg_sq" with amsgrad) into staging as
        fp32. Between iterations only."""
        _check(self._lib.lohan_model_read_state(
            self._handle, self._layer(layer), self._part(part)))

    def init_state(self, layer: int, part: str) -> None:
        """Replaces the layer's committed Adam moment `part` with the fp32
        values in staging (after init_weights, between iterations); the
        weights and the other moments stay. With register_model's
        initial_iteration this restores a checkpoint into a new job."""
        _check(self._lib.lohan_model_init_state(
            self._handle, self._layer(layer), self._part(part)))

    def iter_begin(self, grad_scale: float = 1.0,
                   lr: Optional[float] = None) -> None:
        """Starts an iteration; every gradient of it is multiplied by
        `grad_scale` (1/loss_scale with fp16 loss scaling), and `lr` (if
        given) is this iteration's learning rate (a schedule's value)."""
        if grad_scale == 1.0 and lr is None:
            _check(self._lib.lohan_model_iter_begin(self._handle))
        else:
            # A negative rate: the registered one (0 is a rate: warmup).
            _check(self._lib.lohan_model_iter_begin_with(
                self._handle, grad_scale, -1.0 if lr is None else lr))

    def fetch_params(self, layer: int) -> None:
        _check(self._lib.lohan_model_fetch_params(self._handle,
                                                  self._layer(layer)))

    def grad_ready(self, layer: int) -> None:
        _check(self._lib.lohan_model_grad_ready(self._handle,
                                                self._layer(layer)))

    def act_put(self, activation_id: int, offset: int, length: int) -> None:
        """Hands activations[offset:offset+length] to the daemon (kept on
        its SSDs); the area may be reused afterwards."""
        _check(self._lib.lohan_model_act_put(self._handle, activation_id,
                                             offset, length))

    def act_get(self, activation_id: int, offset: int, length: int) -> None:
        _check(self._lib.lohan_model_act_get(self._handle, activation_id,
                                             offset, length))

    def act_free(self, activation_id: int) -> None:
        _check(self._lib.lohan_model_act_free(self._handle, activation_id))

    # ---- Asynchronous requests (see lohan_client.h): each submit_* returns
    # a ticket at once; wait(ticket) raises the request's error, if any.
    # Many may be in flight; wait for every ticket (its result is kept until
    # then).

    def _submit(self, function, *args) -> int:
        ticket = ctypes.c_uint64()
        _check(function(self._handle, *args, ctypes.byref(ticket)))
        return ticket.value

    def submit_grad_ready(self, layer: int) -> int:
        return self._submit(self._lib.lohan_model_submit_grad_ready,
                            self._layer(layer))

    def submit_fetch_params(self, layer: int) -> int:
        return self._submit(self._lib.lohan_model_submit_fetch_params,
                            self._layer(layer))

    def submit_act_put(self, activation_id: int, offset: int,
                       length: int) -> int:
        return self._submit(self._lib.lohan_model_submit_act_put,
                            activation_id, offset, length)

    def submit_act_put_from_device(self, activation_id: int, offset: int,
                                   length: int, tensor_ptr: int, device: int,
                                   stream_ptr: int = 0) -> int:
        """ACT_PUT of `length` bytes of GPU memory at `tensor_ptr` (on CUDA
        device `device`): copied on the stream `stream_ptr` into the
        activation area at `offset`, the put submitted once the copy is
        done; returns the ticket at once. Keep the memory alive until the
        copy has read it (record_stream on that stream)."""
        return self._submit(self._lib.lohan_model_submit_act_put_from_device,
                            activation_id, offset, length, device, tensor_ptr,
                            stream_ptr or None)

    def submit_act_get(self, activation_id: int, offset: int,
                       length: int) -> int:
        return self._submit(self._lib.lohan_model_submit_act_get,
                            activation_id, offset, length)

    def submit_act_free(self, activation_id: int) -> int:
        return self._submit(self._lib.lohan_model_submit_act_free,
                            activation_id)

    def wait(self, ticket: int, timeout: Optional[float] = None) -> None:
        """Waits for `ticket`'s request (up to `timeout` seconds; None: no
        limit) and raises its error. DEADLINE_EXCEEDED leaves the ticket
        valid; any other outcome consumes it."""
        timeout_ms = -1 if timeout is None else max(0, int(timeout * 1000))
        _check(self._lib.lohan_model_wait(self._handle, ticket, timeout_ms))

    def poll(self, ticket: int) -> bool:
        """True once `ticket`'s request is done (wait() then returns at
        once); does not consume the ticket."""
        done = ctypes.c_int()
        _check(self._lib.lohan_model_poll(self._handle, ticket,
                                          ctypes.byref(done)))
        return bool(done.value)

    def grad_ready_from_host(self, layer: int, address: int,
                             nbytes: int) -> int:
        """Copies the layer's gradient from host memory at `address`
        (e.g. tensor.data_ptr() of a contiguous CPU tensor) into its
        gradient buffer and submits GRAD_READY; returns the ticket."""
        return self._submit(self._lib.lohan_model_grad_ready_from_host,
                            self._layer(layer), address, nbytes)

    @staticmethod
    def cuda_available() -> tuple:
        """(available, reason): whether this library can copy to and from
        GPUs here, and why not."""
        lib = _native.library()
        if lib.lohan_cuda_available():
            return True, ""
        return False, lib.lohan_last_error().decode(errors="replace")

    def grad_ready_from_device(self, layer: int, tensor_ptr: int, nbytes: int,
                               stream_ptr: int = 0,
                               device: Optional[int] = None) -> int:
        """Enqueues on the CUDA stream `stream_ptr` (e.g.
        torch.cuda.current_stream().cuda_stream; 0: the default stream) a
        copy of the layer's gradient from device memory at `tensor_ptr`
        (tensor.data_ptr()) into its gradient buffer, then its GRAD_READY;
        returns the ticket at once. `device`: the CUDA device index the
        pointer and stream are on (tensor.device.index); every CUDA call is
        made there and the thread's current device is left as it was. None:
        found from the pointer, which may create a context on the current
        device (pass it). See lohan_client.h."""
        if device is None:
            return self._submit(self._lib.lohan_model_grad_ready_from_device,
                                self._layer(layer), tensor_ptr, nbytes,
                                stream_ptr or None)
        return self._submit(
            self._lib.lohan_model_grad_ready_from_device_on_device,
            self._layer(layer), device, tensor_ptr, nbytes, stream_ptr or None)

    def weights_to_device(self, layer: int, tensor_ptr: int, nbytes: int,
                          stream_ptr: int = 0,
                          device: Optional[int] = None) -> None:
        """Enqueues on the CUDA stream a copy of the layer's weight buffer
        to device memory at `tensor_ptr` (fetch the layer's params first);
        `device` as for grad_ready_from_device."""
        if device is None:
            _check(self._lib.lohan_model_weights_to_device(
                self._handle, self._layer(layer), tensor_ptr, nbytes,
                stream_ptr or None))
            return
        _check(self._lib.lohan_model_weights_to_device_on_device(
            self._handle, self._layer(layer), device, tensor_ptr, nbytes,
            stream_ptr or None))

    def iter_abort(self) -> None:
        """Ends the iteration with nothing committed (see lohan_client.h)."""
        _check(self._lib.lohan_model_iter_abort(self._handle))

    def await_committed(self) -> int:
        """Between iterations: waits until the last one has committed and
        returns the committed iterations (see lohan_client.h)."""
        committed = ctypes.c_uint64()
        _check(self._lib.lohan_model_await_committed(
            self._handle, ctypes.byref(committed)))
        return committed.value

    def release_previous_commit(self) -> None:
        """Once every rank has committed the last step: frees the states
        the last commit kept (see lohan_client.h)."""
        _check(self._lib.lohan_model_release_previous_commit(self._handle))

    def iter_end(self, global_sum_squares: Optional[float] = None) -> tuple:
        """(global_norm, clipped, skipped) of the iteration.

        `global_sum_squares` (sharded data-parallel jobs, each rank's job
        holding only its shard of every layer): the sum over every rank's
        gradients of (g * grad_scale) ** 2, the same on every rank (an
        all-reduce of each rank's own sum); the daemon clips and skips on
        it and returns its square root as the global norm, so every rank
        decides alike (lohan_model_iter_end_global). inf/NaN: a non-finite
        gradient somewhere; negative: InvalidArgument, the iteration still
        in progress."""
        norm = ctypes.c_double()
        clipped, skipped = ctypes.c_int(), ctypes.c_int()
        if global_sum_squares is None:
            _check(self._lib.lohan_model_iter_end(
                self._handle, ctypes.byref(norm), ctypes.byref(clipped),
                ctypes.byref(skipped)))
        else:
            _check(self._lib.lohan_model_iter_end_global(
                self._handle, float(global_sum_squares), ctypes.byref(norm),
                ctypes.byref(clipped), ctypes.byref(skipped)))
        return norm.value, bool(clipped.value), bool(skipped.value)

    def on_close(self, close: Callable[[], None]) -> None:
        """Calls `close` before the model's handle goes (what refers to
        it: lohan.steps.TrainingSteps)."""
        self._dependents.append(close)

    def close(self) -> None:
        if self._handle:
            for close in self._dependents:
                close()
            self._dependents = []
            self._lib.lohan_model_destroy(self._handle)
            self._handle = ctypes.c_void_p()

    def __del__(self) -> None:
        self.close()


class DataPlane:
    """A job's shared-memory arena, mapped into this process. `arena` is a
    writable memoryview over it (wrap it with numpy.frombuffer or
    torch.frombuffer); it is invalid after close(). Closing (or this process
    exiting) gives the memory back to the daemon."""

    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p,
                 client: "Client"):
        self._lib = lib
        self._handle = handle
        self._client = client  # keeps the connection alive as long as we are
        self._models: List[Model] = []
        self.arena: Optional[memoryview] = None
        self._map_arena()

    def _map_arena(self) -> None:
        """`arena` over the plane's arena (again after a move; empty when
        a failed move left the job without a plane)."""
        _release(self.arena)
        self.arena = _view(self._lib.lohan_data_plane_arena(self._handle),
                           self._lib.lohan_data_plane_arena_size(self._handle))

    def register_model(self, job_id: str,
                       spec: Union[SpecArg, Sequence[int]],
                       **fields: Any) -> Model:
        """Registers the model of `job_id` (this process attached it and
        opened this data plane): `spec` (a ModelSpec, or its protobuf JSON
        object), or a ModelSpec of `spec` as its layer_elements and
        `fields` (see lohan.model_spec.ModelSpec)."""
        if not isinstance(spec, (ModelSpec, Mapping)):
            spec = ModelSpec(layer_elements=list(spec), **fields)
        elif fields:
            raise TypeError("register_model takes a ModelSpec or its fields, "
                            "not both")
        proto = spec_object(spec)
        handle = ctypes.c_void_p()
        _check(self._lib.lohan_model_register_json(
            self._client._handle, self._handle, job_id.encode(),
            json.dumps(proto).encode(), ctypes.byref(handle)))
        model = Model(self._lib, handle,
                      [int(n) for n in proto["layer_elements"]],
                      _DTYPE_NAMES.get(proto.get("dtype", "DTYPE_FP32"),
                                       "fp32"))
        self._models.append(model)
        return model

    def cuda_register(self, device: Optional[int] = None) -> None:
        """Pins the arena for DMA (cudaHostRegister, portable) so copies
        between it and GPU memory are asynchronous; undone by close().
        `device`: the CUDA device index the call is made on (the job's;
        the thread's current device is left as it was); None: the thread's
        current device, which is device 0 if the thread has none yet."""
        if device is None:
            _check(self._lib.lohan_data_plane_cuda_register(self._handle))
            return
        _check(self._lib.lohan_data_plane_cuda_register_on_device(
            self._handle, device))

    @property
    def size(self) -> int:
        return len(self.arena) if self.arena is not None else 0

    def close(self) -> None:
        if self._handle:
            for model in self._models:
                model.staging.release()
                if model.activations is not None:
                    model.activations.release()
                model.close()
            self._models = []
            self.arena.release()
            self.arena = None
            self._lib.lohan_data_plane_destroy(self._handle)
            self._handle = ctypes.c_void_p()

    def __enter__(self) -> "DataPlane":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _job_of(job: Dict[str, Any]) -> Job:
    """A Job out of protobuf JSON's Job (proto names)."""
    return Job(id=job["id"], name=job["spec"]["name"],
               owner_uid=int(job["owner_uid"]),
               attached=job["state"] == "JOB_STATE_ATTACHED",
               attached_pid=int(job["attached_pid"]))


def _sizing_of(arena: Dict[str, Any]) -> ArenaSizing:
    """ArenaSizing out of protobuf JSON's (absent for a found job)."""
    return ArenaSizing(
        arena_bytes=int(arena.get("arena_bytes", 0)),
        stream_buffers=int(arena.get("stream_buffers", 0)),
        resident_arena_bytes=int(arena.get("resident_arena_bytes", 0)))


class Client:
    """A connection to lohand. `socket_path=None` uses $LOHAN_SOCKET, else
    /run/lohan/lohand.sock. Raises LohanError(UNAVAILABLE) naming the socket
    when no daemon answers."""

    def __init__(self, socket_path: Optional[str] = None):
        # Before the library loads: __del__ runs even if that fails.
        self._handle = ctypes.c_void_p()
        self._lib = _native.library()
        path = socket_path.encode() if socket_path is not None else None
        _check(self._lib.lohan_client_connect(path, ctypes.byref(self._handle)))

    def close(self) -> None:
        if self._handle:
            self._lib.lohan_client_destroy(self._handle)
            self._handle = ctypes.c_void_p()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    @property
    def daemon_version(self) -> str:
        return self._lib.lohan_client_daemon_version(self._handle).decode()

    @property
    def protocol(self) -> tuple:
        major, minor = ctypes.c_uint32(), ctypes.c_uint32()
        self._lib.lohan_client_protocol(self._handle, ctypes.byref(major),
                                        ctypes.byref(minor))
        return (major.value, minor.value)

    @property
    def caller_uid(self) -> int:
        return self._lib.lohan_client_caller_uid(self._handle)

    def has_capability(self, name: str) -> bool:
        return bool(self._lib.lohan_client_has_capability(self._handle,
                                                          name.encode()))

    def _job_call(self, function, *args) -> Job:
        info = ctypes.c_void_p()
        _check(function(self._handle, *args, ctypes.byref(info)))
        try:
            return Job._from_handle(info)
        finally:
            self._lib.lohan_job_info_destroy(info)

    def create_job(self, name: str, host_pool_bytes: int = 0,
                   ssd_bytes: int = 0) -> Job:
        return self._job_call(self._lib.lohan_job_create, name.encode(),
                              host_pool_bytes, ssd_bytes)

    def create_job_for_model(self, name: str, model: SpecArg,
                             ssd_bytes: int = 0,
                             run: Optional[DistributedRun] = None
                             ) -> Tuple[Job, ArenaSizing]:
        """A job whose arena the daemon sizes for `model` (with
        `model.fit_arena`, the most it can hold the model with), and how it
        sized it; with `run`, one rank of that distributed run."""
        spec: Dict[str, Any] = {"name": name, "ssd_bytes": ssd_bytes,
                                "model": spec_object(model)}
        if run is not None:
            spec["run"] = {"name": run.name, "rank": run.rank,
                           "world_size": run.world_size}
        request = {"spec": spec}
        text = ctypes.c_void_p()
        _check(self._lib.lohan_job_create_json(
            self._handle, json.dumps(request).encode(), ctypes.byref(text)))
        response = json.loads(take_text(text))
        return _job_of(response["job"]), _sizing_of(response["arena"])

    def open_job(self, name: str, model: SpecArg, resume: bool,
                 run: Optional[DistributedRun] = None
                 ) -> Tuple[Job, bool, ArenaSizing, DataPlane]:
        """The caller's job `name` ready to train (lohan_job_open): found
        (resume) or created with its arena sized for `model` (with `run`,
        one rank of that distributed run), attached, its data plane open.
        Returns the job, whether it was created, the arena's sizing and
        the plane."""
        spec: Dict[str, Any] = {"name": name, "model": spec_object(model)}
        if run is not None:
            spec["run"] = {"name": run.name, "rank": run.rank,
                           "world_size": run.world_size}
        plane, text = ctypes.c_void_p(), ctypes.c_void_p()
        _check(self._lib.lohan_job_open(
            self._handle, json.dumps({"spec": spec, "resume": resume}).encode(),
            ctypes.byref(plane), None, ctypes.byref(text)))
        response = json.loads(take_text(text))
        return (_job_of(response["job"]), bool(response["created"]),
                _sizing_of(response.get("arena", {})),
                DataPlane(self._lib, plane, self))

    def follow_share(self, job_id: str, plane: DataPlane,
                     model: Model) -> bool:
        """Between iterations (every request answered), when lohand asked
        at the last iteration's end (model.arena_asked): moves the job's
        data plane to the arena lohand grants (lohan_job_follow_share: the
        plane closed and opened again, the model registered again as it
        was, laid out anew in that arena, the arena pinned again for CUDA
        where it was). True when it moved; False when nothing was asked
        (nothing done). `plane` and `model` stay the same objects; after a
        move their views (plane.arena, model.staging, model.activations,
        grad_buffer / weight_buffer) and layout (grad_slots, weight_slots,
        iteration) are the new arena's, and every view or tensor taken over
        the old arena is invalid: drop them before (the old views are
        released unless something still exports them). LohanError when the
        move failed; if it had closed the old plane, the job has no data
        plane (plane.size is 0, model.staging empty, their calls fail with
        FAILED_PRECONDITION saying so): open the job again with resume."""
        moved = ctypes.c_int()
        status = self._lib.lohan_job_follow_share(
            self._handle, job_id.encode(), plane._handle, model._handle,
            ctypes.byref(moved))
        error = None
        if status != 0:  # its text before any other call of the library
            error = LohanError(
                status, self._lib.lohan_last_error().decode(errors="replace"))
        if moved.value:
            plane._map_arena()
            model._read_layout()
        if error is not None:
            raise error
        return bool(moved.value)

    def reopen_data_plane(self, job_id: str) -> DataPlane:
        """The job's data plane again, once the daemon took the last one's
        arena back."""
        handle = ctypes.c_void_p()
        _check(self._lib.lohan_job_reopen_data_plane(
            self._handle, job_id.encode(), ctypes.byref(handle)))
        return DataPlane(self._lib, handle, self)

    def close_job(self, job_id: str, delete: bool) -> None:
        """After the job's data plane closed: waits for the daemon to take
        its arena back, detaches the job and with `delete` deletes it."""
        _check(self._lib.lohan_job_close(self._handle, job_id.encode(),
                                         int(delete)))

    def attach_job(self, job_id: str) -> Job:
        return self._job_call(self._lib.lohan_job_attach, job_id.encode())

    def detach_job(self, job_id: str) -> Job:
        return self._job_call(self._lib.lohan_job_detach, job_id.encode())

    def delete_job(self, job_id: str) -> None:
        _check(self._lib.lohan_job_delete(self._handle, job_id.encode()))

    def open_data_plane(self, job_id: str) -> DataPlane:
        """The job's arena; this process must have attached the job."""
        handle = ctypes.c_void_p()
        _check(self._lib.lohan_data_plane_open(self._handle, job_id.encode(),
                                               ctypes.byref(handle)))
        return DataPlane(self._lib, handle, self)

    def jobs(self) -> List[Job]:
        handle = ctypes.c_void_p()
        _check(self._lib.lohan_jobs_list(self._handle, ctypes.byref(handle)))
        try:
            return [Job._from_handle(self._lib.lohan_job_list_get(handle, i))
                    for i in range(self._lib.lohan_job_list_size(handle))]
        finally:
            self._lib.lohan_job_list_destroy(handle)

    def status(self) -> Dict[str, Any]:
        """GetStatus as a dict (the proto's JSON form, field names as in
        proto/lohan.proto)."""
        text = ctypes.c_void_p()
        _check(self._lib.lohan_client_status_json(self._handle,
                                                  ctypes.byref(text)))
        return json.loads(take_text(text))

    def plan_job(self, job_id: str, request: Dict[str, Any]) -> Dict[str, Any]:
        """Asks lohand for the activation plan of `job_id` (this process
        attached it, opened its data plane and registered its model).
        `request` is a PlanJobRequest in protobuf's JSON form, e.g.
        {"profile": {"blocks": 4, "blockTensors": [{"bytes": 1024,
        "recomputeFlops": 1e6, "alwaysOffloaded": False}, ...], ...},
        "activationHostBytes": 1 << 20, "perBlock": False} (its jobId is
        replaced by `job_id`). Returns the JobPlan as a dict with
        lowerCamelCase keys and every field present ("blocks": [{"decisions":
        ["host", "recompute", ...]}, ...], "blockModes", "searchCase",
        "predictedIterationSeconds", ...; 64-bit integers come as strings,
        protobuf's JSON rule). The daemon keeps the plan with the job's
        session (status()["sessions"][i]["plan"]). Raises LohanError:
        INVALID_ARGUMENT for a malformed request (naming the field),
        FAILED_PRECONDITION before the model is registered or when a memory
        is short for any plan, UNAVAILABLE while lohand still measures its
        machine, NOT_FOUND for another user's job."""
        text = ctypes.c_void_p()
        _check(self._lib.lohan_job_plan_json(
            self._handle, job_id.encode(), json.dumps(request).encode(),
            ctypes.byref(text)))
        return json.loads(take_text(text))

    def kept_plan(self, job_id: str) -> Dict[str, Any]:
        """The whole plan lohand keeps with `job_id`'s session, as plan_job
        returned it (status() carries only its summary: the figures and
        "block_mode_counts"). For the job's owner or root; LohanError
        NOT_FOUND for a job the caller may not see, FAILED_PRECONDITION when
        the job has no data plane open or no plan."""
        text = ctypes.c_void_p()
        _check(self._lib.lohan_job_kept_plan_json(
            self._handle, job_id.encode(), ctypes.byref(text)))
        return json.loads(take_text(text))
