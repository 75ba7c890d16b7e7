"""Checkpoints: the fp32 master weights as safetensors, by parameter name."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Union

import torch
from torch import nn

WEIGHTS_FILE = "model.safetensors"
META_FILE = "lohan.json"


def save_checkpoint(directory: Union[str, os.PathLike],
                    weights: Dict[str, torch.Tensor],
                    meta: Dict[str, Any]) -> str:
    from safetensors.torch import save_file

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    target = path / WEIGHTS_FILE
    # Write beside, then rename: a crash never leaves a torn checkpoint.
    partial = path / (WEIGHTS_FILE + ".partial")
    save_file({k: v.contiguous() for k, v in weights.items()}, str(partial),
              metadata={"format": "pt", "lohan_job": str(meta["job_name"]),
                        "lohan_iteration": str(meta["iteration"])})
    os.replace(partial, target)
    meta_partial = path / (META_FILE + ".partial")
    meta_partial.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(meta_partial, path / META_FILE)
    return str(target)


def load_state(model: nn.Module, directory: Union[str, os.PathLike],
               strict: bool = True) -> List[str]:
    """Loads `directory/model.safetensors` (written by engine.save) into
    `model`'s parameters, converting to each parameter's dtype. A tied
    parameter is found under any of its names. Returns the names of the
    model's parameters the file did not have (with strict=True, a missing
    one or an extra tensor is a ValueError). To train on from these weights
    with fresh Adam moments, call lohan.init(model, ...) afterwards; to keep
    the moments, resume the job instead (lohan.init(..., resume=True))."""
    from safetensors.torch import load_file

    file = Path(directory) / WEIGHTS_FILE
    if Path(directory).is_file():
        file = Path(directory)
    if not file.exists():
        raise FileNotFoundError(f"{file} does not exist; engine.save(dir) "
                                "writes it")
    stored = load_file(str(file))
    used = set()
    missing: List[str] = []
    aliases: Dict[int, List[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    with torch.no_grad():
        for name, param in model.named_parameters():
            found = next((n for n in aliases[id(param)] if n in stored), None)
            if found is None:
                missing.append(name)
                continue
            value = stored[found]
            if value.shape != param.shape:
                raise ValueError(f"{file}: {found} has shape "
                                 f"{tuple(value.shape)}, the model's {name} "
                                 f"{tuple(param.shape)}")
            param.copy_(value)
            used.update(n for n in aliases[id(param)] if n in stored)
    extra = sorted(set(stored) - used)
    if strict and (missing or extra):
        raise ValueError(f"{file} does not match the model: missing "
                         f"{missing[:5]}, unexpected {extra[:5]}")
    return missing
