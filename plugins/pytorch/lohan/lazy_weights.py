"""overlap_step=True (the default): the resident blocks' new weights are
copied into the model just before each block next runs, not at step().

The daemon answers ITER_END once the global norm has decided the step; the
updates still running then finish in forward order, and fetching a layer
waits for that layer's update only. With every layer copied at step(),
step() waits for all of them; with this, it returns after the layers
outside the blocks (needed first), and each block's copy (a forward
pre-hook) waits for its own update while the blocks before it compute.

No read between step() and a block's next run sees the previous step's
weights:
- parameters() and named_parameters() of any of the model's modules, and
  state_dict(), load_state_dict() and a call of a block or of any module
  in it, bring each block up to date as they reach it (a generator
  stopped early waits for no more), as do a copy (copy.deepcopy) and a
  pickle (torch.save) of any module, which hold torch's own methods;
- a stale block's parameter tensors themselves are empty until then (as
  DeepSpeed ZeRO-3 leaves partitioned ones): a direct read of one fails on
  its shape rather than computing with old values. engine.sync_weights()
  brings every block up to date at once; zero_grad() needs none.
"""

from __future__ import annotations

import contextlib
from typing import (Any, Callable, Dict, Iterator, List, Optional, Set,
                    Tuple)

import torch
from torch import nn

from lohan.blocks import Layer


# What LazyWeights sets on each of the model's modules.
_PATCHED = ("named_parameters", "zero_grad", "__getstate__")


# The modules' hook tables a copy or a pickle leaves LazyWeights' hooks out
# of.
_HOOK_TABLES = ("_forward_pre_hooks", "_state_dict_pre_hooks",
                "_load_state_dict_pre_hooks")


class _Pull:
    """The hook that brings `layer` up to date before a use."""

    def __init__(self, lazy: "LazyWeights", layer: Layer):
        self.lazy = lazy
        self._layer = layer

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.lazy.pull(self._layer)


class _Method:
    """A method set on one module instance: `function(module, *args)`."""

    def __init__(self, module: nn.Module, function: Callable[..., Any]):
        self._module = module
        self._function = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._function(self._module, *args, **kwargs)


def _own_method(module: nn.Module, name: str) -> Callable[..., Any]:
    return getattr(type(module), name).__get__(module)


class LazyWeights:
    """Tracks which blocks' layers still hold the previous weights, keeps
    their parameters empty meanwhile, and brings them up to date before
    use."""

    def __init__(self, model: nn.Module, layers: List[Layer],
                 pull: Callable[[Layer], None]):
        """`layers`: the resident blocks' layers of `model`; `pull(layer)`
        copies the layer's new weights into the model (waiting for its
        update)."""
        self._layers: Dict[int, Layer] = {l.index: l for l in layers}
        self._pull = pull
        self._stale: Set[int] = set()
        # A stale layer's parameters' own tensors, while they hold empty
        # ones.
        self._held: Dict[int, List[torch.Tensor]] = {}
        self._owner: Dict[int, int] = {id(p): l.index for l in layers
                                       for p in l.params}
        self._reads_pull = True
        self._hooks: List[Any] = []
        self._patched: List[nn.Module] = []
        for layer in layers:
            # The block and every module in it: a call, a state_dict() or
            # a load_state_dict() of any of them.
            before = _Pull(self, layer)
            for module in layer.block.modules():
                self._hooks += [
                    module.register_forward_pre_hook(before),
                    module.register_state_dict_pre_hook(before),
                    module.register_load_state_dict_pre_hook(before)]
        # Every module's named_parameters() (parameters() calls it),
        # zero_grad() and __getstate__ (copy.deepcopy, pickle, torch.save):
        # the model's, a container's of blocks, a block's or a module's
        # inside one.
        for module in model.modules():
            module.named_parameters = _Method(module,
                                              self._up_to_date_parameters)
            module.zero_grad = _Method(module, self._zero_grad)
            module.__getstate__ = _Method(module, self._state_of)
            self._patched.append(module)

    def _up_to_date_parameters(self, module: nn.Module, *args: Any,
                               **kwargs: Any
                               ) -> Iterator[Tuple[str, nn.Parameter]]:
        """`module`'s named_parameters, each stale block brought up to date
        before its parameters are yielded."""
        for name, param in _own_method(module, "named_parameters")(
                *args, **kwargs):
            index = self._owner.get(id(param))
            if index is not None and self._reads_pull:
                self.pull(self._layers[index])
            yield name, param

    def _zero_grad(self, module: nn.Module, set_to_none: bool = True) -> None:
        """The module's zero_grad, which reads no weights: waits for no
        update."""
        with self._without_pulls():
            _own_method(module, "zero_grad")(set_to_none)

    def _state_of(self, module: nn.Module) -> Dict[str, Any]:
        """What a copy or a pickle of `module` holds: every block up to
        date, and torch's own methods (these belong to this engine)."""
        self.pull_all()
        state = dict(_own_method(module, "__getstate__")())
        for name in _PATCHED:
            state.pop(name, None)
        for table in _HOOK_TABLES:
            if table in state:
                state[table] = type(state[table])(
                    (key, hook) for key, hook in state[table].items()
                    if not self._owns(getattr(hook, "hook", hook)))
        return state

    def _owns(self, hook: Any) -> bool:
        return isinstance(hook, _Pull) and hook.lazy is self

    @contextlib.contextmanager
    def _without_pulls(self) -> Iterator[None]:
        before, self._reads_pull = self._reads_pull, False
        try:
            yield
        finally:
            self._reads_pull = before

    def __contains__(self, layer: Layer) -> bool:
        return layer.index in self._layers

    def mark_stale(self) -> None:
        """A step ended: every tracked layer has new weights to fetch; its
        parameters are empty until then."""
        for index, layer in self._layers.items():
            if index not in self._held:
                self._held[index] = [p.data for p in layer.params]
                for param in layer.params:
                    param.data = torch.empty(0, dtype=param.dtype,
                                             device=param.device)
        self._stale = set(self._layers)

    def pull(self, layer: Layer) -> None:
        self._give_back(layer)
        if layer.index in self._stale:
            self._pull(layer)
            self._stale.discard(layer.index)

    def _give_back(self, layer: Layer) -> None:
        """The layer's parameters take their own tensors back (the
        previous weights, until the pull copies the new ones in)."""
        held: Optional[List[torch.Tensor]] = self._held.pop(layer.index,
                                                            None)
        if held is not None:
            for param, data in zip(layer.params, held):
                param.data = data

    def pull_all(self) -> None:
        """Every stale layer, in forward order."""
        for index in sorted(self._stale):
            self.pull(self._layers[index])

    def stale(self) -> List[Layer]:
        return [self._layers[index] for index in sorted(self._stale)]

    def remove(self) -> None:
        """The hooks and methods go; every layer has its tensors back."""
        for layer in self._layers.values():
            self._give_back(layer)
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        for module in self._patched:
            for name in _PATCHED:
                module.__dict__.pop(name, None)
        self._patched = []
