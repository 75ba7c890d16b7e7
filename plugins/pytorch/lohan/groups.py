"""lohan.init's param_groups and no_weight_decay as liblohan_client's
model cut takes them (the groups of a ModelDescription,
proto/model_cut.proto): parameters by name (tensors and callables
resolved here), turned into element ranges of the layers and checked by
the library; and the check that engine.optimizer's groups stay what the
daemon runs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence, Set, Tuple

import torch
from torch import nn

from lohan.blocks import Layer
from lohan.options import NoWeightDecayArg, ParamGroupsArg


@dataclass
class ParamGroup:
    """One of lohan.init's param_groups, as the daemon runs it."""

    ids: Set[int]                       # id() of its parameters
    lr: float                           # at init
    weight_decay: float
    lr_scale: float                     # lr / the job's lr


def exemptions(layers: List[Layer],
               rule: NoWeightDecayArg) -> Dict[str, Any]:
    """The parameters updated without weight decay (but for those in a
    param group, whose own weight_decay holds), as description fields.
    None: none (torch AdamW with one group); "1d": every parameter with
    fewer than 2 dimensions (biases, norm weights: the usual fine-tuning
    recipe); a callable(name, param) -> bool; or parameter names (any of a
    tied one's names)."""
    if rule is None:
        return {}
    if rule == "1d":
        return {"no_weight_decay_1d": True}
    if isinstance(rule, str):
        raise ValueError(f"no_weight_decay={rule!r}: use None, '1d', a "
                         "callable(name, param) or a list of names")
    if callable(rule):
        return {"no_weight_decay": [
            name for layer in layers
            for name, param in zip(layer.names, layer.params)
            if rule(name, param)]}
    return {"no_weight_decay": list(rule)}


def param_groups(model: nn.Module, layers: List[Layer],
                 groups: ParamGroupsArg, lr: float, weight_decay: float
                 ) -> Tuple[List[Dict[str, Any]], List[ParamGroup]]:
    """torch-style param groups, [{"params": [...], "lr": x,
    "weight_decay": y}, ...] (parameters or names): those parameters
    are trained with that lr and weight decay; the rest with lohan.init's
    `lr` and `weight_decay`. The daemon runs each group's lr as a fixed
    multiple of the job's (a schedule scales them all alike, as torch's
    schedulers do). Returns the description's requests and the groups."""
    if groups is None:
        return [], []
    if isinstance(groups, dict) or not isinstance(groups, (list, tuple)):
        raise TypeError("param_groups must be a list of dicts, as "
                        "torch.optim's")
    trained = {id(p): name for layer in layers
               for name, p in zip(layer.names, layer.params)}
    every = {id(p): name for name, p in
             model.named_parameters(remove_duplicate=False)}
    aliases = dict(model.named_parameters(remove_duplicate=False))
    requests, result = [], []
    for n, group in enumerate(groups):
        names = [_name_of(n, item, trained, every)
                 for item in _params_of(n, group)]
        group_lr = float(group.get("lr", lr))
        decay = float(group.get("weight_decay", weight_decay))
        requests.append({"params": names, "lr": group_lr,
                         "weight_decay": decay})
        ids = {id(aliases[name]) for name in names if name in aliases}
        result.append(ParamGroup(
            ids=ids, lr=group_lr, weight_decay=decay,
            lr_scale=group_lr / lr if lr > 0 else 1.0))
    return requests, result


def _params_of(n: int, group: Mapping[str, object]) -> Sequence[object]:
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
    return [params] if isinstance(params, (torch.Tensor, str)) else params


def _name_of(n: int, item: object, trained: Dict[int, str],
             every: Dict[int, str]) -> str:
    """A group's parameter by name: the library says what it names."""
    if isinstance(item, str):
        return item
    name = trained.get(id(item), every.get(id(item)))
    if name is None:
        raise ValueError(
            f"param_groups[{n}] holds a parameter the engine does "
            "not train (frozen, or not this model's)")
    return name


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
