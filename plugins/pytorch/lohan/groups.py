"""lohan.init's param_groups and no_weight_decay as the daemon runs them:
(layer, begin, end) element ranges of the layers' flat vectors."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import (Callable, Dict, List, Mapping, Sequence, Set, Tuple)

import torch
from torch import nn

from lohan.blocks import Layer
from lohan.options import NoWeightDecayArg, ParamGroupsArg

Range = Tuple[int, int, int]  # (layer, begin, end)
Picks = Callable[[str, nn.Parameter], bool]


@dataclass
class ParamGroup:
    """One of lohan.init's param_groups, as the daemon runs it."""

    ids: Set[int]                       # id() of its parameters
    lr: float                           # at init
    weight_decay: float
    lr_scale: float                     # lr / the job's lr
    ranges: List[Range]


def ranges_of(layers: List[Layer], picks: Picks) -> List[Range]:
    """(layer, begin, end) element ranges of the trained parameters
    `picks` chooses, adjacent ones merged."""
    ranges: List[Range] = []
    for layer in layers:
        for name, param, offset, size in zip(layer.names, layer.params,
                                             layer.offsets, layer.sizes()):
            if not picks(name, param):
                continue
            end = offset + size
            if ranges and ranges[-1][0] == layer.index and (
                    ranges[-1][2] == offset):
                ranges[-1] = (layer.index, ranges[-1][1], end)
            else:
                ranges.append((layer.index, offset, end))
    return ranges


def exempt_ranges(model: nn.Module, layers: List[Layer],
                  rule: NoWeightDecayArg, grouped: Set[int]) -> List[Range]:
    """(layer, begin, end) element ranges updated without weight decay:
    the parameters `rule` picks, but for those in a param group (whose
    own weight_decay holds). None: none (torch AdamW with one group);
    "1d": every parameter with fewer than 2 dimensions (biases, norm
    weights: the usual fine-tuning recipe); a callable(name, param) ->
    bool; or parameter names (any of a tied one's names)."""
    if rule is None:
        return []
    picks: Picks
    if rule == "1d":
        picks = lambda name, param: param.dim() < 2  # noqa: E731
    elif callable(rule):
        picks = rule
    elif isinstance(rule, str):
        raise ValueError(f"no_weight_decay={rule!r}: use None, '1d', a "
                         "callable(name, param) or a list of names")
    else:
        names = set(rule)
        aliases = {name: id(param) for name, param in
                   model.named_parameters(remove_duplicate=False)}
        unknown = sorted(names - set(aliases))
        if unknown:
            raise ValueError("no_weight_decay names parameters the model "
                             f"does not have: {unknown[:5]}")
        chosen = {aliases[name] for name in names}
        picks = lambda name, param: id(param) in chosen  # noqa: E731
    return ranges_of(layers, lambda name, param: (
        id(param) not in grouped and picks(name, param)))


def param_groups(model: nn.Module, layers: List[Layer],
                 groups: ParamGroupsArg, lr: float,
                 weight_decay: float) -> List[ParamGroup]:
    """torch-style param groups, [{"params": [...], "lr": x,
    "weight_decay": y}, ...] (parameters or names): those parameters
    are trained with that lr and weight decay; the rest with lohan.init's
    `lr` and `weight_decay`. The daemon runs each group's lr as a fixed
    multiple of the job's (a schedule scales them all alike, as torch's
    schedulers do)."""
    if groups is None:
        return []
    if isinstance(groups, dict) or not isinstance(groups, (list, tuple)):
        raise TypeError("param_groups must be a list of dicts, as "
                        "torch.optim's")
    names = {id(p): name for layer in layers
             for name, p in zip(layer.names, layer.params)}
    aliases = dict(model.named_parameters(remove_duplicate=False))
    owner: Dict[int, int] = {}
    result: List[ParamGroup] = []
    for n, group in enumerate(groups):
        ids = _group_ids(n, group, names, aliases, owner)
        group_lr = float(group.get("lr", lr))
        wd = float(group.get("weight_decay", weight_decay))
        if not (group_lr >= 0 and math.isfinite(group_lr)) or not (
                wd >= 0 and math.isfinite(wd)):
            raise ValueError(f"param_groups[{n}]: lr {group_lr} and "
                             f"weight_decay {wd} must be finite and >= 0")
        if lr == 0 and group_lr != 0:
            raise ValueError(
                f"param_groups[{n}] has lr {group_lr} but lohan.init's lr "
                "is 0: a group runs at a fixed multiple of the job's lr")
        result.append(ParamGroup(
            ids=ids, lr=group_lr, weight_decay=wd,
            lr_scale=group_lr / lr if lr > 0 else 1.0,
            ranges=ranges_of(layers,
                             lambda name, param, ids=ids: id(param) in ids)))
    return result


def _group_ids(n: int, group: Mapping[str, object], names: Dict[int, str],
               aliases: Dict[str, nn.Parameter],
               owner: Dict[int, int]) -> Set[int]:
    """id() of the parameters of group `n`; `owner` notes which group
    holds each."""
    if not isinstance(group, dict) or "params" not in group:
        raise ValueError(f"param_groups[{n}] must be a dict with "
                         "'params'")
    unsupported = sorted(set(group) - {"params", "lr", "weight_decay"})
    if unsupported:
        raise ValueError(
            f"param_groups[{n}] sets {', '.join(unsupported)}: the "
            "daemon runs one of each per job (give it to lohan.init); "
            "a group may set only 'lr' and 'weight_decay'")
    params = group["params"]
    if isinstance(params, (torch.Tensor, str)):
        params = [params]
    ids: Set[int] = set()
    for item in params:
        param = aliases.get(item) if isinstance(item, str) else item
        if param is None:
            raise ValueError(f"param_groups[{n}] names {item!r}, "
                             "which the model does not have")
        if id(param) not in names:
            raise ValueError(
                f"param_groups[{n}] holds a parameter the engine does "
                "not train (frozen, or not this model's)")
        if owner.setdefault(id(param), n) != n:
            raise ValueError(
                f"param_groups[{owner[id(param)]}] and [{n}] both "
                f"hold {names[id(param)]}")
        ids.add(id(param))
    return ids


def check_optimizer_groups(groups: Sequence[Mapping[str, object]],
                           lr: float, betas: Tuple[float, float],
                           eps: float, weight_decay: float,
                           param_groups: List[ParamGroup]) -> None:
    """What a scheduler or the user set in engine.optimizer's groups
    must be what the daemon runs: the lr of group 0 drives the job
    (`lr`), the others keep their ratio to it; betas, eps and weight
    decay are the job's."""
    expected_decay = [weight_decay] + [g.weight_decay for g in param_groups]
    for n, group in enumerate(groups):
        for key, have, want in (
                ("betas", tuple(group["betas"]), betas),
                ("eps", group["eps"], eps),
                ("weight_decay", group["weight_decay"],
                 expected_decay[n])):
            if have != want:
                raise RuntimeError(
                    f"lohan: engine.optimizer's param group {n} has "
                    f"{key} {have}, but the daemon runs {want} for the "
                    "whole job (given to lohan.init); a scheduler that "
                    "cycles momentum needs that off (OneCycleLR("
                    "cycle_momentum=False))")
        if n == 0:
            continue
        scale = param_groups[n - 1].lr_scale
        want_lr = lr * scale
        if not math.isclose(group["lr"], want_lr, rel_tol=1e-9,
                            abs_tol=1e-300):
            raise RuntimeError(
                f"lohan: engine.optimizer's param group {n} has lr "
                f"{group['lr']}, not {want_lr} (its lr_scale "
                f"{scale} of group 0's {lr}): the daemon keeps each "
                "group's lr a fixed multiple of the job's, as schedulers "
                "that scale every group alike do")
