"""One optimizer step as the daemon runs it: begun when its first
gradient reaches the daemon (during backward), each layer's gradient
handed over as the GradientRouter collects it, then ended (the daemon
decides the global norm, clips or skips) or thrown away (the daemon rolls
back the updates it ran). Also fp16 loss scaling."""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch

from lohan.activations import ActivationStore
from lohan.blocks import Layer
from lohan.client import LohanError
from lohan.devices import copy_stream
from lohan.hooks import GradientRouter
from lohan.job import JobSession
from lohan.rank_commits import agree_committed
from lohan.sharding import GradientReducer, Sharding
from lohan.weights import Weights

# What the daemon reports at the end of a step: the global norm (before
# clipping), whether it clipped, whether it skipped the update.
Outcome = Tuple[float, bool, bool]


class LossScale:
    """fp16 loss scaling: engine.backward(loss) multiplies the loss by
    `scale`; the daemon multiplies the gradients by 1/scale. "dynamic"
    (the default for fp16) halves the scale on a step with inf/nan
    gradients (which the daemon skips) and doubles it after
    `growth_interval` good steps, like torch's GradScaler."""

    def __init__(self, loss_scale: Union[None, str, float],
                 dtype: torch.dtype, initial_scale: float,
                 growth_interval: int,
                 checkpointed: Optional[Mapping[str, object]]) -> None:
        """`checkpointed`: the "loss_scaling" of the checkpoint resumed
        from, if any."""
        if loss_scale is None:
            loss_scale = "dynamic" if dtype == torch.float16 else 1.0
        self.dynamic = loss_scale == "dynamic"
        self.scale = (float(initial_scale) if self.dynamic
                      else float(loss_scale))
        self.growth_interval = int(growth_interval)
        self.good_steps = 0
        if self.dynamic and isinstance(checkpointed, dict):
            # A dynamic scale goes on where the checkpointed run left it
            # (else a resumed fp16 run would start again at 2^16 and skip
            # steps finding its way down).
            self.scale = float(checkpointed.get("scale", self.scale))
            self.good_steps = int(checkpointed.get("good_steps", 0))

    def update(self, skipped: bool) -> None:
        """After a step the daemon `skipped` (non-finite gradients) or
        committed."""
        if not self.dynamic:
            return
        if skipped:
            self.scale = max(self.scale / 2.0, 1.0)
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps >= self.growth_interval:
                self.scale *= 2.0
                self.good_steps = 0

    def state(self) -> Dict[str, object]:
        """As a checkpoint's lohan.json holds it."""
        return {"scale": self.scale, "good_steps": self.good_steps,
                "dynamic": self.dynamic}


class Iteration:
    """The step in progress, and the GradientRouter's sink
    (hooks.GradientSink): the router it makes hands every layer's
    gradients here. Not thread-safe: autograd's thread and the training
    loop are one."""

    def __init__(self, session: JobSession, layers: List[Layer],
                 accumulation_steps: int, weights: Weights,
                 activations: Optional[ActivationStore],
                 learning_rate: Callable[[], float], loss: LossScale,
                 committed: int, sharding: Optional[Sharding] = None,
                 order: Optional[List[int]] = None) -> None:
        """`learning_rate()`: the step's rate, read when its first
        gradient reaches the daemon (a scheduler may have set it since
        the last step). `committed`: the job's committed steps.
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
        self.loss = loss
        self.count = committed
        # Gradients on a GPU are copied into their slots on a stream, by
        # the C library.
        self.device_copies = session.cuda
        self.active = False  # the daemon has begun the step
        self.scaled_backward = False  # this step's loss was scaled
        self._grad_tickets: List[int] = []
        # GRAD_READY in flight per gradient buffer (address): a streamed
        # layout shares buffers, and one may be refilled only once the
        # daemon has taken the previous gradient out of it.
        self._buffer_tickets: Dict[int, int] = {}
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
        self.scaled_backward = True
        return loss * self.loss.scale

    def begin(self) -> None:
        self._weights.before_step()
        lr = self._learning_rate()
        # Gradients of a loss scaled by engine.backward come back to scale 1
        # in the daemon, exactly (the scale is a power of two).
        try:
            self._remote.iter_begin(
                grad_scale=(1.0 / self.loss.scale
                            if self.scaled_backward else 1.0),
                lr=lr)
        except BaseException:
            # No step began (the daemon is gone, say): what this backward
            # handed over so far is lost with it, and the next backward
            # must start clean rather than find layers "handed over".
            self.router.reset()
            self.scaled_backward = False
            raise
        self.active = True

    # ------------------------------------------------ hooks.GradientSink

    def claim_grad_buffer(self, layer: int) -> None:
        ticket = self._buffer_tickets.pop(
            self._grad_views[layer].data_ptr(), None)
        if ticket is not None:
            self._remote.wait(ticket)

    def grad_ready(self, layer: int) -> None:
        """The layer's gradient is in its slot: tell the daemon without
        waiting (its update starts while backward goes on)."""
        if not self.active:
            self.begin()
        self._buffer_tickets[self._grad_views[layer].data_ptr()] = (
            self._remote.submit_grad_ready(layer))

    def device_grad_ready(self, layer: int, flat: torch.Tensor) -> None:
        """`flat`: the layer's gradients back to back on the GPU. The copy
        into the layer's slot runs on the outbound copy stream once the
        compute stream has produced them, so backward's next kernels do
        not wait for it; the C library posts GRAD_READY from a host
        function once it is done, so the Python thread goes on at once."""
        if not self.active:
            self.begin()
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

    def take_tickets(self) -> List[int]:
        """Every GRAD_READY of this step not waited for yet (from host
        buffers and from GPU copies); forgotten here."""
        tickets = self._grad_tickets + list(self._buffer_tickets.values())
        self._grad_tickets, self._buffer_tickets = [], {}
        return tickets

    def settle(self, timeout: float) -> None:
        """Lets every GRAD_READY in flight land (or fail), errors
        ignored: before the arena goes."""
        for ticket in self.take_tickets():
            try:
                self._remote.wait(ticket, timeout=timeout)
            except LohanError:
                pass  # failed, the daemon is gone, or never to be posted

    def end(self) -> Optional[Outcome]:
        """Hands over any layer still holding gradients and waits for the
        daemon to end the step (None: no gradients, no step). An error
        before the daemon ends it throws the step away first."""
        router = self.router
        if not router.any_gradient():
            return None
        router.flush()  # on an error here the iteration stays open
        local_squares = router.finish_reductions()
        # GRAD_READYs posted from CUDA host functions must reach the daemon
        # before ITER_END does.
        tickets = self.take_tickets()
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
                self.discard()
            except LohanError:
                pass  # the daemon is gone: this side is clean all the same
            raise
        if self._activations is not None:
            self._activations.drain()  # an activation put's error lands here
        global_squares = None
        if local_squares is not None:
            # As the daemon counts them: times this step's gradient scale.
            scale = 1.0 / self.loss.scale if self.scaled_backward else 1.0
            global_squares = self._sharding.sum(local_squares) * scale * scale
        try:
            norm, clipped, skipped = self._remote.iter_end(
                global_sum_squares=global_squares)
        finally:
            # On an error the daemon rolled the iteration back: the model
            # still holds the committed weights.
            self.active = False
            self.scaled_backward = False
            router.reset()
        if not skipped:
            self.count += 1
        self.loss.update(skipped)
        return float(norm), bool(clipped), bool(skipped)

    def discard(self) -> None:
        """Throws away the step in progress: the gradients handed over so
        far and the updates the daemon ran with them (rolled back). A
        no-op between steps. The daemon's refusal is raised once this
        side is clean."""
        for ticket in self.take_tickets():
            try:
                self._remote.wait(ticket)
            except LohanError:
                pass  # the step is being thrown away
        refused: Optional[LohanError] = None
        if self.active:
            try:
                self._remote.iter_abort()
            except LohanError as error:
                refused = error  # raised once this side is clean
            finally:
                self.active = False
                self.scaled_backward = False
        # What backward accumulated and had not handed over yet goes too
        # (a micro-batch of an accumulation, the layers a failed backward
        # reached).
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
        # The model's resident parameters are written at step() only, and
        # the daemon put the committed 16-bit weights back in the arena:
        # nothing to copy.
        if refused is not None:
            raise refused
