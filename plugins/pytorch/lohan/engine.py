"""The training engine: `engine = lohan.init(model, ...)`, then per step
`loss.backward()` (or `engine.backward(loss)`) and `engine.step()`.

The daemon keeps the fp32 master weights and the Adam moments; this process
keeps only the model's working copy of the weights (fp32, or bf16/fp16). A
step hands each layer's gradients over as backward produces them (see
hooks.py), `step()` waits for the daemon to finish the iteration (exact
global-norm clipping and non-finite skips happen there) and copies the new
weights into the model's parameters.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from dataclasses import dataclass
from typing import (Any, Callable, Dict, List, Optional, Sequence, Set,
                    Tuple, Union)

import torch
from torch import nn

from lohan.activations import ActivationStats, ActivationStore, BlockPasses
from lohan.activations import block_modes
from lohan.activations import install as install_activation_policy
from lohan.activations import uses_store
from lohan import activations as lohan_activations
from lohan.auto_plan import AutoPlan, sizes_of
from lohan.blocks import (BlocksArg, Layer, WIRE_NAMES, find_blocks,
                          plan_layers, resolve_dtype)
from lohan.checkpoint import (CheckpointReader, parameter_aliases,
                              write_checkpoint)
from lohan.client import Client, LohanError, StatusCode
from lohan.devices import copy_stream
from lohan.hooks import GradientRouter, has_lohan_hook
from lohan.lazy_weights import LazyWeights
from lohan.progress import Progress
from lohan.params import Both, FrozenWeights, ParameterResidency
from lohan.params import resolve_mode as resolve_params_mode

_MIB = 1 << 20
# How long close() and a reopen wait for the daemon to take back an arena
# (it does so as soon as it sees the data-plane connection close).
_ARENA_RETURN_SECONDS = 30.0
_SLOT_ALIGNMENT = 4096  # the daemon's slot allocator rounds every slot up


def _round_up(value: int, unit: int) -> int:
    return (value + unit - 1) // unit * unit


def host_pool_bytes(layer_elements: List[int], element_bytes: int,
                    activation_bytes: int = 0, stream_buffers: int = 0) -> int:
    """Arena size for a model: per layer a gradient and a weight slot (or,
    streamed, `stream_buffers` of each as large as the largest layer), the
    fp32 staging slot of the largest layer, the activation area, and 1 MiB
    for the rings, the error texts and the layout table; rounded up to
    whole MiB."""
    if 0 < stream_buffers < len(layer_elements):
        slots = 2 * stream_buffers * _round_up(
            max(layer_elements) * element_bytes, _SLOT_ALIGNMENT)
    else:
        slots = sum(2 * _round_up(n * element_bytes, _SLOT_ALIGNMENT)
                    for n in layer_elements)
    staging = _round_up(max(layer_elements) * 4, _SLOT_ALIGNMENT)
    activations = _round_up(activation_bytes, _SLOT_ALIGNMENT)
    return _round_up(slots + staging + activations + _MIB, _MIB)


@dataclass(frozen=True)
class StepResult:
    """What the daemon reported for one optimizer step."""

    global_norm: float  # before clipping, over every layer
    clipped: bool       # the update used max_grad_norm / norm
    skipped: bool       # a non-finite gradient: no update, weights unchanged
    iteration: int      # committed steps after this one


def _normalized(device: torch.device) -> torch.device:
    """"cuda" as the device index it means now, so that two names of one
    device compare equal."""
    if device.type == "cuda" and device.index is None and (
            torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return device


@dataclass
class _ParamGroup:
    """One of lohan.init's param_groups, as the daemon runs it."""

    ids: Set[int]                       # id() of its parameters
    lr: float                           # at init
    weight_decay: float
    lr_scale: float                     # lr / the job's lr
    ranges: List[Tuple[int, int, int]]  # (layer, begin, end)


class Engine:
    """Trains `model` with Adam/AdamW run by lohand. Build it with
    lohan.init(). Not thread-safe: one training loop drives it."""

    def __init__(self, model: nn.Module, *, lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0,
                 max_grad_norm: Optional[float] = 0.0,
                 blocks: BlocksArg = None, socket: Optional[str] = None,
                 job_name: Optional[str] = None,
                 dtype: Union[None, str, torch.dtype] = None,
                 resume: Union[bool, str, os.PathLike] = False,
                 grad_accumulation_steps: int = 1,
                 adamw: bool = True, amsgrad: bool = False,
                 bf16_moments: bool = False,
                 no_weight_decay: Union[None, str, Callable[[str, nn.Parameter],
                                                         bool],
                                        Any] = None,
                 param_groups: Optional[Sequence[Dict[str, Any]]] = None,
                 device: Union[None, str, torch.device] = None,
                 frozen_host_bytes: Optional[int] = None,
                 skip_nonfinite: bool = True, chunk_elements: int = 0,
                 activations: Union[str, Sequence[Any]] = "offload",
                 activation_host_bytes: Optional[int] = None,
                 activation_buffer_bytes: int = 16 * _MIB,
                 device_memory_bytes: Optional[int] = None,
                 params: str = "auto",
                 buffers: str = "auto", stream_buffers: int = 4,
                 loss_scale: Union[None, str, float] = None,
                 loss_scale_growth_interval: int = 2000,
                 initial_loss_scale: float = 2.0 ** 16,
                 clip_schedule: str = "deferred",
                 overlap_step: bool = False,
                 service: str = "lanes"):
        if not isinstance(model, nn.Module):
            raise TypeError(f"lohan.init wants an nn.Module, got "
                            f"{type(model).__name__}")
        if (not isinstance(grad_accumulation_steps, int)
                or grad_accumulation_steps < 1):
            raise ValueError("grad_accumulation_steps must be an int >= 1, "
                             f"got {grad_accumulation_steps!r}")
        if not (loss_scale in (None, "dynamic")
                or (isinstance(loss_scale, (int, float))
                    and math.isfinite(loss_scale) and loss_scale > 0)):
            raise ValueError(f"loss_scale={loss_scale!r}: use None (dynamic "
                             "for fp16, else 1), 'dynamic' or a number > 0")
        if not (isinstance(initial_loss_scale, (int, float))
                and math.isfinite(initial_loss_scale)
                and initial_loss_scale >= 1):
            raise ValueError(f"initial_loss_scale={initial_loss_scale!r}: "
                             "a number >= 1 (the dynamic scale's start)")
        if not isinstance(overlap_step, bool):
            raise TypeError(f"overlap_step must be True or False, got "
                            f"{overlap_step!r}")
        # None is the usual way to say "no clipping" (Trainer, torch). The
        # daemon checks the range, naming it.
        if max_grad_norm is None:
            max_grad_norm = 0.0
        if isinstance(max_grad_norm, bool) or not isinstance(
                max_grad_norm, (int, float)):
            raise TypeError(f"max_grad_norm={max_grad_norm!r}: use None or 0 "
                            "(no clipping) or a number > 0")
        if clip_schedule not in ("deferred", "redo-all"):
            raise ValueError(f"clip_schedule={clip_schedule!r}: use "
                             "'deferred' (the default) or 'redo-all'")
        if service not in ("lanes", "in-order"):
            raise ValueError(f"service={service!r}: use 'lanes' (the "
                             "default) or 'in-order'")
        if any(has_lohan_hook(p) for p in model.parameters()):
            raise RuntimeError(
                f"lohan: this {type(model).__name__} is driven by an open "
                "engine already (its hooks would hand every gradient over "
                "twice); call that engine's close() first")
        self.model = model
        # The learning rate of the next step; set it every step to follow a
        # schedule (engine.lr = scheduler_value), as with param_groups.
        self.lr = float(lr)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        for name, value, low, high in (("lr", self.lr, 0.0, math.inf),
                                       ("betas[0]", self.betas[0], 0.0, 1.0),
                                       ("betas[1]", self.betas[1], 0.0, 1.0),
                                       ("weight_decay", self.weight_decay, 0.0,
                                        math.inf)):
            if not (low <= value < high) or not math.isfinite(value):
                raise ValueError(f"lohan.init: {name}={value} must be in "
                                 f"[{low}, {high})")
        if not (self.eps > 0.0 and math.isfinite(self.eps)):
            raise ValueError(f"lohan.init: eps={self.eps} must be > 0")
        self._optimizer: Any = None
        devices = sorted({str(p.device) for p in model.parameters()})
        if len(devices) > 1:
            # Autograd runs each device's backward on its own thread, and
            # the engine's hooks keep per-step state that is not locked.
            raise ValueError(
                f"lohan: the model's parameters are on {', '.join(devices)}; "
                "one engine trains a model on one device: build it on the "
                "CPU and pass device=... (lohan puts on the device what "
                "stays there and offloads the blocks' weights)")
        # Where the model computes, and where its parameters were given
        # (close() gives the model back there).
        self._home_device = torch.device(devices[0] if devices else "cpu")
        self.device = _normalized(torch.device(device) if device is not None
                                  else self._home_device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"lohan: device={self.device} but torch sees no "
                             "CUDA device here")
        if (self.device != _normalized(self._home_device)
                and self._home_device.type != "cpu"):
            raise ValueError(
                f"lohan: device={self.device} but the model is on "
                f"{self._home_device}: give a model on the CPU (a model "
                "larger than the GPU) or on that device")
        self.blocks = find_blocks(model, blocks)
        self.layers: List[Layer] = plan_layers(model, self.blocks)
        self.dtype: torch.dtype = resolve_dtype(dtype, self.layers)
        self.grad_accumulation_steps = grad_accumulation_steps
        self._amsgrad = bool(amsgrad)
        self.job_name = (job_name
                         or f"{type(model).__name__[:48]}-{os.getpid()}")
        # resume=True continues this user's job of that name on the daemon;
        # resume=<directory> starts a new job from a checkpoint (weights,
        # and the Adam moments and step when it has them).
        self._checkpoint: Optional[CheckpointReader] = None
        if not isinstance(resume, bool):
            self._checkpoint = CheckpointReader(resume)
            if not self._checkpoint.moments:
                warnings.warn(
                    f"lohan: {self._checkpoint.path} has no optimizer state "
                    "(engine.save(dir, optimizer_state=True) writes it): "
                    "training starts from its weights with fresh Adam "
                    "moments at step 0", stacklevel=3)
            resume = False
        self.last: Optional[StepResult] = None
        self._in_iteration = False
        self._closed = False
        self._router: Optional[GradientRouter] = None
        self._remote: Any = None
        self._plane: Any = None
        self._client: Optional[Client] = None
        self._job: Any = None
        self._delete_on_failure = False  # a job this init created
        self._uninstall_activations: Callable[[], None] = lambda: None
        self._scaled_backward = False
        # A name, or a plan (one mode per block). "auto" starts as
        # "offload" (its profiling iteration).
        auto = isinstance(activations, str) and activations == "auto"
        if auto:
            activations = "offload"
        self._auto: Optional[AutoPlan] = None
        if device_memory_bytes is not None and (
                not auto or not isinstance(device_memory_bytes, int)
                or device_memory_bytes <= 0):
            raise ValueError(
                f"device_memory_bytes={device_memory_bytes!r}: an int > 0, "
                "with activations='auto' (the device memory its plan may "
                "use)")
        activation_modes = block_modes(activations, len(self.blocks))
        if activation_host_bytes is not None and (
                not isinstance(activation_host_bytes, int)
                or activation_host_bytes < 0):
            raise ValueError("activation_host_bytes must be None (no limit) "
                             f"or an int >= 0, got {activation_host_bytes!r}")
        # Block inputs beyond the host budget go to the daemon's SSDs in
        # pieces of this many bytes (the arena's activation area).
        spill = uses_store(activation_modes) and (
            activation_host_bytes is not None or frozen_host_bytes is not None)
        # Two buffers of whole pages: one put or get in flight while the
        # other is filled or emptied.
        if spill and (not isinstance(activation_buffer_bytes, int)
                      or activation_buffer_bytes < 2 * _SLOT_ALIGNMENT):
            raise ValueError("activation_buffer_bytes must be an int >= "
                             f"{2 * _SLOT_ALIGNMENT}, got "
                             f"{activation_buffer_bytes!r}")
        area_bytes = (_round_up(activation_buffer_bytes, _SLOT_ALIGNMENT)
                      if spill else 0)
        self._activations: Optional[ActivationStore] = None
        self.params_mode = resolve_params_mode(params, self.device)
        if frozen_host_bytes is not None and (
                not isinstance(frozen_host_bytes, int) or frozen_host_bytes < 0
                or self.params_mode != "offload"):
            raise ValueError(
                f"frozen_host_bytes={frozen_host_bytes!r}: an int >= 0, with "
                "params='offload' (the frozen block weights beyond it go to "
                "the daemon's SSDs)")
        if self.params_mode == "resident" and self.device != _normalized(
                self._home_device):
            model.to(self.device)  # all of it: asked for resident weights
        if self.params_mode == "offload" and any(
                mode != "offload" for mode in activation_modes):
            raise ValueError(
                f"params='offload' needs activations='offload', got "
                f"{activations!r}: with it autograd would keep the weights "
                "it saved for backward on the device")
        self._residency: Optional[ParameterResidency] = None
        self._lazy: Optional[LazyWeights] = None
        self._frozen: Optional[FrozenWeights] = None
        self._cuda = False  # gradients leave the GPU through the C library
        self._grad_tickets: List[int] = []
        # GRAD_READY in flight per gradient buffer (address): a streamed
        # layout shares buffers, and one may be refilled only once the
        # daemon has taken the previous gradient out of it.
        self._buffer_tickets: Dict[int, int] = {}
        if buffers not in ("auto", "resident", "streamed"):
            raise ValueError(f"buffers={buffers!r}: use 'auto', 'resident' "
                             "or 'streamed'")
        if not isinstance(stream_buffers, int) or stream_buffers < 1:
            raise ValueError("stream_buffers must be an int >= 1, got "
                             f"{stream_buffers!r}")

        self._groups = self._param_groups(param_groups)
        grouped = set().union(*(g.ids for g in self._groups))
        exempt = self._exempt_ranges(no_weight_decay, grouped)
        element_bytes = torch.empty((), dtype=self.dtype).element_size()
        elements = [layer.numel for layer in self.layers]
        try:
            self._client = Client(socket)
            self._job, slots_for_arena = self._open_job_with_buffers(
                self._client, resume, buffers, stream_buffers, elements,
                element_bytes, area_bytes)
            self._client.attach_job(self._job.id)
            self._plane = self._open_data_plane(self._client, self._job.id)
            slots = slots_for_arena(self._plane.size)
            # "resident" or "streamed": how the arena holds gradients and
            # 16-bit weights.
            self.buffers = "streamed" if slots else "resident"
            self._remote = self._plane.register_model(
                self._job.id, layer_elements=elements,
                dtype=WIRE_NAMES[self.dtype], lr=lr, betas=tuple(betas),
                eps=eps, weight_decay=weight_decay, adamw=adamw,
                amsgrad=amsgrad, bf16_moments=bool(bf16_moments),
                no_weight_decay=exempt,
                param_groups=[(g.lr_scale, g.weight_decay, g.ranges)
                              for g in self._groups],
                max_grad_norm=max_grad_norm, clip_schedule=clip_schedule,
                skip_nonfinite=skip_nonfinite, chunk_elements=chunk_elements,
                activation_bytes=area_bytes, grad_slots=slots,
                weight_slots=slots,
                # Every layer is fetched before its weights are used (see
                # _copy_fetched_into_params and ParameterResidency), so
                # step() returns before the last updates are done and they
                # run during the next forward.
                overlap_updates=True,
                in_order_service=service == "in-order",
                initial_iteration=(self._checkpoint.iteration
                                   if self._checkpoint is not None
                                   and self._checkpoint.moments else 0))
            self._grad_views = [
                torch.frombuffer(self._remote.grad_buffer(l.index),
                                 dtype=self.dtype)[:l.numel]
                for l in self.layers]
            self._weight_views = [
                torch.frombuffer(self._remote.weight_buffer(l.index),
                                 dtype=self.dtype)[:l.numel]
                for l in self.layers]
            self._staging = torch.frombuffer(self._remote.staging,
                                             dtype=torch.float32)
            self._cuda = self._setup_cuda()
            self.iteration: int = int(self._remote.iteration)
            self._load_or_init()
            if dtype is not None:
                model.to(self.dtype)  # buffers and frozen parameters too
        except BaseException:
            self.close()
            raise
        # fp16 loss scaling: engine.backward(loss) multiplies the loss by
        # loss_scale; the daemon multiplies the gradients by 1/loss_scale.
        # "dynamic" (the default for fp16) halves the scale on a step with
        # inf/nan gradients (which the daemon skips) and doubles it after
        # loss_scale_growth_interval good steps, like torch's GradScaler.
        if loss_scale is None:
            loss_scale = "dynamic" if self.dtype == torch.float16 else 1.0
        self._dynamic_scale = loss_scale == "dynamic"
        self.loss_scale = (float(initial_loss_scale) if self._dynamic_scale
                           else float(loss_scale))
        self._growth_interval = int(loss_scale_growth_interval)
        self._good_steps = 0
        scaling = (self._checkpoint.meta.get("loss_scaling")
                   if self._checkpoint is not None else None)
        if self._dynamic_scale and isinstance(scaling, dict):
            # A dynamic scale goes on where the checkpointed run left it
            # (else a resumed fp16 run would start again at 2^16 and skip
            # steps finding its way down).
            self.loss_scale = float(scaling.get("scale", self.loss_scale))
            self._good_steps = int(scaling.get("good_steps", 0))
        self._router = GradientRouter(
            self.layers, self._grad_views, grad_accumulation_steps,
            self._grad_ready,
            self._device_grad_ready if self._cuda else None,
            self._claim_grad_buffer)
        if uses_store(activation_modes):
            area = (torch.frombuffer(self._remote.activations,
                                     dtype=torch.uint8)
                    if spill else None)
            self._activations = ActivationStore(activation_host_bytes,
                                                self._remote, area)
        if self.params_mode == "offload":
            self._residency = ParameterResidency(self.layers, self._remote,
                                                 self._weight_views,
                                                 self.device)
            self._residency.release_all()
            try:
                self._frozen = FrozenWeights(self.blocks, self.device,
                                             frozen_host_bytes,
                                             self._activations)
                # A model given on the CPU: what stays on the device (the
                # layers outside the blocks, buffers) goes there now; the
                # blocks hold placeholders there already.
                model.to(self.device)
            except BaseException:
                self.close()
                raise
            self._state_dict_hooks = [
                block.register_state_dict_post_hook(
                    self._offloaded_state_dict(
                        self._residency.layer_of(block)))
                for block in self.blocks]
        layer_of_block = {id(layer.block): layer.index
                          for layer in self.layers if layer.block is not None}
        router = self._router

        def inside(block: nn.Module) -> Any:
            layer = layer_of_block.get(id(block))
            return (router.inside(layer) if layer is not None
                    else contextlib.nullcontext())

        def passed(block: nn.Module) -> None:
            layer = layer_of_block.get(id(block))
            if layer is not None:
                router.block_passed(layer)

        def reinstall(policy: Any) -> None:
            self._uninstall_activations()
            self._uninstall_activations = lambda: None
            self._uninstall_activations = install_activation_policy(
                model, self.blocks, policy, self._activations,
                Both(self._residency, self._frozen) if self._residency
                else None, BlockPasses(inside, passed),
                self._auto.observer if self._auto else lambda: None)

        if auto:
            self._auto = AutoPlan(
                model, self.device,
                lambda: lohan_activations._MIN_SWAP_BYTES,
                activation_host_bytes, reinstall,
                per_tensor=self.params_mode != "offload",
                device_bytes=device_memory_bytes)
        reinstall(activations)
        if overlap_step:
            resident_blocks = [
                layer for layer in self.layers if layer.block is not None
                and (self._residency is None
                     or self._residency.layer_of(layer.block) is not layer)]
            self._lazy = LazyWeights(resident_blocks, self._pull_layer_lazily)
        self._remember_weights()
        # The model's parameters the engine does not train (frozen at init):
        # one that gets gradients anyway was unfrozen later (see step()).
        trained = {id(p) for layer in self.layers for p in layer.params}
        self._untrained = [(name, p) for name, p in model.named_parameters()
                           if id(p) not in trained]
        self._delete_on_failure = False

    def _offloaded_state_dict(
            self, layer: Optional[Layer]) -> Callable[..., None]:
        """A state_dict post-hook for an offloaded block: between uses its
        parameters are empty placeholders, so the entries state_dict made
        of them are replaced by the weights themselves (host tensors: the
        daemon's current 16-bit weights, the frozen ones' host copies).
        model.state_dict(), torch.save and save_pretrained then see the
        model as it is, not the placeholders. `layer`: the block's trained
        parameters (None: it has only frozen ones)."""
        where = {} if layer is None else {
            id(param): (offset, shape) for param, offset, shape in zip(
                layer.params, layer.offsets, layer.shapes)}

        def hook(block: nn.Module, state: Dict[str, Any], prefix: str,
                 metadata: Any) -> None:
            if self._closed:
                return
            frozen = self._frozen.homes(block) if self._frozen else {}
            flat: Optional[torch.Tensor] = None
            for name, param in block.named_parameters(remove_duplicate=False):
                key = prefix + name
                if key not in state or param.numel() > 0:
                    continue  # not saved, or materialized: already right
                if id(param) in frozen:
                    state[key] = frozen[id(param)]
                    continue
                if id(param) not in where:
                    continue
                if self._in_iteration:
                    raise RuntimeError(
                        "lohan: state_dict() of a model with offloaded "
                        "block weights in the middle of a step (the daemon "
                        "is updating them); call it after engine.step()")
                if flat is None:
                    flat = self._residency.current_weights(layer)
                offset, shape = where[id(param)]
                state[key] = flat[offset:offset + shape.numel()].view(shape)
        return hook

    # ----------------------------------------------------------------- setup

    def _exempt_ranges(self, rule: Any,
                       grouped: Set[int]) -> List[Tuple[int, int, int]]:
        """(layer, begin, end) element ranges updated without weight decay:
        the parameters `rule` picks, but for those in a param group (whose
        own weight_decay holds). None: none (torch AdamW with one group);
        "1d": every parameter with fewer than 2 dimensions (biases, norm
        weights: the usual fine-tuning recipe); a callable(name, param) ->
        bool; or parameter names (any of a tied one's names)."""
        if rule is None:
            return []
        if rule == "1d":
            picks = lambda name, param: param.dim() < 2  # noqa: E731
        elif callable(rule):
            picks = rule
        elif isinstance(rule, str):
            raise ValueError(f"no_weight_decay={rule!r}: use None, '1d', a "
                             "callable(name, param) or a list of names")
        else:
            names = set(rule)
            aliases = {name: id(param) for name, param in
                       self.model.named_parameters(remove_duplicate=False)}
            unknown = sorted(names - set(aliases))
            if unknown:
                raise ValueError("no_weight_decay names parameters the model "
                                 f"does not have: {unknown[:5]}")
            chosen = {aliases[name] for name in names}
            picks = lambda name, param: id(param) in chosen  # noqa: E731
        return self._ranges_of(
            lambda name, param: id(param) not in grouped and picks(name, param))

    def _ranges_of(self, picks: Callable[[str, nn.Parameter], bool]
                   ) -> List[Tuple[int, int, int]]:
        """(layer, begin, end) element ranges of the trained parameters
        `picks` chooses, adjacent ones merged."""
        ranges: List[Tuple[int, int, int]] = []
        for layer in self.layers:
            for name, param, offset, size in zip(layer.names, layer.params,
                                                 layer.offsets, layer.sizes()):
                if not picks(name, param):
                    continue
                end = offset + size
                if ranges and ranges[-1][0] == layer.index and (
                        ranges[-1][2] == offset):
                    ranges[-1] = (layer.index, ranges[-1][1], end)
                else:
                    ranges.append((layer.index, offset, end))
        return ranges

    def _param_groups(self, groups: Any) -> List["_ParamGroup"]:
        """torch-style param groups, [{"params": [...], "lr": x,
        "weight_decay": y}, ...] (parameters or names): those parameters
        are trained with that lr and weight decay; the rest with lohan.init's.
        The daemon runs each group's lr as a fixed multiple of the job's
        (a schedule scales them all alike, as torch's schedulers do)."""
        if groups is None:
            return []
        if isinstance(groups, dict) or not isinstance(groups, (list, tuple)):
            raise TypeError("param_groups must be a list of dicts, as "
                            "torch.optim's")
        names = {id(p): name for layer in self.layers
                 for name, p in zip(layer.names, layer.params)}
        aliases = dict(self.model.named_parameters(remove_duplicate=False))
        owner: Dict[int, int] = {}
        result: List[_ParamGroup] = []
        for n, group in enumerate(groups):
            if not isinstance(group, dict) or "params" not in group:
                raise ValueError(f"param_groups[{n}] must be a dict with "
                                 "'params'")
            unsupported = sorted(set(group) - {"params", "lr", "weight_decay"})
            if unsupported:
                raise ValueError(
                    f"param_groups[{n}] sets {', '.join(unsupported)}: the "
                    "daemon runs one of each per job (give it to lohan.init); "
                    "a group may set only 'lr' and 'weight_decay'")
            params = group["params"]
            if isinstance(params, (torch.Tensor, str)):
                params = [params]
            ids = set()
            for item in params:
                param = aliases.get(item) if isinstance(item, str) else item
                if param is None:
                    raise ValueError(f"param_groups[{n}] names {item!r}, "
                                     "which the model does not have")
                if id(param) not in names:
                    raise ValueError(
                        f"param_groups[{n}] holds a parameter the engine does "
                        "not train (frozen, or not this model's)")
                if owner.setdefault(id(param), n) != n:
                    raise ValueError(
                        f"param_groups[{owner[id(param)]}] and [{n}] both "
                        f"hold {names[id(param)]}")
                ids.add(id(param))
            lr = float(group.get("lr", self.lr))
            wd = float(group.get("weight_decay", self.weight_decay))
            if not (lr >= 0 and math.isfinite(lr)) or not (
                    wd >= 0 and math.isfinite(wd)):
                raise ValueError(f"param_groups[{n}]: lr {lr} and "
                                 f"weight_decay {wd} must be finite and >= 0")
            if self.lr == 0 and lr != 0:
                raise ValueError(
                    f"param_groups[{n}] has lr {lr} but lohan.init's lr is 0: "
                    "a group runs at a fixed multiple of the job's lr")
            result.append(_ParamGroup(
                ids=ids, lr=lr, weight_decay=wd,
                lr_scale=lr / self.lr if self.lr > 0 else 1.0,
                ranges=self._ranges_of(
                    lambda name, param, ids=ids: id(param) in ids)))
        return result

    def _warn_untrained_gradients(self) -> None:
        """A parameter unfrozen after lohan.init gets gradients that no one
        applies (and that pile up): say so, once."""
        stray = [name for name, p in self._untrained if p.grad is not None]
        if stray:
            self._untrained = []  # said once
            warnings.warn(
                f"lohan: {', '.join(stray[:3])}{' ...' if len(stray) > 3 else ''}"
                " got gradients but the engine does not train them (they "
                "were frozen when lohan.init ran); to train them, close the "
                "engine and call lohan.init again", stacklevel=3)

    def _remember_weights(self) -> None:
        """The version counters of the model's resident trained parameters
        now: one changed behind the engine's back (load_state_dict, an
        in-place init) would be silently overwritten at the next step by
        the daemon's weights, so the next step refuses it."""
        offloaded = ({layer.index for layer in self._residency.layers}
                     if self._residency is not None else set())
        self._versions = {id(param): (name, param, param._version)
                          for layer in self.layers
                          if layer.index not in offloaded
                          for name, param in zip(layer.names, layer.params)}

    def _check_weights_unchanged(self,
                                 layer: Optional[Layer] = None) -> None:
        """All resident trained parameters, or `layer`'s."""
        entries = (self._versions.values() if layer is None else
                   [self._versions[id(p)] for p in layer.params])
        changed = [name for name, param, version in entries
                   if param._version != version]
        if changed:
            raise RuntimeError(
                "lohan: the model's weights were changed in place since the "
                f"last step ({', '.join(changed[:3])}"
                f"{' ...' if len(changed) > 3 else ''}: load_state_dict, "
                "an init function?); the daemon holds the weights it trains "
                "and would overwrite them. To train from other weights, "
                "close this engine and call lohan.init again (or pass "
                "resume=<checkpoint directory>)")

    def _check_optimizer_groups(self, groups: List[Dict[str, Any]]) -> None:
        """What a scheduler or the user set in engine.optimizer's groups
        must be what the daemon runs: the lr of group 0 drives the job, the
        others keep their ratio to it; betas, eps and weight decay are the
        job's."""
        expected_decay = [self.weight_decay] + [
            g.weight_decay for g in self._groups]
        for n, group in enumerate(groups):
            for key, have, want in (
                    ("betas", tuple(group["betas"]), self.betas),
                    ("eps", group["eps"], self.eps),
                    ("weight_decay", group["weight_decay"],
                     expected_decay[n])):
                if have != want:
                    raise RuntimeError(
                        f"lohan: engine.optimizer's param group {n} has "
                        f"{key} {have}, but the daemon runs {want} for the "
                        "whole job (given to lohan.init); a scheduler that "
                        "cycles momentum needs that off (OneCycleLR("
                        "cycle_momentum=False))")
            if n == 0:
                continue
            want_lr = self.lr * self._groups[n - 1].lr_scale
            if not math.isclose(group["lr"], want_lr, rel_tol=1e-9,
                                abs_tol=1e-300):
                raise RuntimeError(
                    f"lohan: engine.optimizer's param group {n} has lr "
                    f"{group['lr']}, not {want_lr} (its lr_scale "
                    f"{self._groups[n - 1].lr_scale} of group 0's "
                    f"{self.lr}): the daemon keeps each group's lr a fixed "
                    "multiple of the job's, as schedulers that scale every "
                    "group alike do")

    def _open_job_with_buffers(self, client: Client, resume: bool,
                               buffers: str, stream_buffers: int,
                               elements: List[int], element_bytes: int,
                               area_bytes: int) -> Tuple[Any, Callable]:
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
            return self._open_job(client, True, 0), by_arena
        if buffers == "streamed" and streamed:
            return (self._open_job(client, False, streamed_bytes),
                    lambda arena: streamed)
        if buffers == "resident" or not streamed:
            return (self._open_job(client, False, resident_bytes),
                    lambda arena: 0)
        try:
            return (self._open_job(client, False, resident_bytes),
                    lambda arena: 0)
        except LohanError as error:
            if error.code != StatusCode.RESOURCE_EXHAUSTED:
                raise
            refusal = error
        # The most shared buffers (up to stream_buffers) the pool holds.
        for count in range(streamed, 0, -1):
            need = host_pool_bytes(elements, element_bytes, area_bytes, count)
            try:
                job = self._open_job(client, False, need)
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
                stacklevel=4)
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

    def _open_job(self, client: Client, resume: bool, pool_bytes: int) -> Any:
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
            self._delete_on_failure = True
            return job
        except LohanError as error:
            if error.code == StatusCode.ALREADY_EXISTS:
                raise LohanError(
                    error.code,
                    f"{error.message} (a job named {self.job_name!r} exists: "
                    "pass resume=True to continue it, or another job_name)"
                ) from None
            raise

    @staticmethod
    def _open_data_plane(client: Client, job_id: str) -> Any:
        # The daemon frees a job's arena when it sees the previous data
        # plane's connection close; a quick reopen can race it.
        deadline = time.monotonic() + _ARENA_RETURN_SECONDS
        while True:
            try:
                return client.open_data_plane(job_id)
            except LohanError as error:
                if (error.code != StatusCode.ALREADY_EXISTS
                        or time.monotonic() > deadline):
                    raise
            time.sleep(0.01)

    def _setup_cuda(self) -> bool:
        """For a model on a GPU: pins the arena for DMA and lets the C
        library copy gradients out on torch's stream. False (plain tensor
        copies, synchronous) for a CPU model, or when the library cannot
        use CUDA here (the reason is warned once)."""
        if self.device.type != "cuda":
            return False
        available, reason = self._remote.cuda_available()
        if not available:
            warnings.warn(f"lohan: the model is on a GPU but liblohan_client "
                          f"cannot use CUDA ({reason}); gradients and "
                          "weights move by synchronous tensor copies",
                          stacklevel=3)
            return False
        # On the model's device, whatever torch's current device is (a job
        # on cuda:N without torch.cuda.set_device must put nothing on GPU 0):
        # the C library switches to it for the call and back.
        self._plane.cuda_register(device=self.device.index)
        return True

    def _stage_params(self, layer: Layer) -> None:
        """The layer's parameters as fp32 into the staging slot, each
        straight into its place (no flat copy of the layer: the largest,
        an embedding, can be hundreds of MB)."""
        for param, offset in zip(layer.params, layer.offsets):
            self._staging[offset:offset + param.numel()].copy_(
                param.detach().reshape(-1))

    def _load_or_init(self) -> None:
        """Layer by layer (no whole-model copy): a stored layer's weights
        come from the daemon; a new one's fp32 masters are the model's
        current values, taken before the parameters are converted to the
        training dtype, or the checkpoint's (resume=<directory>)."""
        if self._checkpoint is not None:
            self._load_checkpoint(self._checkpoint)
            return
        progress = Progress("loading the job's weights" if self.iteration
                            else "writing the initial states",
                            len(self.layers),
                            sum(layer.numel for layer in self.layers))
        for layer in self.layers:
            index = layer.index
            if self._remote.layer_initialized(index):
                self._convert(layer)
                self._remote.read_weights(index)
                self._copy_into_params(layer, self._staging)
                progress.advance(layer.numel)
                continue
            if self.iteration > 0:
                raise LohanError(
                    StatusCode.DATA_LOSS,
                    f"job {self.job_name!r} is at iteration {self.iteration} "
                    f"but has no weights for layer {index}; it cannot be "
                    "resumed")
            self._stage_params(layer)
            self._remote.init_weights(index)
            self._convert(layer)
            if self.dtype != torch.float32:
                self._copy_fetched_into_params(layer)
            progress.advance(layer.numel)
        progress.done()

    def _load_checkpoint(self, checkpoint: CheckpointReader) -> None:
        """A new job's states from a checkpoint, layer by layer: the fp32
        masters (also into the model), then the moments it has."""
        aliases = parameter_aliases(self.model)
        parts = [p for p in checkpoint.moments
                 if p != "max_exp_avg_sq" or self._amsgrad]

        def stage(layer: Layer, part: str) -> None:
            """The checkpoint's `part` of the layer into the staging slot,
            tensor by tensor."""
            for name, param, shape, offset in zip(layer.names, layer.params,
                                                  layer.shapes, layer.offsets):
                found = checkpoint.find(aliases.get(id(param), [name]), part)
                if found is None:
                    raise LohanError(
                        StatusCode.NOT_FOUND,
                        f"{checkpoint.path}: no {part} for parameter {name} "
                        "(the checkpoint is of another model?)")
                if tuple(found.shape) != tuple(shape):
                    raise LohanError(
                        StatusCode.INVALID_ARGUMENT,
                        f"{checkpoint.path}: {name} ({part}) has shape "
                        f"{tuple(found.shape)}, the model's {tuple(shape)}")
                self._staging[offset:offset + shape.numel()].copy_(
                    found.reshape(-1))

        progress = Progress(f"resuming from {checkpoint.path}",
                            len(self.layers),
                            sum(layer.numel for layer in self.layers))
        for layer in self.layers:
            index = layer.index
            if self._remote.layer_initialized(index):
                raise LohanError(
                    StatusCode.FAILED_PRECONDITION,
                    f"job {self.job_name!r} has states already; resume from "
                    "a checkpoint starts a new job (pass another job_name, "
                    "or resume=True to continue this one)")
            stage(layer, "weights")
            self._remote.init_weights(index)
            self._convert(layer)
            if self.dtype == torch.float32:
                self._copy_into_params(layer, self._staging)
            else:
                self._copy_fetched_into_params(layer)
            for part in parts:
                stage(layer, part)
                self._remote.init_state(index, part)
            progress.advance(layer.numel)
        progress.done()

    def _convert(self, layer: Layer) -> None:
        for param in layer.params:
            if param.dtype != self.dtype:
                param.data = param.data.to(self.dtype)

    def _copy_fetched_into_params(self, layer: Layer) -> None:
        """The layer's new weights (16-bit, or the fp32 masters), as the
        daemon wrote them into its weight buffer, into the model. Fetched
        first: a streamed buffer is shared by several layers (the daemon
        reads it from its SSDs), and a resident one may still be waiting
        for its update (the daemon answers once the layer's update is
        done)."""
        self._remote.fetch_params(layer.index)
        self._copy_into_params(layer, self._weight_views[layer.index])

    @staticmethod
    def _copy_into_params(layer: Layer, flat: torch.Tensor) -> None:
        with torch.no_grad():
            for param, offset, shape in zip(layer.params, layer.offsets,
                                            layer.shapes):
                param.copy_(flat[offset:offset + shape.numel()].view(shape))

    # -------------------------------------------------------------- training

    def _begin_iteration(self) -> None:
        self._check_weights_unchanged()
        if self._lazy is not None:
            self._lazy.pull_all()  # blocks this step's forward did not run
        if self._optimizer is not None:
            # An LR scheduler sets the rate in the optimizer's group, and
            # the iteration (which carries it) begins during backward.
            groups = self._optimizer.param_groups
            self.lr = float(groups[0]["lr"])
            self._check_optimizer_groups(groups)
        # Gradients of a loss scaled by engine.backward come back to scale 1
        # in the daemon, exactly (the scale is a power of two).
        try:
            self._remote.iter_begin(
                grad_scale=(1.0 / self.loss_scale
                            if self._scaled_backward else 1.0),
                lr=self.lr)
        except BaseException:
            # No step began (the daemon is gone, say): what this backward
            # handed over so far is lost with it, and the next backward
            # must start clean rather than find layers "handed over".
            self._router.reset()
            self._scaled_backward = False
            raise
        self._in_iteration = True

    def _claim_grad_buffer(self, layer: int) -> None:
        ticket = self._buffer_tickets.pop(
            self._grad_views[layer].data_ptr(), None)
        if ticket is not None:
            self._remote.wait(ticket)

    def _grad_ready(self, layer: int) -> None:
        """The layer's gradient is in its slot: tell the daemon without
        waiting (its update starts while backward goes on)."""
        if not self._in_iteration:
            self._begin_iteration()
        self._buffer_tickets[self._grad_views[layer].data_ptr()] = (
            self._remote.submit_grad_ready(layer))

    def _take_grad_tickets(self) -> List[int]:
        """Every GRAD_READY of this step not waited for yet (from host
        buffers and from GPU copies); the engine forgets them."""
        tickets = self._grad_tickets + list(self._buffer_tickets.values())
        self._grad_tickets, self._buffer_tickets = [], {}
        return tickets

    def _device_grad_ready(self, layer: int, flat: torch.Tensor) -> None:
        """`flat`: the layer's gradients back to back on the GPU. The copy
        into the layer's slot runs on the outbound copy stream once the
        compute stream has produced them, so backward's next kernels do
        not wait for it; the C library posts GRAD_READY from a host
        function once it is done, so the Python thread goes on at once."""
        if not self._in_iteration:
            self._begin_iteration()
        side = copy_stream(flat.device, outbound=True)
        # Everything queued on the compute stream so far comes first: the
        # gradients, and the waits for this layer's weight copies out of
        # the arena (the update that follows GRAD_READY rewrites them).
        side.wait_stream(torch.cuda.current_stream(flat.device))
        # Its memory must not be reused before the copy has read it.
        flat.record_stream(side)
        # The device named, so the C library neither probes the pointer
        # nor leaves another device current on this thread.
        self._grad_tickets.append(self._remote.grad_ready_from_device(
            layer, flat.data_ptr(), flat.numel() * flat.element_size(),
            side.cuda_stream, device=flat.device.index))

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """`loss.backward(**kwargs)`, with the loss multiplied by
        `loss_scale` first (fp16 loss scaling; 1 otherwise); gradients go to
        the daemon as they come. With loss scaling, call this rather than
        loss.backward(), as with torch's GradScaler."""
        self._check_open()
        if self.loss_scale != 1.0:
            loss = self.scale_loss(loss)
        loss.backward(**kwargs)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times loss_scale, for a backward the caller runs itself
        (a framework's): the daemon unscales this step's gradients."""
        self._scaled_backward = True
        return loss * self.loss_scale

    def step(self) -> Optional[StepResult]:
        """Ends the iteration: hands over any layer still holding gradients,
        waits for the daemon (clipping and skips happen here), and puts the
        new weights into the model. A step with no gradients is a no-op
        (returns None), as torch.optim's."""
        self._check_open()
        router = self._router
        self._warn_untrained_gradients()
        if not router.any_gradient():
            return None
        router.flush()  # on an error here the iteration stays open
        # GRAD_READYs posted from CUDA host functions must reach the daemon
        # before ITER_END does.
        tickets = self._take_grad_tickets()
        try:
            for ticket in tickets:
                self._remote.wait(ticket)
        except BaseException:
            # The iteration cannot end well: abandon it (the daemon rolls
            # back what it ran) so that the next step starts clean; the
            # error raised is the first one.
            for ticket in tickets:
                try:
                    self._remote.wait(ticket, timeout=0)
                except LohanError:
                    pass
            try:
                self.discard_step()
            except LohanError:
                pass  # the daemon is gone: this side is clean all the same
            raise
        if self._activations is not None:
            self._activations.drain()  # an activation put's error lands here
        try:
            norm, clipped, skipped = self._remote.iter_end()
        finally:
            # On an error the daemon rolled the iteration back: the model
            # still holds the committed weights.
            self._in_iteration = False
            self._scaled_backward = False
            router.reset()
        if not skipped:
            self.iteration += 1
        if self._dynamic_scale:
            if skipped:
                self.loss_scale = max(self.loss_scale / 2.0, 1.0)
                self._good_steps = 0
            else:
                self._good_steps += 1
                if self._good_steps >= self._growth_interval:
                    self.loss_scale *= 2.0
                    self._good_steps = 0
        self._pull_weights()
        if self._activations is not None:
            self._activations.sweep()
        if self._auto is not None and self._auto.waiting:
            self._auto.after_step(
                self._client, self._job.id,
                sizes_of(self.model, self.blocks, self.layers))
        self.last = StepResult(float(norm), bool(clipped), bool(skipped),
                               self.iteration)
        if self._optimizer is not None:
            # engine.step() is the optimizer's step: torch's LR schedulers
            # look for this mark (set by a wrapper around
            # optimizer.step) and warn that step() was never called.
            self._optimizer._opt_called = True
        return self.last

    def _pull_weights(self) -> None:
        if self._residency is not None:
            # Offloaded blocks fetch their new weights when they next run.
            self._residency.release_all()
            self._residency.new_step()
            self._frozen.release_all()
        for layer in self.layers:
            if self._residency is not None and layer.block is not None and (
                    self._residency.layer_of(layer.block) is layer):
                continue
            if self._lazy is not None and layer in self._lazy:
                continue  # copied just before its block next runs
            self._copy_fetched_into_params(layer)
        if self._lazy is not None:
            self._lazy.mark_stale()
        self._remember_weights()


    def _pull_layer_lazily(self, layer: Layer) -> None:
        # Changed in place since step() (load_state_dict): refused, as at
        # the next step, rather than overwritten.
        self._check_weights_unchanged(layer)
        self._copy_fetched_into_params(layer)
        for name, param in zip(layer.names, layer.params):
            self._versions[id(param)] = (name, param, param._version)

    def sync_weights(self) -> None:
        """With overlap_step=True: brings every block's parameters up to
        date now (each waits for its update), for code that reads them
        between step() and the next forward. A no-op otherwise."""
        self._check_open()
        if self._lazy is not None:
            self._lazy.pull_all()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients are cleared as they are handed over; this clears any
        not handed over yet (an abandoned accumulation). In the middle of
        a step (a backward that raised half-way, say) it also discards what
        the daemon got of this step: the updates it ran are rolled back and
        the step does not count, as torch's zero_grad() throws away partial
        gradients."""
        self._check_open()
        if self._in_iteration:
            self.discard_step()
        self._router.reset()
        self.model.zero_grad(set_to_none=set_to_none)

    def discard_step(self) -> None:
        """Throws away the step in progress: the gradients handed over so
        far and the updates the daemon ran with them (rolled back; weights,
        moments and step count as after the last step()). A no-op between
        steps."""
        self._check_open()
        for ticket in self._take_grad_tickets():
            try:
                self._remote.wait(ticket)
            except LohanError:
                pass  # the step is being thrown away
        refused: Optional[LohanError] = None
        if self._in_iteration:
            try:
                self._remote.iter_abort()
            except LohanError as error:
                refused = error  # raised once this side is clean
            finally:
                self._in_iteration = False
                self._scaled_backward = False
        # What backward accumulated and had not handed over yet goes too
        # (a micro-batch of an accumulation, the layers a failed backward
        # reached).
        self._router.reset()
        for layer in self.layers:
            for param in layer.params:
                param.grad = None
        if self._residency is not None:
            self._residency.release_all()
            self._frozen.release_all()
        if self._activations is not None:
            try:
                self._activations.drain()
            except LohanError:
                pass
            self._activations.sweep()
        # The model's resident parameters are written at step() only, and
        # the daemon put the committed 16-bit weights back in the arena:
        # nothing to copy.
        if refused is not None:
            raise refused

    @property
    def activation_plan(self) -> Optional[Dict[str, Any]]:
        """With activations="auto": lohand's plan (JobPlan as JSON) once
        the first iteration has profiled, else None."""
        return self._auto.plan if self._auto is not None else None

    @property
    def optimizer(self) -> "torch.optim.Optimizer":
        """This engine as a torch.optim.Optimizer (see optimizer.py): hand
        it to an LR scheduler or a training loop that wants one."""
        if self._optimizer is None:
            from lohan.optimizer import LohanOptimizer
            self._optimizer = LohanOptimizer(self)
        return self._optimizer

    @property
    def activation_stats(self) -> ActivationStats:
        """Block inputs offloaded so far ("offload" policy; zeros
        otherwise): puts and bytes held in host memory and on the SSDs."""
        if self._activations is None:
            return ActivationStats()
        self._activations.sweep()
        return self._activations.stats

    # ---------------------------------------------------------- checkpoints

    def master_weights(self) -> Dict[str, torch.Tensor]:
        """The committed fp32 master weights, by parameter name (read from
        the daemon; between steps only)."""
        self._check_open()
        if self._in_iteration:
            raise RuntimeError("lohan: the master weights can be read only "
                               "between steps; call engine.step() first")
        weights: Dict[str, torch.Tensor] = {}
        for layer in self.layers:
            self._remote.read_weights(layer.index)
            for name, offset, shape in zip(layer.names, layer.offsets,
                                           layer.shapes):
                weights[name] = (self._staging[offset:offset + shape.numel()]
                                 .clone().view(shape))
        return weights

    def save(self, directory: Union[str, os.PathLike],
             optimizer_state: bool = False) -> str:
        """Writes `directory/model.safetensors` (the fp32 master weights by
        parameter name), with `optimizer_state=True` also
        `directory/optimizer.safetensors` (the Adam moments), and
        `directory/lohan.json`; returns the weights file's path. Layer by
        layer: memory holds one layer at a time. Continue from it with
        lohan.init(model, ..., resume=directory) (with the optimizer state,
        exactly where this run is), or from the daemon's job itself with
        resume=True. Between steps only."""
        self._check_open()
        if self._in_iteration:
            raise RuntimeError("lohan: save() in the middle of a step; call "
                               "engine.step() first")
        parts = ["weights"]
        if optimizer_state:
            parts += ["exp_avg", "exp_avg_sq"]
            if self._amsgrad:
                parts.append("max_exp_avg_sq")

        progress = Progress(f"saving to {directory}",
                            len(self.layers) * len(parts),
                            sum(layer.numel for layer in self.layers) *
                            len(parts))

        def read_layer(layer: Layer, part: str) -> torch.Tensor:
            if part == "weights":
                self._remote.read_weights(layer.index)
            else:
                self._remote.read_state(layer.index, part)
            progress.advance(layer.numel)
            return self._staging[:layer.numel]

        path = write_checkpoint(directory, self.layers, read_layer, parts, {
            "job_name": self.job_name,
            "job_id": self._job.id,
            "iteration": self.iteration,
            "dtype": WIRE_NAMES[self.dtype],
            "layers": [layer.names for layer in self.layers],
            "adam": {"lr": self.lr, "amsgrad": self._amsgrad},
            "loss_scaling": {"scale": self.loss_scale,
                             "good_steps": self._good_steps,
                             "dynamic": self._dynamic_scale},
        })
        progress.done()
        return path

    # ------------------------------------------------------------- teardown

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("lohan: this engine is closed")

    def _settle_device_copies(self, timeout: float = 60.0) -> None:
        """Before the arena is unpinned and unmapped: lets every gradient
        copy from a GPU land and its GRAD_READY go out (a step cut short
        by an exception in backward leaves some in flight)."""
        if getattr(self, "_cuda", False):  # close() of a half-made engine
            try:
                torch.cuda.synchronize(self.device)
            except RuntimeError:
                pass  # a broken context copies nothing any more
        if getattr(self, "_remote", None) is None:
            return
        for ticket in self._take_grad_tickets():
            try:
                self._remote.wait(ticket, timeout=timeout)
            except LohanError:
                pass  # failed, the daemon is gone, or never to be posted

    def close(self, delete_job: bool = False) -> None:
        """Removes the hooks and detaches from the job (its states stay with
        the daemon for a resume; with `delete_job=True` the job and its
        states are deleted, for a run whose checkpoints are elsewhere). An
        unfinished step is rolled back."""
        if self._closed:
            return
        self._delete_job_on_close = delete_job
        if self._lazy is not None:
            # The model goes back trained; a block that cannot be brought
            # up to date keeps what it has, with a word.
            for layer in self._lazy.stale():
                try:
                    self._lazy.pull(layer)
                except (LohanError, RuntimeError) as error:
                    warnings.warn(
                        f"lohan: block layer {layer.index} keeps the weights "
                        f"it has, not its last step's: {error}. The trained "
                        "weights are with the daemon's job (lohan.init(..., "
                        "resume=True)) or in your last engine.save()",
                        stacklevel=2)
            self._lazy.remove()
            self._lazy = None
        self._closed = True
        self._settle_device_copies()
        for handle in getattr(self, "_state_dict_hooks", []):
            handle.remove()
        # The model goes back where it was given (a model larger than the
        # GPU: to the CPU), with the weights trained.
        home = getattr(self, "_home_device", None)
        if self._frozen is not None:
            self._frozen.restore_all(home)
            self._frozen = None
        if self._residency is not None:
            try:
                self._residency.restore_all(home)  # before the arena goes
            except LohanError as error:
                warnings.warn(
                    "lohan: the daemon could not give the offloaded blocks "
                    f"their weights back ({error}); they keep empty "
                    "placeholders. Their trained weights are with the "
                    "daemon's job (restart it and lohan.init(..., "
                    "resume=True)) or in your last engine.save()",
                    stacklevel=2)
            self._residency = None
        self._uninstall_activations()
        if getattr(self, "_auto", None) is not None:
            self._auto.close()
        if home is not None and _normalized(home) != self.device:
            self.model.to(home)
        if self._activations is not None:
            self._activations.close()
        if self._router is not None:
            self._router.remove()
        # Views into the arena must go before it is unmapped.
        self._grad_views = self._weight_views = []
        self._staging = None
        self._remote = None
        if self._plane is not None:
            self._plane.close()
            self._plane = None
            if self._client is not None and self._job is not None:
                self._wait_for_arena_return()
        if self._client is not None:
            if self._job is not None:
                try:
                    self._client.detach_job(self._job.id)
                    if self._delete_on_failure or getattr(
                            self, "_delete_job_on_close", False):
                        self._client.delete_job(self._job.id)
                except LohanError:
                    pass  # not attached, or the daemon is gone
            self._client.close()
            self._client = None

    def _wait_for_arena_return(self) -> None:
        """So that the job can be reopened as soon as close() returns."""
        deadline = time.monotonic() + _ARENA_RETURN_SECONDS
        try:
            while time.monotonic() < deadline:
                arenas = self._client.status().get("pool", {}).get(
                    "arenas", [])
                if all(a.get("job_id") != self._job.id for a in arenas):
                    return
                time.sleep(0.01)
        except LohanError:
            pass  # the daemon is gone: nothing to wait for

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def init(model: nn.Module, **options: Any) -> Engine:
    """Hands `model`'s optimizer to lohand and returns the Engine. Options
    (docs/pytorch.md explains each): device, frozen_host_bytes, lr, betas,
    eps, weight_decay,
    no_weight_decay, param_groups, max_grad_norm, adamw, amsgrad, bf16_moments,
    skip_nonfinite, clip_schedule, overlap_step, service, dtype, loss_scale,
    loss_scale_growth_interval, initial_loss_scale,
    grad_accumulation_steps, blocks, activations, activation_host_bytes,
    activation_buffer_bytes, device_memory_bytes, params, buffers, stream_buffers,
    chunk_elements, socket, job_name, resume (True: this user's job of that
    name on the daemon; a directory: a checkpoint from engine.save)."""
    return Engine(model, **options)
