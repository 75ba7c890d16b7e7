"""`activations="auto"`: the first iteration runs every block as "offload"
and profiles it (profile.py); after its step the engine sends the profile
to lohand (PlanJob), whose planner decides per saved tensor, and the plan
applies from the second iteration on. lohand keeps the plan with the job:
`lohanctl status` shows it with the predicted and the measured iteration
time. A plan lohand cannot make (its own profile still being measured, a
memory too small) leaves the offload policy in place, with a warning."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import nn

from lohan.blocks import after_the_blocks
from lohan.client import LohanError, StatusCode
from lohan.profile import ModelSizes, Profiler, host_available_bytes
from lohan.profile import profile_message


# Steps after the profiling one that ask again while lohand answers
# UNAVAILABLE (its machine profile is being measured).
_UNAVAILABLE_RETRIES = 20


def sizes_of(model: nn.Module, blocks: List[nn.Module],
             layers: Sequence[Any]) -> ModelSizes:
    """The parameter counts the planner needs, from the engine's layers
    (blocks.plan_layers: the rest before the blocks, the rest after them,
    then each block's layers)."""
    after = after_the_blocks(model, blocks)
    per_block: Dict[int, int] = {}
    for layer in layers:
        if layer.block is not None:
            key = id(layer.block)
            per_block[key] = per_block.get(key, 0) + layer.numel
    in_blocks = list(per_block.values())
    rest = [layer for layer in layers if layer.block is None]
    return ModelSizes(
        blocks=len(blocks),
        parameters=sum(layer.numel for layer in layers),
        block_parameters=max(in_blocks, default=0),
        largest_layer_parameters=max(layer.numel for layer in layers),
        head_parameters=sum(layer.numel for layer in rest
                            if after(layer.names[0])),
        first_layer_parameters=sum(layer.numel for layer in rest
                                   if not after(layer.names[0])))


def policy_of(plan: Dict[str, Any]) -> List[Any]:
    """The activation policy a JobPlan (JSON) gives: per block "offload" or
    "keep" where the plan says so, else its per-tensor decisions ("swap"
    where every one is "host": no recording needed)."""
    modes = plan.get("blockModes", [])
    blocks = plan.get("blocks", [])
    if len(modes) != len(blocks):
        raise ValueError(f"the plan has {len(modes)} block modes and "
                         f"{len(blocks)} blocks of decisions")
    policy: List[Any] = []
    for mode, block in zip(modes, blocks):
        decisions = list(block.get("decisions", []))
        if mode in ("offload", "keep"):
            policy.append(mode)
        elif decisions and all(d == "host" for d in decisions):
            policy.append("swap")
        else:
            policy.append(decisions)
    return policy


class AutoPlan:
    """Profiles the first iteration, then asks for and applies the plan.
    `reinstall(policy)` replaces the blocks' activation policy."""

    def __init__(self, model: nn.Module, device: torch.device,
                 min_bytes: Callable[[], int],
                 activation_host_bytes: Optional[int],
                 reinstall: Callable[[Any], None],
                 per_tensor: bool = True,
                 device_bytes: Optional[int] = None,
                 loss_bytes: Callable[[], int] = lambda: 0):
        self.profiler: Optional[Profiler] = Profiler(device, min_bytes)
        self.plan: Optional[Dict[str, Any]] = None
        # A request lohand could not answer yet (its own profile still
        # being measured): asked again after each step, a few times.
        self._request: Optional[Dict[str, Any]] = None
        self._retries = 0
        self._device = device
        self._host_bytes = activation_host_bytes
        self._reinstall = reinstall
        self._per_tensor = per_tensor
        self._device_bytes = device_bytes
        # What the chunked loss holds at its peak (causal_lm.py), which
        # the profile's saved tensors do not show.
        self._loss_bytes = loss_bytes
        self._forward: Optional[contextlib.ExitStack] = None
        self._hooks = [
            model.register_forward_pre_hook(self._enter),
            model.register_forward_hook(self._exit, always_call=True)]

    def observer(self) -> Optional[Profiler]:
        return self.profiler

    def _enter(self, module: nn.Module, args: Any) -> None:
        if self.profiler is None or not torch.is_grad_enabled():
            return
        if self._forward is None:
            self.profiler.started()
            stack = contextlib.ExitStack()
            stack.enter_context(self.profiler.model_forward(module))
            self._forward = stack

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._forward is not None:
            stack, self._forward = self._forward, None
            stack.close()

    def _remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    @property
    def waiting(self) -> bool:
        """The next step should call after_step."""
        return self.profiler is not None or self._request is not None

    def after_step(self, client: Any, job_id: str,
                   sizes: ModelSizes) -> None:
        """After the profiling iteration's step: plans and applies."""
        if self._request is not None:
            self._ask(client, job_id)
            return
        profiler, self.profiler = self.profiler, None
        self._remove_hooks()
        if profiler is None:
            return
        profiler.finish()
        if profiler.recorded is None:
            warnings.warn("lohan: activations='auto' found no block "
                          "recomputed in the first iteration; the offload "
                          "policy stays", stacklevel=3)
            return
        message = profile_message(profiler, sizes, self._device)
        message["outsideSavedBytes"] = str(
            int(message["outsideSavedBytes"]) + self._loss_bytes())
        if self._device.type == "cpu":
            # The device is the host: one memory. What stays in place is
            # "device"; the host room is only what the budget sets apart
            # (none without one: everything kept is the device's).
            host_bytes = self._host_bytes or 0
            message["deviceBytes"] = str(
                max(1, int(message["deviceBytes"]) - host_bytes))
        else:
            host_bytes = (self._host_bytes if self._host_bytes is not None
                          else host_available_bytes())
        if self._device_bytes is not None:
            message["deviceBytes"] = str(self._device_bytes)
        self._request = {"profile": message,
                         "activationHostBytes": str(host_bytes),
                         "perBlock": not self._per_tensor}
        self._ask(client, job_id)

    def _ask(self, client: Any, job_id: str) -> None:
        try:
            plan = client.plan_job(job_id, self._request)
        except LohanError as error:
            if (error.code == StatusCode.UNAVAILABLE
                    and self._retries < _UNAVAILABLE_RETRIES):
                self._retries += 1  # lohand still measures its machine
                return
            self._request = None
            warnings.warn(f"lohan: activations='auto' could not get a plan "
                          f"from lohand ({error}); the offload policy "
                          "stays", stacklevel=4)
            return
        self._request = None
        self.plan = plan
        if self._per_tensor:
            self._reinstall(policy_of(plan))

    def close(self) -> None:
        self._remove_hooks()
        if self._forward is not None:
            self._forward.close()
            self._forward = None
