"""A new job's starting weights from a checkpoint (lohan.init(model,
weights=PATH)): which stored tensor each of the model's parameters and
buffers comes from, checked before any job is made, and a model built on
the meta device given storage where it computes.

Names are matched as transformers' from_pretrained matches them: a
parameter's own name or any of its tied names, with or without the model's
`base_model_prefix`; a tied head absent from the checkpoint is its
embedding's. Stored tensors the model does not have are refused, but for
the ones the model's `_keys_to_ignore_on_load_unexpected` names.

Materializing (`materialize`) never touches the offloaded blocks' trained
weights: the daemon gets them a layer at a time from the checkpoint
(weights.py) and they stay there. What the training process keeps gets its
storage here: the trained parameters it keeps (filled through the daemon,
layer by layer), the frozen parameters (read from the checkpoint: the
blocks' ones into host memory, their home under params="offload") and the
buffers (read from the checkpoint, or made as the model's constructor
makes them: transformers' `_init_weights`, as its from_pretrained does)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Dict, FrozenSet, Iterable, List, Optional, Set

import torch
from torch import nn

from lohan.checkpoint import CheckpointReader
from lohan.placement import Placement

# Stored dtypes that hold weights (safetensors' names).
FLOAT_DTYPES = ("F32", "BF16", "F16")


class CheckpointMismatch(ValueError):
    """A checkpoint that is not of this model: a tensor missing, extra, of
    another shape or of a dtype that holds no weights."""


# A peft model's names for its base model's tensors: the wrapper's prefix,
# and a layer it adapted holds the original as `base_layer`.
_PEFT_PREFIX = "base_model.model."
_PEFT_BASE_LAYER = re.compile(r"\.base_layer(?=\.)")


def base_model_name(name: str) -> str:
    """A peft model's name of one of its base model's tensors as the base
    model names it; any other name as it is."""
    if not name.startswith(_PEFT_PREFIX):
        return name
    return _PEFT_BASE_LAYER.sub("", name[len(_PEFT_PREFIX):])


def _candidates(name: str, prefix: str) -> List[str]:
    """The stored names `name` may have: itself (as the base model names it,
    for a peft model), and with the base model's prefix taken off or put
    on (a checkpoint of the base model loads into one with a head, and
    back)."""
    name = base_model_name(name)
    if not prefix:
        return [name]
    if name.startswith(prefix + "."):
        return [name, name[len(prefix) + 1:]]
    return [name, f"{prefix}.{name}"]


def inner_model(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (the model itself
    otherwise)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


class StoredNames:
    """Which stored tensor each of `model`'s parameters and persistent
    buffers comes from, checked against `reader`'s tensors (CheckpointMismatch
    naming every difference, the checkpoint's path first)."""

    def __init__(self, model: nn.Module, reader: CheckpointReader) -> None:
        self._reader = reader
        stored = {entry["name"]: entry for entry in reader.entries()}
        prefix = str(getattr(inner_model(model), "base_model_prefix", "")
                     or "")
        self._by_param: Dict[int, str] = {}
        self._by_buffer: Dict[str, str] = {}
        problems: List[str] = []
        used: Set[str] = set()

        names: Dict[int, List[str]] = {}
        params: Dict[int, nn.Parameter] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)
            params[id(param)] = param
        missing: List[str] = []
        for key, aliases in names.items():
            found = self._find(aliases, prefix, stored)
            if found is None:
                # One with values of its own (a peft adapter) keeps them.
                if params[key].is_meta:
                    missing.append(aliases[0])
                continue
            used.add(found)
            self._by_param[key] = found
            problems += self._check(found, stored[found],
                                    tuple(params[key].shape), aliases[0])
        param_names = {n for ns in names.values() for n in ns}
        persistent = {name for name in model.state_dict(keep_vars=True)
                      if name not in param_names}
        for name, buffer in model.named_buffers(remove_duplicate=False):
            found = self._find([name], prefix, stored)
            if found is None:
                if name in persistent and buffer.is_meta and not (
                        _makes_buffers(model)):
                    missing.append(name)
                continue
            used.add(found)
            self._by_buffer[name] = found
            problems += self._check(found, stored[found], tuple(buffer.shape),
                                    name)
        self.dtype = _most_common_dtype(
            [stored[name].get("dtype") for name in used])
        ignored = [re.compile(pattern) for pattern in (
            getattr(inner_model(model), "_keys_to_ignore_on_load_unexpected",
                    None) or [])]
        unexpected = sorted(
            name for name in stored if name not in used
            and not any(pattern.search(name) for pattern in ignored))
        if missing:
            problems.insert(0, f"missing {_listed(missing)}")
        if unexpected:
            problems.append(f"unexpected (the model has no such tensor) "
                            f"{_listed(unexpected)}")
        if problems:
            raise CheckpointMismatch(
                f"{reader.path} is not a checkpoint of this "
                f"{type(model).__name__}: {'; '.join(problems)}")

    @staticmethod
    def _find(aliases: Iterable[str], prefix: str,
              stored: Dict[str, dict]) -> Optional[str]:
        for alias in aliases:
            for candidate in _candidates(alias, prefix):
                if candidate in stored:
                    return candidate
        return None

    @staticmethod
    def _check(found: str, entry: dict, shape: tuple, name: str) -> List[str]:
        problems = []
        if tuple(entry["shape"]) != shape:
            problems.append(f"{found} has shape {tuple(entry['shape'])}, the "
                            f"model's {name} {shape}")
        dtype = entry.get("dtype")
        if dtype is not None and dtype not in FLOAT_DTYPES:
            problems.append(f"{found} is stored as {dtype}, which lohan does "
                            f"not read as weights (it reads "
                            f"{', '.join(FLOAT_DTYPES)})")
        return problems

    def aliases(self, model: nn.Module) -> Dict[int, List[str]]:
        """Every name of every parameter object, the stored one among them
        (what checkpoint.restore looks a layer's parameters up by)."""
        aliases: Dict[int, List[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(param), []).append(name)
        for key, found in self._by_param.items():
            if found not in aliases[key]:
                aliases[key].append(found)
        return aliases

    def stores(self, param: nn.Parameter) -> bool:
        """Whether the checkpoint holds the parameter (else its values are
        its own: a peft adapter's)."""
        return id(param) in self._by_param

    def read_parameter(self, param: nn.Parameter) -> torch.Tensor:
        """The parameter's stored values, as fp32."""
        return self._reader.find([self._by_param[id(param)]])

    def read_buffer(self, name: str) -> Optional[torch.Tensor]:
        """The buffer's stored values (fp32), None when not stored."""
        found = self._by_buffer.get(name)
        return None if found is None else self._reader.find([found])


_TORCH_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16,
                 "F16": torch.float16}


def _most_common_dtype(stored: List[Optional[str]]) -> Optional[torch.dtype]:
    """The floating-point dtype most of the model's stored tensors have
    (None when the reader does not say)."""
    counts = Counter(name for name in stored if name in _TORCH_DTYPES)
    return _TORCH_DTYPES[counts.most_common(1)[0][0]] if counts else None


def _listed(names: List[str]) -> str:
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return ", ".join(names[:5]) + more


def _makes_buffers(model: nn.Module) -> bool:
    """Whether the model can make a buffer the checkpoint does not hold as
    its constructor does (a transformers model: `_init_weights`)."""
    return callable(getattr(model, "_init_weights", None))


def is_on_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters()) or any(
        b.is_meta for b in model.buffers())


def materialize(model: nn.Module, where: Placement,
                names: StoredNames) -> Set[int]:
    """Gives a model built on the meta device storage where it computes
    (see the module's doc): buffers first (an `_init_weights` call may
    touch its module's parameters), then parameters, each Parameter object
    kept (torch.utils.swap_tensors: a meta tensor's data cannot be set).
    The offloaded blocks' parameters, trained and frozen, get stand-ins of
    their shape and the training dtype holding one element: the daemon
    holds the trained ones' values, and the frozen ones' are read when
    their home is made (Weights.offload: host memory or lohand's SSDs);
    returns the stand-ins' ids. ValueError naming a buffer that is neither
    stored nor made by the model."""
    _materialize_buffers(model, where.device, names)
    trained = {id(p) for layer in where.layers for p in layer.params}
    in_blocks = ({id(p) for block in where.blocks for p in block.parameters()}
                 if where.params_mode == "offload" else set())
    stand_ins: Set[int] = set()
    with torch.no_grad():
        for param in model.parameters():
            if not param.is_meta:
                continue
            if id(param) in in_blocks:
                stand_ins.add(id(param))
                dtype = (where.dtype if param.is_floating_point()
                         else param.dtype)
                _swap(param, torch.zeros((), dtype=dtype,
                                         device=where.device).expand(
                                             param.shape))
                continue
            _swap(param, torch.empty(param.shape, dtype=param.dtype,
                                     device=where.device))
            if id(param) not in trained:
                param.copy_(names.read_parameter(param))
    return stand_ins


def _swap(param: nn.Parameter, data: torch.Tensor) -> None:
    """`param` (the same object: layers, ties and hooks hold it) takes
    `data`."""
    torch.utils.swap_tensors(
        param, nn.Parameter(data, requires_grad=param.requires_grad))


def _materialize_buffers(model: nn.Module, device: torch.device,
                         names: StoredNames) -> None:
    made_by_model: List[nn.Module] = []
    with torch.no_grad():
        for module_name, module in model.named_modules():
            for name, buffer in list(module._buffers.items()):
                if buffer is None or not buffer.is_meta:
                    continue
                full = f"{module_name}.{name}" if module_name else name
                real = torch.empty(buffer.shape, dtype=buffer.dtype,
                                   device=device)
                module._buffers[name] = real
                stored = names.read_buffer(full)
                if stored is not None:
                    real.copy_(stored)
                elif _makes_buffers(model):
                    if module not in made_by_model:
                        made_by_model.append(module)
                else:
                    raise ValueError(
                        f"lohan: buffer {full} is on the meta device and "
                        "the checkpoint does not hold it; build the model "
                        "with its buffers on the CPU (accelerate's "
                        "init_empty_weights(include_buffers=False) does) "
                        "or save the buffer with the weights")
        for module in made_by_model:
            model._init_weights(module)




class MetaHome:
    """What a model had on the meta device, put back there at close (it
    would not fit the process whole): those parameters and buffers become
    meta tensors of their shapes again, the Parameter objects the same.
    The rest (a peft adapter made with values) is the engine's to give
    back as usual."""

    def __init__(self, model: nn.Module) -> None:
        self._params = {id(p): (p, p.shape) for p in model.parameters()
                        if p.is_meta}
        self._buffers = [(module, name, buffer.shape)
                         for module in model.modules()
                         for name, buffer in module._buffers.items()
                         if buffer is not None and buffer.is_meta]

    @property
    def ids(self) -> FrozenSet[int]:
        """The ids of the parameters given on meta."""
        return frozenset(self._params)

    def give_back(self) -> None:
        for param, shape in self._params.values():
            _swap(param, torch.empty(shape, dtype=param.dtype,
                                     device="meta"))
        for module, name, shape in self._buffers:
            module._buffers[name] = torch.empty(
                shape, dtype=module._buffers[name].dtype, device="meta")
