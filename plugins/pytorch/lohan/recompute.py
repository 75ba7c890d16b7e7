"""What a block's forward computed, operator by operator, so that backward
can make one saved tensor again from the tensors it was made of instead of
keeping it: the recompute of a per-tensor plan, and the profile's
recompute cost of each saved tensor.

A `Recording` is a TorchDispatchMode held around one call of a block's
forward. It runs each operator as it comes and notes it as an `OpCall`
(the operator, its non-tensor arguments, and a `Value` for each tensor
argument); each tensor an operator returns becomes a `Value` naming that
call and its place among the outputs. Nothing is copied: a Value holds a
tensor only where backward may use it as it is (an `external` one: the
block's parameters and buffers, what its call got by keyword) or where a
saved-tensor hook keeps it (`saved`).

A Value can be made again in backward (`Replay.value`) when every path
back from it ends in a kept or external Value and no operator on the way
draws random numbers; a Value whose storage was written in place after it
was made (`stale`) is made again from its operator, never taken from the
tensor that now holds other values. Replays run without autograd and
without autocast (the recorded operators already carry autocast's dtypes),
so they give the bits of the original forward.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional
from typing import Sequence, Set, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

# Paths back through more operators than this are not followed (treated as
# not recomputable): a block is some dozens of operators deep.
_MAX_DEPTH = 400


def tensor_key(tensor: torch.Tensor) -> Optional[tuple]:
    """Identity of a tensor's values: its storage, offset, shape, stride
    and dtype (views of one storage differ); None for tensors without a
    plain storage."""
    try:
        offset = tensor.storage_offset()
        storage = tensor.data_ptr() - offset * tensor.element_size()
    except (RuntimeError, NotImplementedError):
        return None
    return (storage, offset, tuple(tensor.shape), tuple(tensor.stride()),
            tensor.dtype, tensor.device)


class OpCall:
    """One operator call of the forward. `leaves` are its flattened
    arguments with each tensor replaced by its Value; `written` the leaf
    positions the operator writes (in place, out=)."""

    __slots__ = ("func", "spec", "leaves", "flops", "random", "written")

    def __init__(self, func: Any, spec: Any, leaves: List[Any], flops: float,
                 random: bool, written: Set[int]):
        self.func = func
        self.spec = spec
        self.leaves = leaves
        self.flops = flops
        self.random = random
        self.written = written

    def inputs(self) -> Iterator["Value"]:
        return (leaf for leaf in self.leaves if isinstance(leaf, Value))


class Value:
    """One tensor value of the forward: made by `call` (output `index`),
    or from outside the block (`call` None). `external`: a tensor backward
    may use as it is. `saved`: set by a saved-tensor hook that keeps the
    tensor (where it is or in a store), a function giving it in backward."""

    __slots__ = ("call", "index", "external", "saved", "stale", "name",
                 "layout")

    def __init__(self, tensor: torch.Tensor, call: Optional[OpCall] = None,
                 index: int = 0, external: Optional[torch.Tensor] = None):
        self.call = call
        self.index = index
        self.external = external
        self.saved: Optional[Callable[[], torch.Tensor]] = None
        self.stale = False
        self.name = str(call.func.overloadpacket) if call else "input"
        # Its shape and strides: a kept tensor that comes back from a store
        # (contiguous) is laid out so again before an operator is replayed
        # on it (a view, say, that only works on those strides).
        self.layout = (tuple(tensor.shape), tuple(tensor.stride()))

    def held_tensor(self) -> torch.Tensor:
        """The kept or external tensor, laid out as it was recorded (with
        the gaps between its elements, if it had any, left unset; an
        overlapping layout, an expanded one, is left as it comes)."""
        tensor = self.saved() if self.saved is not None else self.external
        shape, stride = self.layout
        if ((tuple(tensor.shape), tuple(tensor.stride())) != self.layout
                and _non_overlapping(shape, stride)):
            span = 1 + sum((n - 1) * st for n, st in zip(shape, stride))
            if min(shape, default=1) == 0:
                span = 0
            base = torch.empty(span, dtype=tensor.dtype, device=tensor.device)
            tensor = base.as_strided(shape, stride).copy_(tensor)
        return tensor

    def held(self) -> bool:
        """Backward can take it as it is, without recomputing it."""
        return not self.stale and (self.saved is not None
                                   or self.external is not None)


def _non_overlapping(shape: Tuple[int, ...],
                     stride: Tuple[int, ...]) -> bool:
    """Whether the strides give every element its own place (a permuted
    contiguous tensor, or a view with gaps such as one of q, k, v split
    from one product; not an expanded one)."""
    reach = 1
    for step, size in sorted((st, sz) for sz, st in zip(shape, stride)
                             if sz != 1):
        if step < reach:
            return False
        reach = step * size
    return True


def _flatten(args: tuple, kwargs: dict) -> Tuple[List[Any], tuple]:
    """An operator's arguments as leaves and the shape to rebuild them:
    aten arguments are values or lists of them (a TensorList), never
    deeper (pytree would do, at several times the cost per call)."""
    leaves: List[Any] = []
    lengths = []
    for value in itertools.chain(args, kwargs.values()):
        if isinstance(value, (list, tuple)):
            lengths.append(len(value))
            leaves.extend(value)
        else:
            lengths.append(-1)
            leaves.append(value)
    return leaves, (len(args), tuple(kwargs), tuple(lengths))


def _unflatten(leaves: List[Any], spec: tuple) -> Tuple[list, dict]:
    positional, keys, lengths = spec
    values, at = [], 0
    for length in lengths:
        if length < 0:
            values.append(leaves[at])
            at += 1
        else:
            values.append(list(leaves[at:at + length]))
            at += length
    return values[:positional], dict(zip(keys, values[positional:]))


def _outputs(out: Any) -> List[Any]:
    """An operator's results as a flat list (a tensor, or a tuple of
    tensors and tensor lists)."""
    if isinstance(out, (list, tuple)):
        flat: List[Any] = []
        for item in out:
            if isinstance(item, (list, tuple)):
                flat.extend(item)
            else:
                flat.append(item)
        return flat
    return [out]


class _OpFacts:
    """What does not change between calls of one operator overload."""

    __slots__ = ("written", "counter", "aliases", "seeded", "packet")

    def __init__(self, func: Any):
        schema = getattr(func, "_schema", None)
        arguments = schema.arguments if schema is not None else []
        # The names of the arguments it writes (in place, out=).
        self.written = {a.name for a in arguments
                        if a.alias_info is not None and a.alias_info.is_write}
        self.packet = getattr(func, "overloadpacket", None)
        self.counter = flop_registry.get(self.packet)
        # Every result is a view of (or is) an input: no arithmetic.
        self.aliases = bool(schema is not None and schema.returns and all(
            r.alias_info is not None for r in schema.returns))
        self.seeded = (torch.Tag.nondeterministic_seeded
                       in getattr(func, "tags", ()))


_FACTS: Dict[Any, _OpFacts] = {}


def _facts(func: Any) -> _OpFacts:
    facts = _FACTS.get(func)
    if facts is None:
        facts = _FACTS[func] = _OpFacts(func)
    return facts


def _written_positions(func: Any, facts: _OpFacts, args: tuple,
                       kwargs: dict) -> Set[int]:
    """Leaf positions (of _flatten) of the tensors `func` writes."""
    if not facts.written:
        return set()
    names = [a.name for a in func._schema.arguments][:len(args)]
    names += list(kwargs)
    positions: Set[int] = set()
    offset = 0
    for name, value in zip(names, itertools.chain(args, kwargs.values())):
        count = len(value) if isinstance(value, (list, tuple)) else 1
        if name in facts.written:
            positions.update(range(offset, offset + count))
        offset += count
    return positions


def _flops(func: Any, args: tuple, kwargs: dict, out: Any,
           facts: Optional[_OpFacts] = None) -> float:
    """The operator's FLOPs: torch's counts for matrix products, attention
    and convolutions; views none; anything else one per output element."""
    facts = facts or _facts(func)
    if facts.counter is not None:
        try:
            return float(facts.counter(*args, **kwargs, out_val=out))
        except Exception:  # an argument pattern the formula does not know
            pass
    if facts.aliases:
        return 0.0  # a view or an in-place op returning its input
    return float(sum(t.numel() for t in _outputs(out)
                     if isinstance(t, torch.Tensor)))


def _draws_random(func: Any, facts: _OpFacts, args: tuple,
                  kwargs: dict) -> bool:
    """Whether this call of a seeded operator draws random numbers: not
    attention or dropout with probability 0 (or dropout outside
    training), which are deterministic whatever their tags say."""
    if not facts.seeded:
        return False
    schema = getattr(func, "_schema", None)
    if schema is None:
        return True
    named = {a.name: v for a, v in zip(schema.arguments, args)}
    named.update(kwargs)
    if "dropout_p" in named:
        return named["dropout_p"] != 0
    if facts.packet is torch.ops.aten.native_dropout:
        return bool(named.get("train", True)) and named.get("p", 1) != 0
    return True


class Recording(TorchDispatchMode):
    """Records the operators of one call of a block's forward (see the
    module's doc). `available`: tensors backward may use as they are."""

    def __init__(self, available: Iterable[torch.Tensor] = ()):
        super().__init__()
        self._values: Dict[tuple, Value] = {}
        # Storage -> keys of the Values over it (to mark them stale).
        self._by_storage: Dict[int, Set[tuple]] = {}
        self._available: Dict[int, Set[tuple]] = {}
        for tensor in available:
            key = tensor_key(tensor)
            if key is not None:
                self._available.setdefault(key[0], set()).add(key)
        self.flops = 0.0  # of every operator recorded
        self.failed: Optional[BaseException] = None
        self._paused = 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Operators run inside are not recorded (a hook's own copies)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self._paused and self.failed is None:
            try:
                self._record(func, args, kwargs, out)
            except Exception as error:  # never fails the training step:
                self.failed = error     # nothing is recomputable then
        return out

    def value_of(self, tensor: torch.Tensor) -> Value:
        """The Value `tensor` holds now (made by the forward, external, or
        from outside the block)."""
        key = tensor_key(tensor)
        value = self._values.get(key) if key is not None else None
        if value is None:
            external = (key is not None
                        and key in self._available.get(key[0], ()))
            value = Value(tensor, external=tensor if external else None)
            if key is not None:
                self._remember(key, value)
        return value

    def _remember(self, key: tuple, value: Value) -> None:
        self._values[key] = value
        self._by_storage.setdefault(key[0], set()).add(key)

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        facts = _facts(func)
        flat, spec = _flatten(args, kwargs)
        written = _written_positions(func, facts, args, kwargs)
        leaves = [self.value_of(leaf) if isinstance(leaf, torch.Tensor)
                  else leaf for leaf in flat]
        flops = _flops(func, args, kwargs, out, facts)
        self.flops += flops
        call = OpCall(func, spec, leaves, flops,
                      _draws_random(func, facts, args, kwargs), written)
        # Whatever shares the storage of a tensor written here no longer
        # holds the values its Value stands for: those Values are stale
        # (made again only from their operators), and the tensors now
        # stand for nothing known (but what this call returns).
        for position in written:
            key = tensor_key(flat[position])
            if key is None:
                continue
            for other in self._by_storage.pop(key[0], ()):
                self._values.pop(other).stale = True
        for index, tensor in enumerate(_outputs(out)):
            if isinstance(tensor, torch.Tensor):
                key = tensor_key(tensor)
                if key is not None:
                    self._remember(key, Value(tensor, call, index))


def recompute_flops(values: Sequence[Value]) -> Optional[float]:
    """FLOPs to make `values` (tensors over one storage, made again
    together) from held Values, each operator on the way counted once;
    None if one cannot be made again."""
    roots = {id(value) for value in values}
    seen: Set[int] = set()
    total = 0.0

    def visit(current: Value, depth: int) -> bool:
        nonlocal total
        if id(current) not in roots and current.held():
            return True
        call = current.call
        if call is None or call.random or depth > _MAX_DEPTH:
            return False
        if id(call) in seen:
            return True
        seen.add(id(call))
        total += call.flops
        return all(visit(v, depth + 1) for v in call.inputs())

    return total if all(visit(value, 0) for value in values) else None


class Replay:
    """Makes recorded Values again in backward, each operator once (its
    outputs kept until the Replay goes: the block's backward)."""

    def __init__(self) -> None:
        self._outputs: Dict[int, List[Any]] = {}

    def value(self, value: Value, root: bool = True) -> torch.Tensor:
        if not root and value.held():
            return value.held_tensor()
        call = value.call
        outputs = self._outputs.get(id(call))
        if outputs is None:
            outputs = self._outputs[id(call)] = self._run(call)
        return outputs[value.index]

    def _run(self, call: OpCall) -> List[Any]:
        leaves = []
        for position, leaf in enumerate(call.leaves):
            if isinstance(leaf, Value):
                leaf = self.value(leaf, root=False)
                if position in call.written:  # the recorded input stays
                    leaf = leaf.clone()
            leaves.append(leaf)
        args, kwargs = _unflatten(leaves, call.spec)
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            for device_type in ("cpu", "cuda"):
                stack.enter_context(torch.autocast(device_type,
                                                   enabled=False))
            out = call.func(*args, **kwargs)
        return _outputs(out)
