"""The training engine: `engine = lohan.init(model, ...)`, then per step
`loss.backward()` (or `engine.backward(loss)`) and `engine.step()`.

The daemon keeps the fp32 master weights and the Adam moments; this process
keeps only the model's working copy of the weights (fp32, or bf16/fp16). A
step hands each layer's gradients over as backward produces them (see
hooks.py), `step()` waits for the daemon to finish the iteration (exact
global-norm clipping and non-finite skips happen there) and copies the new
weights into the model's parameters.

The Engine puts together: options.py (lohan.init's options, checked),
placement.py (device, layers, dtype), groups.py (param groups), job.py
(the job and its arena), weights.py (the model's weights beside the
daemon's, checkpoints), iteration.py (the step in progress) and
share_move.py (the arena lohand moves the job to between steps).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
import warnings
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, ContextManager, Dict,
                    FrozenSet, List, Mapping, Optional, Union)

import torch
from torch import nn

from lohan import activations as lohan_activations
from lohan.activation_store import ActivationStats, ActivationStore
from lohan.activations import BlockPasses
from lohan.activations import install as install_activation_policy
from lohan.activations import uses_store
from lohan.auto_plan import AutoPlan, sizes_of
from lohan import causal_lm
from lohan.blocks import Layer, WIRE_NAMES, describe
from lohan.checkpoint import CheckpointReader
from lohan.client import DistributedRun, Job, LohanError, Model
from lohan.groups import (ParamGroup, check_optimizer_groups, exemptions,
                          param_groups)
from lohan.hooks import GradientRouter, has_lohan_hook
from lohan.iteration import Iteration, loss_scaling
from lohan.job import JobSession, model_spec
from lohan.options import MIB, ActivationsArg, EngineOptions
from lohan.params import Both, FrozenWeights, ParameterResidency
from lohan.placement import Placement, normalized, place
from lohan.rank_commits import rejoin_point, release_kept
from lohan.sharding import (RankFailure, Sharding, backward_order,
                            process_group_of)
from lohan.pretrained import replace_directory, save_model
from lohan.saved_tensors import SavedTensors
from lohan.share_move import (ArenaRecord, MovingParts, follow_share,
                              move_message, status_of)
from lohan.starting_weights import (MetaHome, StoredNames, inner_model,
                                    is_on_meta, materialize)
from lohan.weights import Weights, open_checkpoint

if TYPE_CHECKING:
    from lohan.optimizer import LohanOptimizer

__all__ = ["Engine", "EngineOptions", "StepResult", "init"]

# Importable from lohan.engine too.
_MIB = MIB
_normalized = normalized
_ParamGroup = ParamGroup


@dataclass(frozen=True)
class StepResult:
    """What the daemon reported for one optimizer step."""

    global_norm: float  # before clipping, over every layer
    clipped: bool       # the update used max_grad_norm / norm
    skipped: bool       # a non-finite gradient: no update, weights unchanged
    iteration: int      # committed steps after this one


def _checked_options(model: nn.Module,
                     options: Mapping[str, object]) -> EngineOptions:
    """TypeError for a model that is not an nn.Module or an unknown
    option; the options' own errors (options.py); RuntimeError for a
    model another open engine drives."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"lohan.init wants an nn.Module, got "
                        f"{type(model).__name__}")
    known = EngineOptions.names()
    for name in options:
        if name not in known:
            raise TypeError("Engine.__init__() got an unexpected keyword "
                            f"argument {name!r}")
    checked = EngineOptions(**options)
    if any(has_lohan_hook(p) for p in model.parameters()):
        raise RuntimeError(
            f"lohan: this {type(model).__name__} is driven by an open "
            "engine already (its hooks would hand every gradient over "
            "twice); call that engine's close() first")
    return checked


class Engine:
    """Trains `model` with Adam/AdamW run by lohand. Build it with
    lohan.init() (its options: options.EngineOptions). Not thread-safe:
    one training loop drives it."""

    def __init__(self, model: nn.Module, **options: object) -> None:
        opts = _checked_options(model, options)
        self._start(model, opts)
        where = place(model, opts)
        self._adopt(where)
        self._shard_across_ranks(opts)
        self._checkpoint = open_checkpoint(opts.resume, opts.weights)
        # weights=PATH: the checkpoint is checked against the model before
        # any job is made.
        stored = (StoredNames(model, self._checkpoint)
                  if opts.weights is not None else None)
        self._saved_dtype = stored.dtype if stored is not None else None
        stand_ins: FrozenSet[int] = frozenset()
        if is_on_meta(model):
            self._meta_home = MetaHome(model)
            try:
                stand_ins = frozenset(materialize(model, where, stored))
            except BaseException:
                self._meta_home.give_back()
                raise
        elif self.params_mode == "resident" and where.moves_to_device:
            model.to(self.device)  # all of it: asked for resident weights
        requests, self._groups = param_groups(
            model, self.layers, opts.param_groups, self.lr, self.weight_decay)
        description = {**describe(model, self.layers),
                       **exemptions(self.layers, opts.no_weight_decay),
                       "param_groups": requests}
        try:
            self._open_job(opts, where, description, stored, stand_ins)
        except BaseException:
            self.close()
            raise
        self._start_iterations(opts, where)
        if self.params_mode == "offload":
            try:
                self._weights.offload(self.blocks, self.device,
                                      opts.frozen_host_bytes,
                                      self._activations,
                                      lambda: self._in_iteration)
                self._iteration.router.reached_in_call = (
                    self._residency.gradients_taken)
            except BaseException:
                self.close()
                raise
        self._install_activations(opts, where.first_activations)
        if opts.overlap_step:
            self._weights.overlap_steps()
        self._weights.remember()
        self._loss = causal_lm.install(model, opts.chunked_loss,
                                       opts.loss_chunk_tokens)
        # The model's parameters the engine does not train (frozen at init):
        # one that gets gradients anyway was unfrozen later (see step()).
        trained = {id(p) for layer in self.layers for p in layer.params}
        self._untrained = [(name, p) for name, p in model.named_parameters()
                           if id(p) not in trained]
        self._session.delete_on_failure = False

    # ----------------------------------------------------------------- setup

    def _start(self, model: nn.Module, opts: EngineOptions) -> None:
        """The settings given, and every part not made yet (close() takes
        down what was made)."""
        self.model = model
        # The learning rate of the next step; set it every step to follow a
        # schedule (engine.lr = scheduler_value), as with param_groups.
        self.lr = opts.lr
        self.betas = opts.betas
        self.eps = opts.eps
        self.weight_decay = opts.weight_decay
        self.grad_accumulation_steps = opts.grad_accumulation_steps
        self._amsgrad = bool(opts.amsgrad)
        self.job_name = (opts.job_name
                         or f"{type(model).__name__[:48]}-{os.getpid()}")
        self.last: Optional[StepResult] = None
        self._closed = False
        self._optimizer: Optional[LohanOptimizer] = None
        self._home_device: Optional[torch.device] = None
        self._checkpoint: Optional[CheckpointReader] = None
        self._session: Optional[JobSession] = None
        # The job's arena: what it asks for, the moves lohand asked.
        self._arena: Optional[ArenaRecord] = None
        self._weights: Optional[Weights] = None
        self._iteration: Optional[Iteration] = None
        self._activations: Optional[ActivationStore] = None
        self._auto: Optional[AutoPlan] = None
        self._sharding: Optional[Sharding] = None
        # The run this rank's job is one rank of (None: not data-parallel).
        self._run: Optional[DistributedRun] = None
        self._uninstall_activations: Callable[[], None] = lambda: None
        self._loss = causal_lm.Installed()
        # A model given on the meta device goes back there at close.
        self._meta_home: Optional[MetaHome] = None
        # The dtype of the checkpoint weights= loaded (save_pretrained's).
        self._saved_dtype: Optional[torch.dtype] = None

    def _adopt(self, where: Placement) -> None:
        # Where the model computes, and where its parameters were given
        # (close() gives the model back there).
        self._home_device = where.home_device
        self.device = where.device
        self.blocks = where.blocks
        self.layers: List[Layer] = where.layers
        self.dtype: torch.dtype = where.dtype
        self.params_mode = where.params_mode
        self._sublayers = where.sublayers

    def _shard_across_ranks(self, opts: EngineOptions) -> None:
        """Data-parallel ranks (torch.distributed, see sharding.py): this
        rank's job holds a shard of every layer, named after the rank, and
        is that rank of the distributed run named job_name (JobSpec.run:
        lohanctl shows the ranks' jobs as one run)."""
        group = process_group_of(opts.process_group)
        if group is None:
            return
        self._sharding = Sharding(group, self.layers, self.device)
        suffix = f".rank{self._sharding.rank}"
        run_name = self.job_name[:64 - len(suffix)]
        self._run = DistributedRun(name=run_name, rank=self._sharding.rank,
                                   world_size=self._sharding.world)
        self.job_name = run_name + suffix

    @property
    def rank(self) -> int:
        """This process's rank among the data-parallel ranks (0 alone)."""
        return self._sharding.rank if self._sharding else 0

    @property
    def world_size(self) -> int:
        """Data-parallel ranks sharing the optimizer states (1 alone)."""
        return self._sharding.world if self._sharding else 1

    def _open_job(self, opts: EngineOptions, where: Placement,
                  description: Dict[str, Any],
                  stored: Optional[StoredNames],
                  stand_ins: FrozenSet[int]) -> None:
        """The job with its arena and the model registered, the first
        states written or read, the model in the training dtype.
        `description`: the model and its groups (ModelDescription);
        `stored`: the checkpoint's names of the parameters (weights=);
        `stand_ins`: the parameters holding no values (materialize)."""
        self._session = session = JobSession(opts.socket, self.job_name,
                                                 self._run)
        self._weights = Weights(self.model, self.layers, self.dtype, session,
                                self._checkpoint, self._amsgrad,
                                self.job_name, self._sharding, stored,
                                stand_ins)
        # resume=True continues this user's job of that name on the daemon;
        # resume=<directory> starts a new job from a checkpoint (weights,
        # and the Adam moments and step when it has them).
        checkpoint = self._checkpoint
        spec = model_spec(
            opts, description, len(self.layers), self.dtype,
            where.area_bytes,
            initial_iteration=(
                checkpoint.iteration
                if checkpoint is not None and checkpoint.moments else 0),
            sharding=self._sharding)
        session.open(opts.resume is True, spec)
        self._arena = ArenaRecord(
            session.sizing.arena_bytes if session.sizing is not None
            else session.arena_bytes)
        remote = session.register(spec, self.layers, self.dtype)
        if self._sharding is not None and opts.resume is True and (
                rejoin_point(self._sharding, remote, self.job_name)):
            remote = session.register_reverted(spec, self.layers, self.dtype)
            warnings.warn(
                f"lohan: rank {self._sharding.rank}'s job {self.job_name!r} "
                f"committed one step more than other ranks (their daemon or "
                f"they stopped before committing it); it goes back to step "
                f"{remote.iteration}, where every rank continues",
                stacklevel=4)
        session.setup_cuda(self.device)
        self._weights.load_or_init(int(remote.iteration))
        if opts.dtype is not None and self._meta_home is not None:
            # As transformers' from_pretrained(dtype=...): the parameters;
            # the buffers keep the dtype the constructor made them in
            # (rotary frequencies stay fp32).
            with torch.no_grad():
                for param in self.model.parameters():
                    if param.is_floating_point() and param.dtype != (
                            self.dtype):
                        param.data = param.data.to(self.dtype)
        elif opts.dtype is not None:
            self.model.to(self.dtype)  # buffers and frozen parameters too

    def _start_iterations(self, opts: EngineOptions,
                          where: Placement) -> None:
        """Loss scaling, the activation store and the step in progress
        (whose router hooks the parameters)."""
        remote = self._session.remote
        if uses_store(where.activation_modes):
            area = (torch.frombuffer(remote.activations, dtype=torch.uint8)
                    if where.spill else None)
            self._activations = ActivationStore(
                opts.activation_host_bytes, remote, area,
                device_copies=self._session.cuda)
        self._iteration = Iteration(
            self._session, self.layers, self.grad_accumulation_steps,
            self._weights, self._activations, self._next_lr,
            loss_scaling(opts.loss_scale, self.dtype, opts.initial_loss_scale,
                         opts.loss_scale_growth_interval),
            self._checkpoint.meta.get("loss_scaling")
            if self._checkpoint is not None else None, self._sharding,
            backward_order(self.model, self.blocks, self.layers)
            if self._sharding else None)

    def _install_activations(self, opts: EngineOptions,
                             first: ActivationsArg) -> None:
        """The activation policy on the blocks: `first` (placement's), and
        with activations="auto" lohand's plan after that iteration."""
        layers_of_block: Dict[int, List[int]] = {}
        for layer in self.layers:
            if layer.block is not None:
                layers_of_block.setdefault(id(layer.block), []).append(
                    layer.index)
        router = self._iteration.router

        def inside(block: nn.Module, last_call: bool) -> ContextManager[None]:
            stack = contextlib.ExitStack()
            for layer in layers_of_block.get(id(block), []):
                stack.enter_context(router.inside(layer, last_call))
            return stack

        def passed(block: nn.Module) -> None:
            for layer in layers_of_block.get(id(block), []):
                router.block_passed(layer)

        def reinstall(policy: ActivationsArg) -> None:
            self._uninstall_activations()
            self._uninstall_activations = lambda: None
            self._uninstall_activations = install_activation_policy(
                self.model, self.blocks, policy, self._activations,
                Both(self._residency, self._frozen) if self._residency
                else None, BlockPasses(inside, passed),
                self._auto.observer if self._auto else lambda: None,
                opts.activation_unit, opts.param_unit == "sublayer",
                lambda block: self._sublayers[id(block)])

        if opts.auto_activations:
            self._auto = AutoPlan(
                self.model, self.device,
                lambda: lohan_activations._MIN_SWAP_BYTES,
                opts.activation_host_bytes, reinstall,
                per_tensor=self.params_mode != "offload",
                device_bytes=opts.device_memory_bytes,
                loss_bytes=lambda: self._loss.working_bytes)
        reinstall(first)

    # ------------------------------------------------------- the parts' state

    @property
    def buffers(self) -> str:
        """"resident" or "streamed": how the arena holds gradients and
        16-bit weights."""
        return self._session.buffers

    @property
    def model_on_meta(self) -> bool:
        """The model was given on the meta device: close() puts it back
        there (save_pretrained first to keep the trained weights)."""
        return self._meta_home is not None

    @property
    def iteration(self) -> int:
        """Committed steps."""
        return self._iteration.steps.committed

    @property
    def loss_scale(self) -> float:
        """What engine.backward multiplies the loss by (fp16 loss
        scaling; 1 otherwise)."""
        return float(self._iteration.steps.loss_scaling["scale"])

    @loss_scale.setter
    def loss_scale(self, value: float) -> None:
        self._iteration.steps.set_loss_scaling(scale=float(value))

    @property
    def _good_steps(self) -> int:
        return int(self._iteration.steps.loss_scaling.get("good_steps", 0))

    @_good_steps.setter
    def _good_steps(self, value: int) -> None:
        self._iteration.steps.set_loss_scaling(good_steps=int(value))

    @property
    def _in_iteration(self) -> bool:
        return self._iteration is not None and self._iteration.active

    @property
    def _router(self) -> Optional[GradientRouter]:
        return self._iteration.router if self._iteration else None

    @property
    def _job(self) -> Optional[Job]:
        return self._session.job if self._session else None

    @property
    def _remote(self) -> Optional[Model]:
        return self._session.remote if self._session else None

    @property
    def _cuda(self) -> bool:
        """Gradients leave the GPU through the C library."""
        return self._session is not None and self._session.cuda

    @property
    def _residency(self) -> Optional[ParameterResidency]:
        return self._weights.residency if self._weights else None

    @property
    def _frozen(self) -> Optional[FrozenWeights]:
        return self._weights.frozen if self._weights else None

    # -------------------------------------------------------------- training

    def _next_lr(self) -> float:
        """The step's learning rate, when its first gradient reaches the
        daemon: engine.lr, or group 0's of engine.optimizer (an LR
        scheduler sets it there)."""
        if self._optimizer is not None:
            groups = self._optimizer.param_groups
            self.lr = float(groups[0]["lr"])
            check_optimizer_groups(groups, self.lr, self.betas, self.eps,
                                   self.weight_decay, self._groups)
        return self.lr

    def _warn_untrained_gradients(self) -> None:
        """A parameter unfrozen after lohan.init gets gradients that no one
        applies (and that pile up): say so, once."""
        stray = [name for name, p in self._untrained if p.grad is not None]
        if stray:
            self._untrained = []  # said once
            more = " ..." if len(stray) > 3 else ""
            warnings.warn(
                f"lohan: {', '.join(stray[:3])}{more}"
                " got gradients but the engine does not train them (they "
                "were frozen when lohan.init ran); to train them, close the "
                "engine and call lohan.init again", stacklevel=3)

    def backward(self, loss: torch.Tensor, **kwargs: object) -> None:
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
        return self._iteration.scale_loss(loss)

    def step(self) -> Optional[StepResult]:
        """Ends the iteration: hands over any layer still holding gradients,
        waits for the daemon (clipping and skips happen here), and puts the
        new weights into the model; if lohand asked at the iteration's end,
        the job's data plane then moves to the arena it grants (see
        status()). A step with no gradients is a no-op (returns None), as
        torch.optim's."""
        self._check_open()
        self._warn_untrained_gradients()
        try:
            outcome = self._iteration.end()
            if outcome is None:
                return None
            self._weights.pull()
            if self._activations is not None:
                self._activations.sweep()
            self._follow_share()
        except LohanError as error:
            if self._sharding is not None:
                self._sharding.publish_failure(error)  # the others name it
            raise
        if self._auto is not None and self._auto.waiting:
            self._auto.after_step(
                self._session.client, self._job.id,
                sizes_of(self.model, self.blocks, self.layers))
        self.last = StepResult(*outcome, self.iteration)
        if self._optimizer is not None:
            # engine.step() is the optimizer's step: torch's LR schedulers
            # look for this mark (set by a wrapper around
            # optimizer.step) and warn that step() was never called.
            self._optimizer._opt_called = True
        return self.last

    def _follow_share(self) -> None:
        """Moves the job's data plane to the arena lohand asked for at this
        step's end, if it asked (share_move.py): nothing of the next step
        is in flight yet. Each data-parallel rank's job moves on its own
        (no collective: the ranks' layouts may differ)."""
        move = follow_share(MovingParts(
            self._session, self._iteration, self._weights,
            self._activations, self.layers, self.dtype, self.device))
        if move is not None:
            self._arena.add(move)
            warnings.warn(move_message(self.job_name, move), stacklevel=3)

    def status(self) -> Dict[str, Any]:
        """The job as lohand and this engine see it: the daemon's status of
        its session (`session`, SessionStatus as client.status() gives it:
        proto field names, 64-bit integers as strings), and the engine's
        own: its arena now and the one its job asks for, how the arena
        holds gradients and weights, the arena moves lohand asked of it and
        the last one (when, from and to how many bytes, why)."""
        self._check_open()
        session = self._session
        mine = next((s for s in session.client.status().get("sessions", [])
                     if s.get("job_id") == self._job.id), {})
        return {"job_id": self._job.id, "job_name": self.job_name,
                "iteration": self.iteration, "buffers": self.buffers,
                "stream_buffers": session.slots,
                **status_of(self._arena, session.arena_bytes, mine),
                "session": mine}

    def sync_weights(self) -> None:
        """With overlap_step=True: brings every block's parameters up to
        date now (each waits for its update), for code that reads them
        between step() and the next forward. A no-op otherwise."""
        self._check_open()
        self._weights.sync()

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
        self._iteration.router.reset()
        self.model.zero_grad(set_to_none=set_to_none)

    def discard_step(self) -> None:
        """Throws away the step in progress: the gradients handed over so
        far and the updates the daemon ran with them (rolled back; weights,
        moments and step count as after the last step()). A no-op between
        steps."""
        self._check_open()
        self._iteration.discard()

    @property
    def activation_plan(self) -> Optional[Dict[str, object]]:
        """With activations="auto": lohand's plan (JobPlan as JSON) once
        the first iteration has profiled, else None."""
        return self._auto.plan if self._auto is not None else None

    @property
    def optimizer(self) -> LohanOptimizer:
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
        return self._weights.master_weights()

    def save(self, directory: Union[str, os.PathLike],
             optimizer_state: bool = False) -> str:
        """Writes `directory/model.safetensors` (the fp32 master weights by
        parameter name), with `optimizer_state=True` also
        `directory/optimizer.safetensors` (the Adam moments), and
        `directory/lohan.json`; returns the weights file's path. With
        data-parallel ranks (every rank calls it) each rank writes its own
        shard file into `directory`, which every rank must see, and rank 0
        the lohan.json describing them (sharded_checkpoint.py); every rank
        returns lohan.json's path. Layer by layer: memory holds one layer
        (or its shard) at a time; all or nothing. Continue from it with
        lohan.init(model, ..., resume=directory) (with the optimizer state,
        exactly where this run is; a sharded checkpoint with any number of
        ranks or in one process), or from the daemon's job itself with
        resume=True. Between steps only."""
        self._check_open()
        if self._in_iteration:
            raise RuntimeError("lohan: save() in the middle of a step; call "
                               "engine.step() first")
        # The checkpoint's job and step; the library adds the layers.
        return self._weights.save(directory, optimizer_state, {
            "job_name": self.job_name,
            "job_id": self._job.id,
            "iteration": self.iteration,
            "dtype": WIRE_NAMES[self.dtype],
            "adam": {"lr": self.lr, "amsgrad": self._amsgrad},
            "loss_scaling": self._iteration.steps.loss_scaling,
        })

    def save_pretrained(self, directory: Union[str, os.PathLike],
                        dtype: Optional[torch.dtype] = None,
                        max_shard_size: Union[int, str] = "5GB",
                        merged: bool = False) -> str:
        """Writes the model as a Hugging Face checkpoint directory
        (pretrained.py): config.json, safetensors shards of at most
        `max_shard_size` and their index, the model's own names, in `dtype`
        (default: the dtype of the checkpoint lohan.init's weights= loaded,
        else the training dtype), each trained parameter rounded from its
        fp32 master. A layer at a time from lohand; all or nothing (a
        failed save leaves `directory` as it was). Returns the directory.
        With data-parallel ranks every rank calls it: each layer is
        gathered from the ranks and rank 0 writes one checkpoint, in a
        directory rank 0 sees.
        transformers' from_pretrained loads it as it is. A peft model: its
        adapters as peft writes them (in the training dtype by default),
        which peft's PeftModel.from_pretrained loads; with `merged=True`
        its base as transformers names it, each adapted weight with the
        adapters merged as peft's merge_and_unload merges them, which
        from_pretrained loads. Between steps only."""
        self._check_open()
        if self._in_iteration:
            raise RuntimeError("lohan: save_pretrained() in the middle of a "
                               "step; call engine.step() first")
        peft_model = hasattr(self.model, "peft_config")
        if merged and not peft_model:
            raise ValueError(
                "lohan: merged=True merges a peft model's adapters into "
                f"its base; this {type(self.model).__name__} has none")
        adapters = peft_model and not merged
        out = dtype or (self.dtype if adapters else None) or (
            self._saved_dtype or self.dtype)
        if not isinstance(out, torch.dtype) or not out.is_floating_point:
            raise TypeError(f"dtype={dtype!r}: a floating-point torch.dtype")
        if peft_model and self._sharding is not None:
            raise NotImplementedError(
                "lohan: a peft model's save_pretrained with data-parallel "
                "ranks is not there yet; engine.save(directory) saves the "
                "adapters' states")
        saved = self._weights.saved_tensors()
        if adapters:
            return str(self._save_adapters(directory, saved, out))
        tensors = saved.merged(out, self.dtype) if merged else saved.all(out)
        return str(save_model(inner_model(self.model), tensors, directory,
                              out, max_shard_size, self._sharding))

    def _save_adapters(self, directory: Union[str, os.PathLike],
                       saved: SavedTensors, dtype: torch.dtype) -> Path:
        """A peft model's trained parameters (its adapters), from their
        masters, written by peft's own save_pretrained, all or nothing."""
        state = {tensor.name: tensor.read().clone()
                 for tensor in saved.all(dtype, trained_only=True)}
        return replace_directory(
            directory,
            lambda staging: self.model.save_pretrained(str(staging),
                                                       state_dict=state))

    # ------------------------------------------------------------- teardown

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("lohan: this engine is closed")

    def _settle_device_copies(self, timeout: float = 60.0) -> None:
        """Before the arena is unpinned and unmapped: lets every gradient
        copy from a GPU land and its GRAD_READY go out (a step cut short
        by an exception in backward leaves some in flight)."""
        if self._cuda:
            try:
                torch.cuda.synchronize(self.device)
            except RuntimeError:
                pass  # a broken context copies nothing any more
        if self._iteration is not None:
            self._iteration.settle(timeout)

    def close(self, delete_job: bool = False) -> None:
        """Removes the hooks and detaches from the job (its states stay with
        the daemon for a resume; with `delete_job=True` the job and its
        states are deleted, for a run whose checkpoints are elsewhere). An
        unfinished step is rolled back."""
        self._close(delete_job, clean=True)

    def _close(self, delete_job: bool, clean: bool) -> None:
        """close(); `clean`: not unwinding an error, so with data-parallel
        ranks every rank is closing too and may run collectives."""
        if self._closed:
            return
        weights = self._weights
        if weights is not None:
            weights.bring_up_to_date()
        iteration = self._iteration
        if (clean and not delete_job and self._sharding is not None
                and iteration is not None and not iteration.active):
            try:
                release_kept(self._sharding, self._session.remote)
            except (RankFailure, LohanError) as error:
                # Harmless: the next step frees them; the close goes on.
                warnings.warn(
                    f"lohan: rank {self._sharding.rank} closed without the "
                    f"other ranks ({error}); its job keeps the states of the "
                    "step before its last until its next step",
                    stacklevel=3)
        self._closed = True
        self._settle_device_copies()
        # The model goes back where it was given (a model larger than the
        # GPU: to the CPU), with the weights trained.
        home = self._home_device
        given_on_meta = (self._meta_home.ids if self._meta_home is not None
                         else frozenset())
        if weights is not None:
            weights.restore(home, given_on_meta)  # before the arena goes
        self._uninstall_activations()
        self._loss.uninstall()
        if self._auto is not None:
            self._auto.close()
        if home is not None and home.type != "meta" and (
                normalized(home) != self.device):
            self.model.to(home)
        if self._meta_home is not None:
            self._meta_home.give_back()
        if self._activations is not None:
            self._activations.close()
        if self._iteration is not None:
            self._iteration.router.remove()
        if self._session is not None:
            self._session.close(delete_job)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close(delete_job=False, clean=exc[0] is None)


def init(model: nn.Module, **options: object) -> Engine:
    """Hands `model`'s optimizer to lohand and returns the Engine. Options
    (docs/pytorch.md explains each; options.EngineOptions lists them with
    their defaults): device, frozen_host_bytes, lr, betas, eps,
    weight_decay, no_weight_decay, param_groups, max_grad_norm, adamw,
    amsgrad, bias_correction, bf16_moments, skip_nonfinite, clip_schedule, overlap_step,
    service, dtype, loss_scale, loss_scale_growth_interval, weights
    (a checkpoint's weights to start from: the model may be built on the
    meta device), frozen_models (lohan.frozen_model),
    initial_loss_scale, grad_accumulation_steps, blocks, activations,
    activation_host_bytes, activation_buffer_bytes, device_memory_bytes,
    params, buffers, stream_buffers, chunk_elements, commit_interval,
    durable_every, socket, job_name,
    resume (True: this user's job of that name on the daemon; a
    directory: a checkpoint from engine.save)."""
    return Engine(model, **options)
