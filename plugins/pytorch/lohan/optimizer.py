"""`engine.optimizer`: the engine in torch.optim's shape, for training loops,
LR schedulers and libraries that want an Optimizer object."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch


class LohanOptimizer(torch.optim.Optimizer):
    """One parameter group holding every parameter the engine trains; its
    "lr" is the rate of the next step (read when the step's first gradient
    reaches the daemon, during backward), so torch's LR schedulers drive it
    (LambdaLR(engine.optimizer, ...)), and it overrides engine.lr. step() is engine.step() and
    zero_grad() engine.zero_grad(). The daemon runs one Adam setting per
    job, so other groups are refused, and the Adam moments live in the
    daemon: state_dict() holds only the group's settings (checkpoint with
    engine.save(dir, optimizer_state=True))."""

    def __init__(self, engine: Any):
        params = [p for layer in engine.layers for p in layer.params]
        defaults: Dict[str, Any] = dict(
            lr=engine.lr, betas=engine.betas, eps=engine.eps,
            weight_decay=engine.weight_decay)
        self.engine = engine
        super().__init__(params, defaults)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if self.param_groups:
            raise ValueError(
                "lohan trains every parameter with one Adam setting (one "
                "parameter group): pass the rates to lohan.init instead")
        super().add_param_group(param_group)

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.engine.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad(set_to_none=set_to_none)
