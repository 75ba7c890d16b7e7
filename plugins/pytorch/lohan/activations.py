"""What happens to each block's activations between forward and backward.

Policies (`lohan.init(..., activations=...)`):
- "keep": torch's default; every intermediate stays in memory.
- "recompute": only each block's inputs are kept, where they are; backward
  recomputes the block's forward (torch.utils.checkpoint, non-reentrant).
- "offload" (the default on an accelerator; placement.activation_policy
  gives the default by device): as "recompute", and each block's input leaves
  the device: it goes to host memory (pinned; for a CPU model it already
  is there and stays put) up to `activation_host_bytes`, and beyond that to
  the daemon's SSDs through the job's arena (ACT_PUT); backward brings it
  back just before the block is recomputed. Activation memory on the device
  is then one block's intermediates.
- A plan: one mode per block (a list, in the blocks' order; what
  `lohanctl plan` decides per block): "offload" as above; "swap": nothing
  is recomputed, every tensor autograd saves inside the block (but its
  parameters and tensors under 64 KiB) goes to the same store as block
  inputs do (host memory, beyond the budget the SSDs) and comes back when
  backward needs it; "keep": torch's default for that block; or a list
  of per-tensor decisions ("device", "host", "ssd", "recompute"), one per
  tensor the block saves (planned.py).
- "auto": the first iteration runs as "offload" and profiles the device
  and every block (profile.py); lohand's planner then decides per saved
  tensor and the plan applies from the second iteration on.

The recompute of "offload" is our own autograd.Function (the input must be
handed to the store, which torch's checkpoint keeps in a closure). It
replays the forward with the RNG state and autocast settings of the
original run, so dropout and mixed precision recompute the same values;
its backward runs outside autocast, as a block's that was not recomputed
does (and as torch's checkpoint does), so the gradients are the same bits.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import (Any, Callable, ContextManager, Dict, List, Optional,
                    Sequence, Tuple)

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import checkpoint

from lohan.activation_store import ActivationStore, _Handle
from lohan.planned import DECISIONS, Stored, planned_forward, unpack
from lohan.sublayers import one_at_a_time, sublayers

POLICIES = ("keep", "recompute", "offload")
# The modes a plan gives each block.
BLOCK_MODES = ("offload", "swap", "keep")
# Saved tensors smaller than this stay where autograd keeps them (a norm's
# statistics, a mask): storing them would cost more than they hold.
_MIN_SWAP_BYTES = 64 * 1024


# ------------------------------------------------------------ recompute


def _autocast_state() -> List[Tuple[str, torch.dtype]]:
    state = []
    for device_type in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device_type):
            state.append((device_type, torch.get_autocast_dtype(device_type)))
    return state


def _autocast(state: List[Tuple[str, torch.dtype]]) -> ContextManager[None]:
    """Autocast as `state` (_autocast_state) records it."""
    stack = contextlib.ExitStack()
    for device_type, dtype in state:
        stack.enter_context(torch.autocast(device_type, dtype=dtype))
    return stack


# Marks where the Function's tensor outputs go among a block's output
# leaves (a leaf may itself be None).
_TENSOR = object()


class BlockPasses:
    """Tells the gradient router when a block's backward pass is complete.
    A block recomputed here is differentiated once per call (its own
    backward inside the outer one), so one outer backward can reach its
    parameters several times (a model called twice before one backward);
    the block's gradients are complete once every call of it that is
    still to be differentiated has been. `inner(block, last_call)` is a
    context held while one call's gradients accumulate (`last_call`: no
    other call of the block is left); `done(block)` says the block has
    no call left to differentiate. Calls whose graph is dropped without a
    backward stop counting when it goes (then the step hands the layer
    over)."""

    def __init__(self, inner: Callable[[nn.Module, bool], Any],
                 done: Callable[[nn.Module], None]):
        self._inner = inner
        self._done = done
        self._live: Dict[int, int] = {}

    def called(self, block: nn.Module, replay: "_Replay") -> None:
        key = id(block)
        self._live[key] = self._live.get(key, 0) + 1
        replay.finalizer = weakref.finalize(replay, self._forget, key)

    def _forget(self, key: int) -> None:
        self._live[key] -= 1

    def inner(self, block: nn.Module) -> Any:
        return self._inner(block, self._live.get(id(block), 0) == 1)

    def differentiated(self, block: nn.Module, replay: "_Replay") -> None:
        replay.finalizer.detach()
        key = id(block)
        self._live[key] -= 1
        if self._live[key] == 0:
            self._done(block)


class _Replay:
    """What a block's recompute needs besides its stored inputs."""

    def __init__(self, function: Callable, args_spec: Any,
                 leaves: List[Any], stored: List[int], store: ActivationStore,
                 weights: "_Weights"):
        self.function = function
        self.weights = weights
        self.args_spec = args_spec
        self.leaves = leaves      # non-stored leaves, None where stored
        self.stored = stored      # leaf positions of stored tensors
        self.store = store
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng: List[Tuple[int, torch.Tensor]] = []
        self.autocast = _autocast_state()
        self.output_spec: Any = None
        self.output_leaves: List[Any] = []  # _TENSOR where a tensor goes
        self.handles: List[_Handle] = []
        self.block: Optional[nn.Module] = None
        self.passes: Optional[BlockPasses] = None
        self.finalizer: Any = None
        self.differentiated = False
        self.observer: Any = None  # a profile.Profiler in its iteration

    def capture_cuda_rng(self, devices: Sequence[int]) -> None:
        self.cuda_rng = [(d, torch.cuda.get_rng_state(d)) for d in devices]

    def call(self, inputs: Sequence[torch.Tensor]) -> Any:
        leaves = list(self.leaves)
        for position, tensor in zip(self.stored, inputs):
            leaves[position] = tensor
        args, kwargs = pytree.tree_unflatten(leaves, self.args_spec)
        return self.function(*args, **kwargs)


class _OffloadedBlock(torch.autograd.Function):
    @staticmethod
    def forward(ctx, replay: _Replay, anchor: torch.Tensor,
                *inputs: torch.Tensor):
        del anchor  # makes the outputs require grad even if no input does
        observer = replay.observer
        with torch.no_grad(), replay.weights, (
                observer.forward(replay.block, inputs) if observer
                else contextlib.nullcontext()):
            output = replay.call(inputs)
        flat, replay.output_spec = pytree.tree_flatten(output)
        ctx.replay = replay
        ctx.needs_grad = [t.requires_grad for t in inputs]
        replay.handles = [replay.store.put(t) for t in inputs]
        tensors = tuple(t for t in flat if isinstance(t, torch.Tensor))
        ctx.mark_non_differentiable(
            *[t for t in tensors if not t.is_floating_point()])
        replay.output_leaves = [_TENSOR if isinstance(t, torch.Tensor)
                                else t for t in flat]
        return tensors

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        replay: _Replay = ctx.replay
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(
                "lohan: activations='offload' recomputes each block inside "
                "loss.backward() and accumulates its parameters' gradients "
                "there; torch.autograd.grad() or backward(inputs=...) "
                "through a block is not supported with it. Use "
                "activations='recompute' or 'keep' for that")
        if replay.differentiated:
            raise RuntimeError(
                "lohan: a block's backward ran a second time over the same "
                "forward (backward(retain_graph=True) twice): "
                "activations='offload' stores each block input for one "
                "backward. Run the forward again, or use "
                "activations='recompute' or 'keep'")
        replay.differentiated = True
        with (replay.observer.backward(replay.block) if replay.observer
              else contextlib.nullcontext()):
            return _OffloadedBlock._differentiate(replay, ctx.needs_grad,
                                                  grads)

    @staticmethod
    def _differentiate(replay: _Replay, needs_grad: List[bool],
                       grads: Sequence[torch.Tensor]) -> tuple:
        inputs = []
        for handle, needs in zip(replay.handles, needs_grad):
            tensor = replay.store.get(handle).detach()
            inputs.append(tensor.requires_grad_(needs))
        replay.handles = []
        devices = [d for d, _ in replay.cuda_rng]
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(
                devices=devices, enabled=True,
                device_type="cuda" if devices else "cpu"))
            torch.set_rng_state(replay.cpu_rng)
            for device, state in replay.cuda_rng:
                torch.cuda.set_rng_state(state, device)
            stack.enter_context(torch.enable_grad())
            # The weights stay until the block's backward is done (and its
            # gradients handed over).
            stack.enter_context(replay.weights)
            # Autocast around the recompute only, as torch's checkpoint
            # does: a backward run under autocast would cast its own
            # operators' inputs (SDPA's backward in bf16, say) and differ
            # from the backward of a block that was not recomputed.
            with _autocast(replay.autocast), (
                    replay.observer.recompute(replay.block)
                    if replay.observer else contextlib.nullcontext()):
                output = replay.call(inputs)
            flat = [t for t in pytree.tree_flatten(output)[0]
                    if isinstance(t, torch.Tensor)]
            outputs, output_grads = [], []
            for tensor, grad in zip(flat, grads):
                if tensor.requires_grad and grad is not None:
                    outputs.append(tensor)
                    output_grads.append(grad)
            if outputs:
                if replay.passes is not None:
                    stack.enter_context(replay.passes.inner(replay.block))
                stack.enter_context(replay.weights.differentiating())
                torch.autograd.backward(outputs, output_grads)
            # The recompute's graph goes before the weights are released:
            # what it saved (a sublayer's recompute keeps its weights)
            # would hold them past their release.
            del output, flat, outputs, output_grads
        if replay.passes is not None:
            replay.passes.differentiated(replay.block, replay)
        return (None, None, *[t.grad if needs else None
                              for t, needs in zip(inputs, needs_grad)])


# Keyword arguments through which Hugging Face blocks get a key/value cache.
_CACHE_KEYWORDS = ("past_key_value", "past_key_values", "layer_past", "cache")


def _is_cache(value: Any) -> bool:
    """A Hugging Face Cache object (by class name: no import needed)."""
    return any(c.__name__ == "Cache" for c in type(value).__mro__)


def _without_caches(args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """The call without its key/value cache, as Hugging Face does under
    gradient checkpointing: a block recomputed in backward would extend the
    cache a second time (and see a longer one). Training needs none."""
    if any(_is_cache(a) for a in args):
        args = tuple(None if _is_cache(a) else a for a in args)
    if any(k in kwargs for k in _CACHE_KEYWORDS + ("use_cache",)):
        kwargs = dict(kwargs)
        for key in _CACHE_KEYWORDS:
            if key in kwargs:
                kwargs[key] = None
        if "use_cache" in kwargs:
            kwargs["use_cache"] = False
    return args, kwargs


class _Weights:
    """`with weights:` holds a block's parameters materialized (see
    params.py); a no-op without parameter offload."""

    def __init__(self, block: nn.Module, residency: Any):
        self._block = block
        self._residency = residency

    def __enter__(self) -> None:
        if self._residency is not None:
            self._residency.materialize(self._block)

    def __exit__(self, *exc: Any) -> None:
        if self._residency is not None:
            self._residency.release(self._block)

    def differentiating(self) -> Any:
        """Held around the block's backward (see
        params.ParameterResidency.differentiating)."""
        if self._residency is None:
            return contextlib.nullcontext()
        return self._residency.differentiating(self._block)


def _offloaded_forward(original: Callable, store: ActivationStore,
                       anchor: torch.Tensor, warned: List[bool],
                       weights: _Weights, block: nn.Module,
                       passes: Optional[BlockPasses],
                       observer: Callable[[], Any]):
    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            with weights:
                return original(*args, **kwargs)
        args, kwargs = _without_caches(args, kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        positional = len(pytree.tree_flatten(args)[0])
        stored = [i for i, leaf in enumerate(leaves[:positional])
                  if isinstance(leaf, torch.Tensor)
                  and leaf.is_floating_point()]
        # A keyword tensor that needs a gradient would be cut off from it:
        # such a call falls back to torch's checkpoint (inputs kept).
        if any(isinstance(leaf, torch.Tensor) and leaf.requires_grad
               for leaf in leaves[positional:]):
            if not warned[0]:
                warned[0] = True
                warnings.warn("lohan: a block gets a keyword tensor that "
                              "needs a gradient; its inputs are kept in "
                              "place (recompute without offload)",
                              stacklevel=2)
            # Offloaded weights stay until step() releases them: the
            # checkpoint's recompute runs outside this wrapper.
            weights.__enter__()
            return checkpoint(original, *args, use_reentrant=False, **kwargs)
        inputs = [leaves[i] for i in stored]
        kept = [None if i in set(stored) else leaf
                for i, leaf in enumerate(leaves)]
        replay = _Replay(original, spec, kept, stored, store, weights)
        # Every GPU a tensor of the call is on (keyword ones too: a block
        # given its hidden states by keyword still draws dropout masks on
        # their device), else the current one if CUDA is in use: the
        # recompute must replay the same RNG.
        devices = sorted({
            leaf.device.index if leaf.device.index is not None
            else torch.cuda.current_device()
            for leaf in leaves
            if isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda"})
        if not devices and torch.cuda.is_initialized():
            devices = [torch.cuda.current_device()]
        if devices:
            replay.capture_cuda_rng(devices)
        replay.block = block
        replay.observer = observer()
        if passes is not None:
            replay.passes = passes
            passes.called(block, replay)
        tensors = _OffloadedBlock.apply(replay, anchor, *inputs)
        tensors = iter(tensors)
        flat = [next(tensors) if leaf is _TENSOR else leaf
                for leaf in replay.output_leaves]
        return pytree.tree_unflatten(flat, replay.output_spec)

    return forward


def _swapped_forward(original: Callable, store: ActivationStore,
                     block: nn.Module):
    """The block's forward with every tensor autograd saves in it (but its
    parameters and small ones) in `store` until backward needs it."""

    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        args, kwargs = _without_caches(args, kwargs)
        weights = {p.untyped_storage().data_ptr() for p in block.parameters()}

        def pack(tensor: torch.Tensor) -> Any:
            if (tensor.numel() * tensor.element_size() < _MIN_SWAP_BYTES
                    or tensor.untyped_storage().data_ptr() in weights):
                return tensor
            return Stored(store, store.put(tensor))

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return original(*args, **kwargs)

    return forward


def block_modes(policy: Any, blocks: int) -> List[Any]:
    """Each block's mode for `policy` (a policy name, or a plan: one mode
    per block, a name of BLOCK_MODES or a per-tensor list of DECISIONS);
    ValueError saying what is wrong."""
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(f"activations={policy!r} is not supported; use "
                             f"one of {', '.join(POLICIES)}, or a plan (one "
                             f"of {', '.join(BLOCK_MODES)} per block)")
        return [policy] * blocks
    modes = list(policy)
    if len(modes) != blocks:
        raise ValueError(f"activations: a plan has one mode per block; the "
                         f"model has {blocks} blocks, the plan {len(modes)}")
    for index, mode in enumerate(modes):
        if isinstance(mode, str):
            if mode not in BLOCK_MODES:
                raise ValueError(
                    f"activations: block {index}'s mode {mode!r} is not one "
                    f"of {', '.join(BLOCK_MODES)} (or a list of per-tensor "
                    f"decisions: {', '.join(DECISIONS)})")
            continue
        decisions = list(mode)
        unknown = [d for d in decisions if d not in DECISIONS]
        if unknown:
            raise ValueError(f"activations: block {index}'s decision "
                             f"{unknown[0]!r} is not one of "
                             f"{', '.join(DECISIONS)}")
        modes[index] = decisions
    return modes


def uses_store(policy: Any) -> bool:
    """Whether `policy` hands tensors to an ActivationStore."""
    if isinstance(policy, str):
        return policy == "offload"
    return any(not isinstance(mode, str) or mode in ("offload", "swap")
               for mode in policy)


class _PolicyForward:
    """The forward a policy sets on a block instance. A copy of the block
    (copy.deepcopy: an EMA or teacher model) or a pickled one
    (torch.save(model)) gets the block's own forward instead: the policy,
    its stores and its weights belong to this engine and this block."""

    def __init__(self, block: nn.Module, function: Callable):
        self._block = block
        self._function = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._function(*args, **kwargs)

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        twin = memo.get(id(self._block))
        return self if twin is None else _own_forward(twin)

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_own_forward, (self._block,))


def _own_forward(block: nn.Module) -> Callable:
    """The block's class forward, bound to it."""
    return type(block).forward.__get__(block)


def install(model: nn.Module, blocks: Sequence[nn.Module], policy: Any,
            store: Optional[ActivationStore] = None,
            residency: Any = None,
            passes: Optional[BlockPasses] = None,
            observer: Callable[[], Any] = lambda: None,
            unit: str = "block",
            stream_units: bool = False,
            sublayers_of: Callable[[nn.Module], List[nn.Module]] = sublayers
            ) -> Callable[[], None]:
    """Applies `policy` (a name, or a plan: one of BLOCK_MODES per block)
    to every block (`store` for "offload" and "swap"; with `residency`, a
    params.ParameterResidency, the blocks' weights are materialized around
    each run; `observer()`, the profile.Profiler of a profiling iteration
    or None, watches each "offload" block; `unit` "sublayer": a recomputed
    block's backward one sublayer at a time, sublayers.py, the sublayers
    `sublayers_of(block)`, which offloaded parameters, empty between uses,
    must find beforehand; with `stream_units` the residency holds each
    sublayer's weights around each of its runs, param_unit="sublayer");
    returns the function that undoes it."""
    modes = block_modes(policy, len(blocks))
    if all(mode == "keep" for mode in modes):
        return lambda: None
    if uses_store(modes) and store is None:
        raise ValueError("the offload policy needs an ActivationStore")
    if residency is not None and any(mode != "offload" for mode in modes):
        raise ValueError(f"params='offload' needs activations='offload' "
                         f"(with {policy!r} autograd would keep the "
                         "offloaded weights it saved for backward)")
    # A key/value cache built during forward would be extended a second time
    # when backward recomputes the block; training does not use it.
    config = getattr(model, "config", None)
    restore_cache = None
    if config is not None and getattr(config, "use_cache", False):
        restore_cache = config.use_cache
        config.use_cache = False
    anchor = torch.empty(0, requires_grad=True)
    warned = [False]
    originals: List[tuple] = []
    for block, mode in zip(blocks, modes):
        if mode == "keep":
            continue
        original = block.forward
        # A forward set on the instance before (someone else's wrapper)
        # goes back; else the class's shows through again.
        originals.append((block, block.__dict__.get("forward")))
        if unit == "sublayer" and mode in ("offload", "recompute"):
            original = one_at_a_time(
                original, sublayers_of(block),
                (lambda part: _Weights(part, residency)) if stream_units
                else None)
        if not isinstance(mode, str):  # per saved tensor
            block.forward = _PolicyForward(block, planned_forward(
                original, store, block, mode, _MIN_SWAP_BYTES,
                _without_caches))
            continue
        if mode == "swap":
            block.forward = _PolicyForward(
                block, _swapped_forward(original, store, block))
            continue
        if mode == "offload":
            block.forward = _PolicyForward(block, _offloaded_forward(
                original, store, anchor, warned, _Weights(block, residency),
                block, passes, observer))
            continue

        def forward(*args, _original=original, **kwargs):
            if not torch.is_grad_enabled():
                return _original(*args, **kwargs)
            args, kwargs = _without_caches(args, kwargs)
            return checkpoint(_original, *args, use_reentrant=False, **kwargs)

        block.forward = _PolicyForward(block, forward)

    def uninstall() -> None:
        for block, own in originals:
            if own is not None:
                block.forward = own
            elif isinstance(block.__dict__.get("forward"), _PolicyForward):
                del block.forward
        if restore_cache is not None:
            config.use_cache = restore_cache

    return uninstall
