"""overlap_step=True: the resident blocks' new weights are copied into the
model just before each block next runs, not at step().

The daemon answers ITER_END once the global norm has decided the step; the
updates still running then finish in forward order, and fetching a layer
waits for that layer's update only. With every layer copied at step(),
step() waits for all of them; with this, it returns after the layers
outside the blocks (needed first), and each block's copy (a forward
pre-hook) waits for its own update while the blocks before it compute.

Until a block runs again its parameters hold the previous step's weights:
code that reads them directly in between (an EMA of the weights, say)
must call engine.sync_weights() first. model.state_dict() does it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Set

from lohan.blocks import Layer


class LazyWeights:
    """Tracks which blocks' layers still hold the previous weights and
    brings them up to date before use."""

    def __init__(self, layers: List[Layer], pull: Callable[[Layer], None]):
        """`layers`: the resident blocks' layers; `pull(layer)` copies the
        layer's new weights into the model (waiting for its update)."""
        self._layers: Dict[int, Layer] = {l.index: l for l in layers}
        self._pull = pull
        self._stale: Set[int] = set()
        self._hooks: List[Any] = []
        for layer in layers:
            # Before the block runs, and before a state_dict() reaches it
            # (the model's own calls each block's).
            self._hooks.append(
                layer.block.register_forward_pre_hook(self._before(layer)))
            self._hooks.append(
                layer.block.register_state_dict_pre_hook(self._before(layer)))

    def _before(self, layer: Layer) -> Callable[..., None]:
        def hook(*args: Any, **kwargs: Any) -> None:
            self.pull(layer)
        return hook

    def __contains__(self, layer: Layer) -> bool:
        return layer.index in self._layers

    def mark_stale(self) -> None:
        """A step ended: every tracked layer has new weights to fetch."""
        self._stale = set(self._layers)

    def pull(self, layer: Layer) -> None:
        if layer.index in self._stale:
            self._pull(layer)
            self._stale.discard(layer.index)

    def pull_all(self) -> None:
        """Every stale layer, in forward order."""
        for index in sorted(self._stale):
            self.pull(self._layers[index])

    def stale(self) -> List[Layer]:
        return [self._layers[index] for index in sorted(self._stale)]

    def remove(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
