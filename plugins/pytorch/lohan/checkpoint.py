"""Checkpoints: safetensors files written layer by layer.

A checkpoint directory holds
- `model.safetensors`: the fp32 master weights by parameter name;
- `optimizer.safetensors` (optional): the Adam moments of every parameter,
  `exp_avg/<name>`, `exp_avg_sq/<name>` (and `max_exp_avg_sq/<name>` with
  AMSGrad), fp32;
- `lohan.json`: the job, the step (Adam steps taken), the layer plan and
  whether the optimizer state is there.

The writer streams: its header (every tensor's name, shape and offset) is
known before any data, so each layer's tensors are written as they are read
from the daemon, and memory never holds more than one layer. Files are
written beside their final name and renamed into place: a crash never
leaves a torn checkpoint.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import nn

WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
META_FILE = "lohan.json"
MOMENT_PREFIXES = ("exp_avg/", "exp_avg_sq/", "max_exp_avg_sq/")


class SafetensorsWriter:
    """Writes one safetensors file of fp32 tensors declared up front, whose
    data then arrives in declaration order (write())."""

    def __init__(self, path: Path, tensors: List[Tuple[str, torch.Size]],
                 metadata: Dict[str, str]):
        self._final = path
        self._partial = path.with_name(path.name + ".partial")
        header: Dict[str, Any] = {"__metadata__": metadata}
        offset = 0
        self._order: List[Tuple[str, int]] = []
        for name, shape in tensors:
            nbytes = 4 * int(torch.Size(shape).numel())
            header[name] = {"dtype": "F32", "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
            self._order.append((name, nbytes))
            offset += nbytes
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # data starts 8-aligned
        self._file = open(self._partial, "wb")
        self._file.write(struct.pack("<Q", len(encoded)) + encoded)
        self._next = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        expected, nbytes = self._order[self._next]
        if name != expected:
            raise RuntimeError(f"checkpoint: {name} written where {expected} "
                               "was declared")
        data = tensor.detach().to(torch.float32).contiguous().reshape(-1)
        if 4 * data.numel() != nbytes:
            raise RuntimeError(f"checkpoint: {name} has {4 * data.numel()} "
                               f"bytes, {nbytes} declared")
        self._file.write(data.numpy().tobytes())
        self._next += 1

    def close(self) -> None:
        if self._next != len(self._order):
            self._file.close()
            os.unlink(self._partial)
            raise RuntimeError(f"checkpoint: {len(self._order) - self._next} "
                               "declared tensors were not written")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._partial, self._final)

    def abandon(self) -> None:
        self._file.close()
        if self._partial.exists():
            os.unlink(self._partial)


def write_checkpoint(directory: Union[str, os.PathLike],
                     layers: Iterable[Any],
                     read_layer: Callable[[Any, str], torch.Tensor],
                     parts: List[str], meta: Dict[str, Any]) -> str:
    """Writes a checkpoint of `layers` (blocks.Layer). `read_layer(layer,
    part)` returns the layer's flat fp32 values of `part` ("weights",
    "exp_avg", ...): weights go to model.safetensors, the other parts to
    optimizer.safetensors. Returns the weights file's path."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    layers = list(layers)
    meta = dict(meta, optimizer_state=[p for p in parts if p != "weights"])
    metadata = {"format": "pt", "lohan_job": str(meta["job_name"]),
                "lohan_iteration": str(meta["iteration"])}

    def declare(prefixes: List[str]) -> List[Tuple[str, torch.Size]]:
        # Per layer, every part of it: the order the data is read in.
        return [(prefix + name, shape)
                for layer in layers for prefix in prefixes
                for name, shape in zip(layer.names, layer.shapes)]

    moments = [p for p in parts if p != "weights"]
    files = [(WEIGHTS_FILE, ["weights"])]
    if moments:
        files.append((OPTIMIZER_FILE, moments))
    for file_name, file_parts in files:
        prefixes = ["" if p == "weights" else p + "/" for p in file_parts]
        writer = SafetensorsWriter(path / file_name, declare(prefixes),
                                   metadata)
        try:
            for layer in layers:
                for part, prefix in zip(file_parts, prefixes):
                    flat = read_layer(layer, part)
                    for name, offset, shape in zip(
                            layer.names, layer.offsets, layer.shapes):
                        writer.write(prefix + name,
                                     flat[offset:offset + shape.numel()])
            writer.close()
        except BaseException:
            writer.abandon()
            raise
    if not moments and (path / OPTIMIZER_FILE).exists():
        os.unlink(path / OPTIMIZER_FILE)  # stale: from an earlier save
    meta_partial = path / (META_FILE + ".partial")
    meta_partial.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(meta_partial, path / META_FILE)
    return str(path / WEIGHTS_FILE)


class CheckpointReader:
    """A checkpoint directory, read tensor by tensor (nothing is loaded
    whole). Parameters are found under any of their names (tied weights are
    stored once, under the first)."""

    def __init__(self, directory: Union[str, os.PathLike]):
        from safetensors import safe_open

        self.path = Path(directory)
        weights = self.path / WEIGHTS_FILE
        if not weights.exists():
            raise FileNotFoundError(f"{weights} does not exist: not a lohan "
                                    "checkpoint (engine.save(dir) writes one)")
        meta_file = self.path / META_FILE
        self.meta: Dict[str, Any] = (json.loads(meta_file.read_text())
                                     if meta_file.exists() else {})
        self._weights = safe_open(str(weights), "pt")
        optimizer = self.path / OPTIMIZER_FILE
        self._optimizer = (safe_open(str(optimizer), "pt")
                           if optimizer.exists() else None)
        self.moments: List[str] = list(self.meta.get("optimizer_state", []))
        if self._optimizer is None:
            self.moments = []

    @property
    def iteration(self) -> int:
        return int(self.meta.get("iteration", 0))

    def find(self, aliases: List[str], part: str = "weights"
             ) -> Optional[torch.Tensor]:
        source = self._weights if part == "weights" else self._optimizer
        prefix = "" if part == "weights" else part + "/"
        names = set(source.keys())
        for name in aliases:
            if prefix + name in names:
                return source.get_tensor(prefix + name)
        return None


def parameter_aliases(model: nn.Module) -> Dict[int, List[str]]:
    """Every name of every parameter object (tied ones have several)."""
    aliases: Dict[int, List[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    return aliases


def load_state(model: nn.Module, directory: Union[str, os.PathLike],
               strict: bool = True) -> List[str]:
    """Loads `directory/model.safetensors` (written by engine.save) into
    `model`'s parameters, converting to each parameter's dtype. A tied
    parameter is found under any of its names. Returns the names of the
    model's parameters the file did not have (with strict=True, a missing
    one or an extra tensor is a ValueError). To train on from these weights
    with fresh Adam moments, call lohan.init(model, ...) afterwards; to keep
    the moments, pass the directory as lohan.init(..., resume=directory)."""
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
    aliases = parameter_aliases(model)
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
