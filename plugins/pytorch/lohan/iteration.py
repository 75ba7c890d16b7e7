"""One optimizer step as the daemon runs it, over liblohan_client's
TrainingSteps (steps.py: the count, the learning rate, loss scaling, the
hand-overs and their tickets): begun when its first gradient reaches the
daemon (during backward), each layer's gradient handed over as the
GradientRouter collects it, then ended (the daemon decides the global norm,
clips or skips) or thrown away (the daemon rolls back the updates it ran).
What stays here is torch's: the router, data-parallel reductions, the copy
stream, the model's own cleanup."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Union

import torch

from lohan.activation_store import ActivationStore
from lohan.blocks import Layer
from lohan.client import LohanError
from lohan.devices import copy_stream
from lohan.hooks import GradientRouter
from lohan.job import JobSession
from lohan.rank_commits import agree_committed
from lohan.sharding import GradientReducer, Sharding
from lohan.steps import Outcome, TrainingSteps
from lohan.weights import Weights


def loss_scaling(loss_scale: Union[None, str, float], dtype: torch.dtype,
                 initial_scale: float,
                 growth_interval: int) -> Dict[str, Any]:
    """lohan.init's fp16 loss scaling as a LossScaling
    (proto/training_steps.proto): engine.backward(loss) multiplies the loss
    by the scale, the daemon the gradients by its inverse. "dynamic" (the
    default for fp16) halves the scale on a step with inf/nan gradients
    (which the daemon skips) and doubles it after `growth_interval` good
    steps, like torch's GradScaler."""
    if loss_scale is None:
        loss_scale = "dynamic" if dtype == torch.float16 else 1.0
    dynamic = loss_scale == "dynamic"
    return {"dynamic": dynamic,
            "scale": float(initial_scale if dynamic else loss_scale),
            "growth_interval": int(growth_interval)}


class Iteration:
    """The step in progress, and the GradientRouter's sink
    (hooks.GradientSink): the router it makes hands every layer's
    gradients here. Not thread-safe: autograd's thread and the training
    loop are one."""

    def __init__(self, session: JobSession, layers: List[Layer],
                 accumulation_steps: int, weights: Weights,
                 activations: Optional[ActivationStore],
                 learning_rate: Callable[[], float],
                 scaling: Mapping[str, Any],
                 resumed: Optional[Mapping[str, Any]],
                 sharding: Optional[Sharding] = None,
                 order: Optional[List[int]] = None) -> None:
        """`learning_rate()`: the step's rate, read when its first
        gradient reaches the daemon (a scheduler may have set it since
        the last step). `scaling`: loss_scaling(...); `resumed`: the
        "loss_scaling" of the checkpoint resumed from, if any.
        `sharding` (data-parallel ranks): the job holds this rank's
        shards; gradients are reduced over the ranks in `order` (the same
        on every rank, see sharding.backward_order) and the daemon clips
        and skips on the global norm."""
        self._remote = session.remote
        self._layers = layers
        self._grad_views = session.grad_views
        self._weights = weights
        self._activations = activations
        self._learning_rate = learning_rate
        self.steps = TrainingSteps(session.remote, learning_rate(), scaling,
                                   resumed)
        # Gradients on a GPU are copied into their slots on a stream, by
        # the C library.
        self.device_copies = session.cuda
        self._sharding = sharding
        reducer = None
        if sharding is not None:
            # Before the step's first gradient goes out: the lazy pulls of
            # overlap_step gather weights across the ranks, so they must
            # come at the same point of every rank's collectives (begin()
            # then finds nothing left to pull).
            reducer = GradientReducer(sharding, order,
                                      session.grad_views[0].dtype,
                                      self._shard_ready,
                                      first=self._before_first_reduction)
        self.router = GradientRouter(layers, self._grad_views,
                                     accumulation_steps, self,
                                     reducer=reducer)

    @property
    def active(self) -> bool:
        """The daemon has begun the step."""
        return self.steps.active

    def _before_first_reduction(self) -> None:
        """Data-parallel ranks, at the same point of every rank's
        collectives: the lazy pulls of overlap_step (which gather weights
        across the ranks), then the agreement that every rank committed
        the last step; this step's ITER_BEGIN then frees the states that
        step replaced (see rank_commits)."""
        self._weights.before_step()
        agree_committed(self._sharding, self._remote)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the loss scale; the daemon unscales this step's
        gradients."""
        return loss * self.steps.scale_loss()

    def _begin_if_idle(self) -> None:
        if self.steps.active:
            return
        self._weights.before_step()
        try:
            self.steps.begin(self._learning_rate())
        except BaseException:
            # No step began (the daemon is gone, say): what this backward
            # handed over so far is lost with it, and the next backward
            # must start clean rather than find layers "handed over".
            self.router.reset()
            raise

    # ------------------------------------------------ hooks.GradientSink

    def claim_grad_buffer(self, layer: int) -> None:
        self.steps.claim_grad_buffer(layer)

    def grad_ready(self, layer: int) -> None:
        """The layer's gradient is in its slot: tell the daemon without
        waiting (its update starts while backward goes on)."""
        self._begin_if_idle()
        self.steps.grad_ready(layer)

    def device_grad_ready(self, layer: int, flat: torch.Tensor) -> None:
        """`flat`: the layer's gradients back to back on the GPU. The copy
        into the layer's slot runs on the outbound copy stream once the
        compute stream has produced them, so backward's next kernels do
        not wait for it; the C library posts GRAD_READY from a host
        function once it is done, so the Python thread goes on at once."""
        self._begin_if_idle()
        side = copy_stream(flat.device, outbound=True)
        # Everything queued on the compute stream so far comes first: the
        # gradients, and the waits for this layer's weight copies out of
        # the arena (the update that follows GRAD_READY rewrites them).
        side.wait_stream(torch.cuda.current_stream(flat.device))
        # Its memory must not be reused before the copy has read it.
        flat.record_stream(side)
        # The device named, so the C library neither probes the pointer
        # nor leaves another device current on this thread.
        self.steps.grad_ready_from_device(
            layer, flat.data_ptr(), flat.numel() * flat.element_size(),
            side.cuda_stream, flat.device.index)

    def _shard_ready(self, layer: int, shard: torch.Tensor) -> None:
        """This rank's reduced shard of the layer's gradient (data-parallel
        ranks), into the layer's slot."""
        try:
            if self.device_copies and shard.is_cuda:
                self.device_grad_ready(layer, shard)
                return
            self.claim_grad_buffer(layer)
            self._grad_views[layer].copy_(shard)
            self.grad_ready(layer)
        except LohanError as error:
            self._sharding.publish_failure(error)  # the others name it
            raise

    # ------------------------------------------------------------------

    def settle(self, timeout: float) -> None:
        """Lets every GRAD_READY in flight land (or fail), errors
        ignored: before the arena goes."""
        self.steps.settle(timeout)

    def end(self) -> Optional[Outcome]:
        """Hands over any layer still holding gradients and waits for the
        daemon to end the step (None: no gradients, no step). An error
        before the daemon ends it throws the step away first."""
        router = self.router
        if not router.any_gradient():
            return None
        router.flush()  # on an error here the iteration stays open
        local_squares = router.finish_reductions()
        if self._activations is not None:
            self._activations.drain()  # an activation put's error lands here
        global_squares = None
        if local_squares is not None:
            global_squares = self._sharding.sum(local_squares)
        try:
            outcome = self.steps.end(global_squares)
        except BaseException:
            # The daemon rolled the step back (or it was thrown away): the
            # model still holds the committed weights; the next step
            # starts clean.
            self._forget_step()
            raise
        router.reset()
        return outcome

    def discard(self) -> None:
        """Throws away the step in progress: the gradients handed over so
        far and the updates the daemon ran with them (rolled back). A
        no-op between steps. The daemon's refusal is raised once this
        side is clean."""
        try:
            self.steps.discard()
        finally:
            self._forget_step()

    def _forget_step(self) -> None:
        """What backward accumulated and had not handed over yet (a
        micro-batch of an accumulation, the layers a failed backward
        reached), fetched weights and activations of the step. The
        model's resident parameters are written at step() only, and the
        daemon put the committed 16-bit weights back in the arena:
        nothing to copy."""
        self.router.reset()
        for layer in self._layers:
            for param in layer.params:
                param.grad = None
        self._weights.release()
        if self._activations is not None:
            try:
                self._activations.drain()
            except LohanError:
                pass
            self._activations.sweep()
