"""How a model is cut into the daemon's layers: this module finds the
blocks and describes the parameters, liblohan_client cuts them
(lohan_model_cut.h, the cut the libtorch plugin gets too).

One layer per repeated block (the children of the model's block list) plus
two "rest" layers for the trainable parameters outside the blocks: those of
modules registered before the last block (embeddings), and those of modules
after it (final norm, head). The forward uses the second last and backward
hands it over first, so its update runs during backward, not after it like
the embeddings' (whose gradient comes last). A parameter object that several
modules share (tied weights) appears once, under its first name; one shared
between two blocks goes to a rest layer. Parameters are flattened in
`model.named_parameters()` order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from lohan.client import cut_model

BlocksArg = Union[None, str, nn.ModuleList, Sequence[nn.Module]]

def _is_repeated(modules: nn.ModuleList) -> bool:
    children = list(modules)
    return len(children) >= 2 and len({type(c) for c in children}) == 1


def _parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_blocks(model: nn.Module, blocks: BlocksArg = None) -> List[nn.Module]:
    """The model's repeated blocks, in order.

    `blocks=None` takes the nn.ModuleLists whose (two or more) children all
    have one class: the one with the most parameters, and every other one
    not inside it with at least a tenth of its parameters (an
    encoder-decoder's two stacks), in the model's module order; lists
    inside a chosen list's blocks (experts, sub-layers) are part of those
    blocks. A string names a submodule (`"transformer.h"`); a ModuleList or
    a sequence of modules is used as given."""
    if blocks is None:
        found = [(name, module) for name, module in model.named_modules()
                 if isinstance(module, nn.ModuleList)
                 and _is_repeated(module)]
        if not found:
            raise ValueError(
                f"lohan found no repeated blocks in {type(model).__name__}: "
                "no nn.ModuleList whose children (two or more) share one "
                "class. Name the blocks with lohan.init(model, blocks=...): "
                "a submodule path such as 'transformer.h', an nn.ModuleList "
                "or a list of modules")
        largest = max(_parameter_count(m) for _, m in found)
        chosen_names: List[str] = []
        for name, module in found:  # outer lists come before inner ones
            if _parameter_count(module) * 10 < largest:
                continue
            if any(name.startswith(outer + ".") for outer in chosen_names):
                continue
            chosen_names.append(name)
        lists = dict(found)
        return [block for name in chosen_names for block in lists[name]]
    if isinstance(blocks, str):
        try:
            found = model.get_submodule(blocks)
        except AttributeError as error:
            raise ValueError(
                f"blocks={blocks!r}: {type(model).__name__} has no such "
                f"submodule ({error})") from None
        if not isinstance(found, (nn.ModuleList, nn.Sequential)):
            raise TypeError(
                f"blocks={blocks!r} is a {type(found).__name__}; name an "
                "nn.ModuleList (or nn.Sequential) of blocks")
        chosen = list(found)
    elif isinstance(blocks, nn.Module) and not isinstance(
            blocks, (nn.ModuleList, nn.Sequential)):
        raise TypeError(
            f"blocks must be an nn.ModuleList, a list of modules or a "
            f"submodule path, got a {type(blocks).__name__}")
    else:
        chosen = list(blocks)
    if not chosen:
        raise ValueError("blocks= names an empty list of modules")
    inside = {id(m) for m in model.modules()}
    for index, block in enumerate(chosen):
        if not isinstance(block, nn.Module):
            raise TypeError(f"blocks[{index}] is a {type(block).__name__}, "
                            "not an nn.Module")
        if id(block) not in inside:
            raise ValueError(f"blocks[{index}] ({type(block).__name__}) is "
                             "not a submodule of the model")
    return chosen


@dataclass
class Layer:
    """One daemon layer: its parameters, flattened back to back."""

    index: int
    block: Optional[nn.Module]  # None for a rest layer
    # A block's unit layer (param_unit="sublayer"): the module whose
    # weights these are, and its place among the block's units (1, 2, ...);
    # None and 0 for the block's own layer (the whole block without units).
    unit: Optional[nn.Module] = None
    unit_index: int = 0
    names: List[str] = field(default_factory=list)
    params: List[nn.Parameter] = field(default_factory=list)
    offsets: List[int] = field(default_factory=list)
    # Each parameter's shape as registered: an offloaded parameter's tensor
    # is an empty placeholder between uses, so go by these, not by it.
    shapes: List[torch.Size] = field(default_factory=list)
    numel: int = 0

    def add(self, name: str, param: nn.Parameter) -> None:
        self.names.append(name)
        self.params.append(param)
        self.offsets.append(self.numel)
        self.shapes.append(param.shape)
        self.numel += param.numel()

    def sizes(self) -> List[int]:
        """Elements of each parameter (see shapes)."""
        return [shape.numel() for shape in self.shapes]


def after_the_blocks(model: nn.Module,
                      blocks: List[nn.Module]) -> Callable[[str], bool]:
    """Whether a parameter (by its first name) belongs to a module that
    comes after every block in the model's module order."""
    position = {id(m): i for i, (_, m) in enumerate(model.named_modules())}
    last = max((position[id(m)] for block in blocks for m in block.modules()
                if id(m) in position), default=-1)

    def after(name: str) -> bool:
        owner = name.rpartition(".")[0]
        module = model.get_submodule(owner) if owner else model
        return position.get(id(module), -1) > last
    return after


def plan_layers(model: nn.Module, blocks: List[nn.Module],
                units: Callable[[nn.Module], List[nn.Module]] = lambda _: []
                ) -> List[Layer]:
    """The layers liblohan_client cuts the model into (lohan_model_cut.h:
    layer 0 the rest before the blocks, layer 1 the rest after them, each
    absent when empty, then per block that has trainable parameters, in
    block order, its own layer and a layer per unit, `units(block)`: the
    modules whose weights stream on their own, params below the block),
    from the trainable parameters in `model.named_parameters()` order (each
    object once, under its first name: the name checkpoints use), each
    with the blocks that hold it."""
    holders: Dict[int, List[int]] = {}
    unit_of: Dict[int, int] = {}
    unit_modules: List[List[nn.Module]] = []
    for index, block in enumerate(blocks):
        for param in block.parameters():  # deduplicated within the block
            if param.requires_grad:
                holders.setdefault(id(param), []).append(index)
        unit_modules.append(units(block))
        for position, unit in enumerate(unit_modules[-1], start=1):
            for param in unit.parameters():
                unit_of[id(param)] = position
    is_after = after_the_blocks(model, blocks)
    trained = [(name, param) for name, param in model.named_parameters()
               if param.requires_grad]
    cut = cut_model({"blocks": len(blocks), "parameters": [
        {"name": name, "shape": list(param.shape),
         "blocks": holders.get(id(param), []), "after_blocks": is_after(name),
         "unit": unit_of.get(id(param), 0)}
        for name, param in trained]})
    layers = []
    for index, entry in enumerate(cut["layers"]):
        block = int(entry["block"])
        unit = int(entry.get("unit", 0))
        layer = Layer(index=index, block=blocks[block] if block >= 0 else None,
                      unit=unit_modules[block][unit - 1] if unit else None,
                      unit_index=unit)
        for position in entry["parameters"]:
            layer.add(*trained[position])
        layers.append(layer)
    return layers


def describe(model: nn.Module, layers: List[Layer]) -> Dict[str, Any]:
    """The ModelDescription (proto/model_cut.proto) of layers already cut,
    which cuts into the same layers again, with every name the model gives
    its parameters (a tied one's aliases; the untrained ones)."""
    names: Dict[int, List[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    trained = {id(p) for layer in layers for p in layer.params}
    untrained = [name for key, known in names.items() if key not in trained
                 for name in known]
    parameters: List[Dict[str, Any]] = []
    blocks = rests = 0
    previous: Optional[nn.Module] = None
    for layer in layers:
        if layer.block is None:
            rests += 1
        elif layer.block is not previous:
            blocks += 1
        previous = layer.block
        for name, param, shape in zip(layer.names, layer.params,
                                      layer.shapes):
            parameters.append({
                "name": name, "shape": list(shape),
                "aliases": [a for a in names.get(id(param), []) if a != name],
                "blocks": [blocks - 1] if layer.block is not None else [],
                "after_blocks": layer.block is None and rests == 2,
                "unit": layer.unit_index})
    return {"blocks": blocks, "parameters": parameters,
            "untrained": untrained}


_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}
WIRE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16",
              torch.float16: "fp16"}


def resolve_dtype(dtype: Union[None, str, torch.dtype],
                  layers: List[Layer]) -> torch.dtype:
    """The training dtype: the one asked for, else the parameters' own."""
    if dtype is None:
        found = {p.dtype for layer in layers for p in layer.params}
        if len(found) > 1:
            raise TypeError(
                "the model's trainable parameters mix dtypes "
                f"({', '.join(sorted(str(d) for d in found))}); pass "
                "lohan.init(..., dtype='fp32'|'bf16'|'fp16') or convert the "
                "model with model.to(dtype) first")
        chosen = found.pop()
    elif isinstance(dtype, str):
        if dtype.lower() not in _DTYPES:
            raise ValueError(f"dtype={dtype!r} is not supported; use 'fp32', "
                             "'bf16' or 'fp16'")
        chosen = _DTYPES[dtype.lower()]
    elif isinstance(dtype, torch.dtype):
        chosen = dtype
    else:
        raise TypeError(f"dtype must be a string or a torch.dtype, got "
                        f"{type(dtype).__name__}")
    if chosen not in WIRE_NAMES:
        raise TypeError(
            f"lohan trains fp32, bf16 or fp16 parameters; got {chosen}. "
            "Convert the model first (e.g. model.float() or "
            "model.to(torch.bfloat16)) or pass dtype='fp32'|'bf16'|'fp16'")
    return chosen
