"""The model's weights beside the daemon's: the job's first states (from
the model, the job itself or a checkpoint), the new weights copied into
the model after each step (at once, or just before a block runs with
overlap_step=True), offloaded and frozen block weights, the check that
no one changed them in place, and checkpoints (master weights, save).

Every layer goes through the arena's fp32 staging slot or its weight
buffer one at a time: memory never holds a flat copy of the model."""

from __future__ import annotations

import os
from pathlib import Path
import warnings
from typing import (Callable, Dict, FrozenSet, List, Mapping, Optional,
                    Tuple, Union)

import torch
from torch import nn

from lohan.activation_store import ActivationStore
from lohan.blocks import Layer
from lohan.checkpoint import (WEIGHTS_FILE, CheckpointReader, Save,
                              contents_of, parameter_aliases)
from lohan.client import LohanError, StatusCode
from lohan.job import JobSession
from lohan.lazy_weights import LazyWeights
from lohan.params import FrozenWeights, ParameterResidency
from lohan.progress import Progress
from lohan.saved_tensors import SavedTensors
from lohan.sharded_checkpoint import save_sharded
from lohan.sharding import Sharding
from lohan.starting_weights import StoredNames

# A trained parameter's name, the parameter and its version counter.
Version = Tuple[str, nn.Parameter, int]
# A state_dict post-hook: (module, state, prefix, local metadata).
StateDictHook = Callable[[nn.Module, Dict[str, object], str, object], None]


def open_checkpoint(resume: Union[bool, str, os.PathLike],
                    weights: Union[None, str, os.PathLike] = None
                    ) -> Optional[CheckpointReader]:
    """resume=<directory>: the checkpoint to start a new job from (its
    weights, and the Adam moments and step when it has them); weights=PATH:
    a checkpoint's weights alone (fresh moments at step 0); None for
    resume=True or False."""
    if weights is not None:
        return CheckpointReader(weights, weights_only=True)
    if isinstance(resume, bool):
        return None
    checkpoint = CheckpointReader(resume)
    if not checkpoint.moments:
        warnings.warn(
            f"lohan: {checkpoint.path} has no optimizer state "
            "(engine.save(dir, optimizer_state=True) writes it): "
            "training starts from its weights with fresh Adam "
            "moments at step 0", stacklevel=4)
    return checkpoint


class Weights:
    """The model's trained layers and the arena's copies of them. Not
    thread-safe, as the engine."""

    def __init__(self, model: nn.Module, layers: List[Layer],
                 dtype: torch.dtype, session: JobSession,
                 checkpoint: Optional[CheckpointReader], amsgrad: bool,
                 job_name: str, sharding: Optional[Sharding] = None,
                 stored_names: Optional[StoredNames] = None,
                 stand_ins: FrozenSet[int] = frozenset()) -> None:
        """`sharding` (data-parallel ranks): the job holds this rank's
        shard of each layer; whole layers are gathered from every rank's
        (collectives: every rank makes the same calls in the same
        order). `stored_names`: the checkpoint's name of each parameter
        (weights=PATH); else a parameter is stored under one of its own
        names. `stand_ins`: the ids of offloaded parameters that hold no
        values (a model built on the meta device): nothing is copied into
        them."""
        self._model = model
        self._layers = layers
        self._dtype = dtype
        self._session = session
        self._checkpoint = checkpoint
        self._amsgrad = amsgrad
        self._job_name = job_name
        self._sharding = sharding
        self._stored_names = stored_names
        self._stand_ins = stand_ins
        self.residency: Optional[ParameterResidency] = None
        self.frozen: Optional[FrozenWeights] = None
        self.lazy: Optional[LazyWeights] = None
        self._versions: Dict[int, Version] = {}
        self._state_dict_hooks: List[torch.utils.hooks.RemovableHandle] = []
        self._restored = False

    # ---------------------------------------------------- the first states

    def load_or_init(self, iteration: int) -> None:
        """Layer by layer (no whole-model copy): a stored layer's weights
        come from the daemon; a new one's fp32 masters are the model's
        current values, taken before the parameters are converted to the
        training dtype, or the checkpoint's (resume=<directory>).
        `iteration`: the job's committed steps."""
        if self._checkpoint is not None:
            self._load_checkpoint(self._checkpoint)
            return
        remote = self._session.remote
        progress = Progress("loading the job's weights" if iteration
                            else "writing the initial states",
                            len(self._layers),
                            sum(layer.numel for layer in self._layers))
        stored = self._agreed_initialized()
        for layer in self._layers:
            index = layer.index
            if stored[index]:
                self._convert(layer)
                remote.read_weights(index)
                self._copy_into_params(layer,
                                       self._whole(layer,
                                                   self._session.staging))
                progress.advance(layer.numel)
                continue
            if iteration > 0:
                raise LohanError(
                    StatusCode.DATA_LOSS,
                    f"job {self._job_name!r} is at iteration {iteration} "
                    f"but has no weights for layer {index}; it cannot be "
                    "resumed")
            self._stage_params(layer)
            remote.init_weights(index)
            self._convert(layer)
            if self._dtype != torch.float32:
                self.copy_fetched_into_params(layer)
            progress.advance(layer.numel)
        progress.done()

    def _agreed_initialized(self) -> List[bool]:
        """Which layers the job has states for; with data-parallel ranks
        every rank's job must say the same (else their collectives would
        part ways)."""
        remote = self._session.remote
        stored = [bool(remote.layer_initialized(layer.index))
                  for layer in self._layers]
        if self._sharding is not None:
            # (Their steps agree already: see rank_commits.rejoin_point.)
            differ = self._sharding.agree(stored)
            if differ is not None:
                raise LohanError(
                    StatusCode.FAILED_PRECONDITION,
                    f"the ranks' jobs {self._job_name!r} disagree on which "
                    f"layers have states (layers {differ[:5]}): some ranks "
                    "resume a job the others start afresh. Resume every "
                    "rank (resume=True, the same number of ranks) or none "
                    "(another job_name)")
        return stored

    def _whole(self, layer: Layer, flat: torch.Tensor) -> torch.Tensor:
        """`flat`: the job's values of the layer (this rank's shard of
        them with data-parallel ranks, gathered then); the whole layer's
        flat vector."""
        if self._sharding is None:
            return flat
        return self._sharding.gather(layer.index, flat)

    def _load_checkpoint(self, checkpoint: CheckpointReader) -> None:
        """A new job's states from a checkpoint, layer by layer: the fp32
        masters (also into the model), then the moments it has."""
        remote = self._session.remote
        parts = [p for p in checkpoint.moments
                 if p != "max_exp_avg_sq" or self._amsgrad]
        aliases = (parameter_aliases(self._model)
                   if self._stored_names is None
                   else self._stored_names.aliases(self._model))
        rank, world = ((0, 1) if self._sharding is None else
                       (self._sharding.rank, self._sharding.world))
        progress = Progress(
            f"{'loading weights' if self._stored_names else 'resuming'} "
            f"from {checkpoint.path}", len(self._layers),
            sum(layer.numel for layer in self._layers))
        for layer in self._layers:
            if remote.layer_initialized(layer.index):
                raise LohanError(
                    StatusCode.FAILED_PRECONDITION,
                    f"job {self._job_name!r} has states already; resume "
                    "from a checkpoint starts a new job (pass another "
                    "job_name, or resume=True to continue this one)")
            self._restore_weights(checkpoint, layer, aliases, rank, world)
            self._convert(layer)
            if any(id(p) in self._stand_ins for p in layer.params):
                pass  # the daemon alone holds them; its block fetches them
            elif self._dtype == torch.float32:
                self._copy_into_params(
                    layer, self._whole(layer, self._session.staging))
            else:
                self.copy_fetched_into_params(layer)
            if parts:
                checkpoint.restore(remote, layer, parts, aliases, rank, world)
            progress.advance(layer.numel)
        progress.done()

    def _restore_weights(self, checkpoint: CheckpointReader, layer: Layer,
                         aliases: Dict[int, List[str]], rank: int,
                         world: int) -> None:
        """A layer's first masters from the checkpoint; with weights=, a
        parameter it does not hold (a peft adapter) from the model."""
        names = self._stored_names
        if names is None or all(names.stores(p) for p in layer.params):
            checkpoint.restore(self._session.remote, layer, ["weights"],
                               aliases, rank, world)
            return

        def value(position: int) -> torch.Tensor:
            param = layer.params[position]
            source = (names.read_parameter(param) if names.stores(param)
                      else param.detach())
            return source.reshape(-1)
        self._fill_staging(layer, value)
        self._session.remote.init_weights(layer.index)

    def _fill_staging(self, layer: Layer,
                      flat_param: Callable[[int], torch.Tensor]) -> None:
        """The layer's values (`flat_param(position)`: a parameter's, flat)
        into the staging slot, each straight into its place (no flat copy
        of the layer); this rank's shard of them with data-parallel
        ranks."""
        staging = self._session.staging
        if self._sharding is not None:
            self._sharding.fill(layer.index, staging, flat_param)
            return
        for position, (offset, size) in enumerate(zip(layer.offsets,
                                                      layer.sizes())):
            staging[offset:offset + size].copy_(flat_param(position))

    def _stage_params(self, layer: Layer) -> None:
        """The layer's parameters as fp32 into the staging slot (see
        _fill_staging: the largest layer, an embedding, can be hundreds of
        MB)."""
        self._fill_staging(
            layer, lambda position: layer.params[position].detach().reshape(-1))

    def _convert(self, layer: Layer) -> None:
        for param in layer.params:
            if param.dtype != self._dtype:
                param.data = param.data.to(self._dtype)

    # ------------------------------------------------- where weights live

    def offload(self, blocks: List[nn.Module], device: torch.device,
                frozen_host_bytes: Optional[int],
                activations: Optional[ActivationStore],
                in_step: Callable[[], bool]) -> None:
        """params="offload": the blocks' trained weights stay with the
        daemon and their frozen ones in host memory (beyond
        `frozen_host_bytes`, on its SSDs) between uses; the rest of the
        model goes to `device`. model.state_dict() then holds the weights,
        not the placeholders (`in_step()`: refused in the middle of a
        step)."""
        session = self._session
        whole = None
        if self._sharding is not None:
            whole = self._sharding.gather
        self.residency = ParameterResidency(
            self._layers, session.remote, session.weight_views, device,
            whole)
        self.residency.release_all()
        self.frozen = FrozenWeights(blocks, device, frozen_host_bytes,
                                    activations, self._frozen_value)
        # A model given on the CPU: what stays on the device (the
        # layers outside the blocks, buffers) goes there now; the
        # blocks hold placeholders there already.
        self._model.to(device)
        self._state_dict_hooks = [
            block.register_state_dict_post_hook(
                self._offloaded_state_dict(self.residency.layers_of(block),
                                           in_step))
            for block in blocks]

    def _frozen_value(self, param: nn.Parameter) -> torch.Tensor:
        """A frozen block parameter's values for its home: its own, or the
        checkpoint's for a stand-in (a model built on meta: read when its
        home is made, one parameter at a time)."""
        if id(param) not in self._stand_ins:
            return param.data
        return self._stored_names.read_parameter(param).to(param.dtype)

    def _offloaded_state_dict(self, layers: List[Layer],
                              in_step: Callable[[], bool]) -> StateDictHook:
        """A state_dict post-hook for an offloaded block: between uses its
        parameters are empty placeholders, so the entries state_dict made
        of them are replaced by the weights themselves (host tensors: the
        daemon's current 16-bit weights, the frozen ones' host copies).
        model.state_dict(), torch.save and save_pretrained then see the
        model as it is, not the placeholders. `layers`: the block's trained
        parameters (its own layer and its units'; none: it has only frozen
        ones)."""
        where = {
            id(param): (layer, offset, shape) for layer in layers
            for param, offset, shape in zip(
                layer.params, layer.offsets, layer.shapes)}

        def hook(block: nn.Module, state: Dict[str, object], prefix: str,
                 metadata: object) -> None:
            if self._restored:
                return
            frozen = self.frozen.homes(block) if self.frozen else {}
            flats: Dict[int, torch.Tensor] = {}
            for name, param in block.named_parameters(remove_duplicate=False):
                key = prefix + name
                if key not in state or param.numel() > 0:
                    continue  # not saved, or materialized: already right
                if id(param) in frozen:
                    state[key] = frozen[id(param)]
                    continue
                if id(param) not in where:
                    continue
                if in_step():
                    raise RuntimeError(
                        "lohan: state_dict() of a model with offloaded "
                        "block weights in the middle of a step (the daemon "
                        "is updating them); call it after engine.step()")
                layer, offset, shape = where[id(param)]
                if layer.index not in flats:
                    flats[layer.index] = self.residency.current_weights(layer)
                state[key] = flats[layer.index][
                    offset:offset + shape.numel()].view(shape)
        return hook

    def overlap_steps(self) -> None:
        """overlap_step=True: resident blocks get their new weights just
        before they next run (lazy_weights.py), not at the end of step()."""
        residency = self.residency
        resident_blocks = [
            layer for layer in self._layers if layer.block is not None
            and (residency is None or not residency.holds(layer))]
        self.lazy = LazyWeights(self._model, resident_blocks,
                                self._pull_layer_lazily)

    def release(self) -> None:
        """Offloaded blocks give their weights up (a step ended or was
        thrown away)."""
        if self.residency is not None:
            self.residency.release_all()
            self.frozen.release_all()

    # ----------------------------------------------------- after a step

    def before_step(self) -> None:
        """Before a step's first gradient reaches the daemon: refuses
        weights changed in place, and brings up to date the blocks the
        forward did not run (overlap_step=True)."""
        self.check_unchanged()
        if self.lazy is not None:
            self.lazy.pull_all()

    def pull(self) -> None:
        """After a step: the new weights into the model (offloaded blocks
        fetch theirs when they next run; with overlap_step=True resident
        blocks just before they run)."""
        if self.residency is not None:
            self.residency.release_all()
            self.residency.new_step()
            self.frozen.release_all()
        for layer in self._layers:
            if self.residency is not None and self.residency.holds(layer):
                continue
            if self.lazy is not None and layer in self.lazy:
                continue  # copied just before its block next runs
            self.copy_fetched_into_params(layer)
        if self.lazy is not None:
            self.lazy.mark_stale()
        self.remember()

    def sync(self) -> None:
        """Every stale block's weights now (overlap_step=True)."""
        if self.lazy is not None:
            self.lazy.pull_all()

    def _pull_layer_lazily(self, layer: Layer) -> None:
        # Changed in place since step() (load_state_dict): refused, as at
        # the next step, rather than overwritten.
        self.check_unchanged(layer)
        self.copy_fetched_into_params(layer)
        for name, param in zip(layer.names, layer.params):
            self._versions[id(param)] = (name, param, param._version)

    def copy_fetched_into_params(self, layer: Layer) -> None:
        """The layer's new weights (16-bit, or the fp32 masters), as the
        daemon wrote them into its weight buffer, into the model. Fetched
        first: a streamed buffer is shared by several layers (the daemon
        reads it from its SSDs), and a resident one may still be waiting
        for its update (the daemon answers once the layer's update is
        done)."""
        session = self._session
        session.remote.fetch_params(layer.index)
        view = session.weight_views[layer.index]
        device = layer.params[0].device
        if not (session.cuda and device.type == "cuda"):
            self._copy_into_params(layer, self._whole(layer, view))
            return
        # On the GPU the host goes on at once: the C library copies the
        # buffer up on torch's current stream, holding it until the copy has
        # read it (a fetch that would refill a shared buffer waits for
        # that), and the parameters take their slices on the same stream.
        flat = torch.empty(view.shape, dtype=view.dtype, device=device)
        session.remote.weights_to_device(
            layer.index, flat.data_ptr(), view.numel() * view.element_size(),
            torch.cuda.current_stream(device).cuda_stream, device.index)
        self._copy_into_params(layer, self._whole(layer, flat))

    @staticmethod
    def _copy_into_params(layer: Layer, flat: torch.Tensor) -> None:
        with torch.no_grad():
            for param, offset, shape in zip(layer.params, layer.offsets,
                                            layer.shapes):
                param.copy_(flat[offset:offset + shape.numel()].view(shape))

    def remember(self) -> None:
        """The version counters of the model's resident trained parameters
        now: one changed behind the engine's back (load_state_dict, an
        in-place init) would be silently overwritten at the next step by
        the daemon's weights, so the next step refuses it."""
        offloaded = ({layer.index for layer in self.residency.layers}
                     if self.residency is not None else set())
        self._versions = {id(param): (name, param, param._version)
                          for layer in self._layers
                          if layer.index not in offloaded
                          for name, param in zip(layer.names, layer.params)}

    def check_unchanged(self, layer: Optional[Layer] = None) -> None:
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

    # -------------------------------------------------------- checkpoints

    def master_weights(self) -> Dict[str, torch.Tensor]:
        """The committed fp32 master weights, by parameter name."""
        remote, staging = self._session.remote, self._session.staging
        weights: Dict[str, torch.Tensor] = {}
        for layer in self._layers:
            remote.read_weights(layer.index)
            whole = self._whole(layer, staging)
            for name, offset, shape in zip(layer.names, layer.offsets,
                                           layer.shapes):
                weights[name] = (whole[offset:offset + shape.numel()]
                                 .clone().view(shape))
        return weights

    def save(self, directory: Union[str, os.PathLike],
             optimizer_state: bool, meta: Mapping[str, object]) -> str:
        """Writes the checkpoint layer by layer, `meta` into its lohan.json:
        alone, model.safetensors and optimizer.safetensors (returns the
        weights file's path); with data-parallel ranks, every rank its
        shard file (sharded_checkpoint.save_sharded; returns lohan.json's
        path). The client library reads each layer from the job and writes
        it; nothing is gathered."""
        parts = ["weights"]
        if optimizer_state:
            parts += ["exp_avg", "exp_avg_sq"]
            if self._amsgrad:
                parts.append("max_exp_avg_sq")
        layers, remote = self._layers, self._session.remote
        sizes = ([layer.numel for layer in layers] if self._sharding is None
                 else self._sharding.shard)
        progress = Progress(f"saving to {directory}", len(layers),
                            sum(sizes) * len(parts))

        def write_layer(save: Save, layer: Layer) -> None:
            save.write_layer(remote, layer.index)
            progress.advance(sizes[layer.index] * len(parts))

        if self._sharding is None:
            with Save(directory) as save:
                save.open(contents_of(layers, parts, meta))
                for layer in layers:
                    write_layer(save, layer)
                save.close_files()
                save.commit(dict(meta))
            path = str(Path(directory).absolute() / WEIGHTS_FILE)
        else:
            path = save_sharded(self._sharding, directory, layers,
                                write_layer, parts, dict(meta))
        progress.done()
        return path

    def saved_tensors(self) -> SavedTensors:
        """The model's tensors as save_pretrained writes them."""
        return SavedTensors(self._model, self._layers, self._session.remote,
                            self._session.staging,
                            lambda layer, flat: self._whole(layer, flat),
                            self.frozen)

    # ------------------------------------------------------------ close

    def bring_up_to_date(self) -> None:
        """Before close: the model goes back trained; a block that cannot
        be brought up to date (overlap_step=True) keeps what it has, with
        a word."""
        if self.lazy is None:
            return
        for layer in self.lazy.stale():
            try:
                self.lazy.pull(layer)
            except (LohanError, RuntimeError) as error:
                warnings.warn(
                    f"lohan: block layer {layer.index} keeps the weights "
                    f"it has, not its last step's: {error}. The trained "
                    "weights are with the daemon's job (lohan.init(..., "
                    "resume=True)) or in your last engine.save()",
                    stacklevel=3)
        self.lazy.remove()
        self.lazy = None

    def restore(self, home: Optional[torch.device],
                given_on_meta: FrozenSet[int] = frozenset()) -> None:
        """The offloaded and frozen block weights back into the model, on
        `home` (while the arena is still mapped); the state_dict hooks
        go. Parameters given on the meta device (`given_on_meta`) get
        nothing back (they would not fit): the engine puts them back on
        meta."""
        self._restored = True
        for handle in self._state_dict_hooks:
            handle.remove()
        self._state_dict_hooks = []
        if home is not None and home.type == "meta":
            self.frozen = self.residency = None
            return
        if self.frozen is not None:
            self.frozen.restore_all(home, given_on_meta)
            self.frozen = None
        if self.residency is not None:
            try:
                self.residency.restore_all(home, given_on_meta)
            except LohanError as error:
                warnings.warn(
                    "lohan: the daemon could not give the offloaded blocks "
                    f"their weights back ({error}); they keep empty "
                    "placeholders. Their trained weights are with the "
                    "daemon's job (restart it and lohan.init(..., "
                    "resume=True)) or in your last engine.save()",
                    stacklevel=3)
            self.residency = None
