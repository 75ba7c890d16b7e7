"""`engine.optimizer`: the engine in torch.optim's shape, for training loops,
LR schedulers and libraries that want an Optimizer object."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

import torch

if TYPE_CHECKING:
    from lohan.engine import Engine


class LohanOptimizer(torch.optim.Optimizer):
    """Group 0 holds every parameter the engine trains outside lohan.init's
    param_groups, then one group per param group. Group 0's "lr" is the
    rate of the next step (read when the step's first gradient reaches the
    daemon, during backward), so torch's LR schedulers drive it
    (LambdaLR(engine.optimizer, ...)), and it overrides engine.lr; the other
    groups' lr must stay the same multiple of it (schedulers that scale
    every group alike keep that), and betas, eps and weight decay stay as
    given to lohan.init (the next step raises otherwise, saying which).
    step() is engine.step() and zero_grad() engine.zero_grad(). Groups are
    fixed: add_param_group is refused. The Adam moments live in the daemon:
    state_dict() holds only the groups' settings (checkpoint with
    engine.save(dir, optimizer_state=True))."""

    def __init__(self, engine: Engine) -> None:
        grouped = set().union(*(g.ids for g in engine._groups))
        trained = [p for layer in engine.layers for p in layer.params]
        groups = [{"params": [p for p in trained if id(p) not in grouped]}]
        for group in engine._groups:
            groups.append({"params": [p for p in trained if id(p) in group.ids],
                           "lr": group.lr,
                           "weight_decay": group.weight_decay})
        defaults: Dict[str, Any] = dict(
            lr=engine.lr, betas=engine.betas, eps=engine.eps,
            weight_decay=engine.weight_decay)
        self.engine = engine
        self._building = True
        super().__init__(groups, defaults)
        self._building = False

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if not self._building:
            raise ValueError(
                "lohan's param groups are fixed when the engine starts: "
                "pass them to lohan.init(..., param_groups=[...])")
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
