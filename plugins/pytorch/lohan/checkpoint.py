"""Checkpoints, through liblohan_client (client/checkpoint; the format and
the all-or-nothing save are described in lohan_checkpoint.h).

A checkpoint directory holds model.safetensors (the fp32 master weights by
parameter name), optimizer.safetensors (optional: `exp_avg/<name>`,
`exp_avg_sq/<name>`, `max_exp_avg_sq/<name>`) and lohan.json (the job, the
step, the layer plan, the optimizer parts present, and the manifest); with
data-parallel ranks, one shard file per rank instead (sharded_checkpoint.py).
A save writes a complete new checkpoint beside the directory and switches
it in with one rename, keeping the user's own files; a reader refuses a
torn or mixed directory, and verify_checkpoint also checks every CRC-32.
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

import torch
from torch import nn

from lohan import _native
from lohan.client import LohanError, StatusCode, take_text
from lohan.progress import Progress

WEIGHTS_FILE = "model.safetensors"
META_FILE = "lohan.json"
PathLike = Union[str, os.PathLike]


class CheckpointError(ValueError):
    """A checkpoint directory that is torn, mixed or damaged."""


def _call(status: int) -> None:
    """Raises what a failed checkpoint call means: CheckpointError for a
    torn, mixed or damaged checkpoint, FileNotFoundError for none, else a
    LohanError."""
    if status == 0:
        return
    message = _native.library().lohan_last_error().decode(errors="replace")
    if status == StatusCode.DATA_LOSS:
        raise CheckpointError(message)
    if status == StatusCode.NOT_FOUND:
        raise FileNotFoundError(message)
    raise LohanError(status, message)


def layer_of(layer: Any,
             aliases: Optional[Dict[int, List[str]]] = None) -> Dict[str, Any]:
    """A CheckpointLayer (proto/checkpoint.proto) of `layer` (blocks.Layer)
    in protobuf JSON; with `aliases` (parameter_aliases), each parameter's
    other names."""
    tensors = []
    for name, param, shape, offset in zip(layer.names, layer.params,
                                          layer.shapes, layer.offsets):
        tensor = {"name": name, "shape": list(shape), "offset": offset}
        if aliases is not None:
            tensor["aliases"] = [n for n in aliases.get(id(param), [name])
                                 if n != name]
        tensors.append(tensor)
    return {"elements": layer.numel, "tensors": tensors}


def contents_of(layers: Iterable[Any], parts: List[str],
                meta: Dict[str, Any], rank: int = 0,
                world: int = 1) -> Dict[str, Any]:
    """A CheckpointContents (proto/checkpoint.proto) of `layers`
    (blocks.Layer) in protobuf JSON."""
    return {
        "layers": [layer_of(layer) for layer in layers],
        "parts": list(parts), "job_name": str(meta.get("job_name", "")),
        "iteration": int(meta.get("iteration", 0)),
        "rank": rank, "world_size": world}


class Save:
    """A save in progress (lohan_checkpoint_save): begun into a directory
    (one process, or rank 0) or joined (another rank, given rank 0's
    staging directory and save id). Closing it before commit() removes
    what it wrote; the previous checkpoint stays whole."""

    def __init__(self, directory: Optional[PathLike] = None,
                 joined: Optional[tuple] = None) -> None:
        self._lib = _native.library()
        handle = ctypes.c_void_p()
        if joined is None:
            status = self._lib.lohan_checkpoint_save_begin(
                os.fsencode(directory), ctypes.byref(handle))
            if status == StatusCode.FAILED_PRECONDITION:
                raise NotADirectoryError(
                    self._lib.lohan_last_error().decode(errors="replace"))
            _call(status)
        else:
            _call(self._lib.lohan_checkpoint_save_join(
                os.fsencode(joined[0]), joined[1].encode(),
                ctypes.byref(handle)))
        self._handle = handle

    @property
    def staging(self) -> str:
        return self._lib.lohan_checkpoint_save_staging(self._handle).decode()

    @property
    def save_id(self) -> str:
        return self._lib.lohan_checkpoint_save_id(self._handle).decode()

    def open(self, contents: Dict[str, Any]) -> None:
        _call(self._lib.lohan_checkpoint_save_open(
            self._handle, json.dumps(contents).encode()))

    def elements(self, layer: int) -> int:
        return int(self._lib.lohan_checkpoint_save_layer_elements(
            self._handle, layer))

    def write(self, layer: int, part: str, flat: torch.Tensor) -> None:
        data = flat.detach().to(torch.float32).contiguous()
        _call(self._lib.lohan_checkpoint_save_write(
            self._handle, layer, part.encode(),
            ctypes.c_void_p(data.data_ptr()), data.numel()))

    def write_layer(self, model: Any, layer: int) -> None:
        """Every part of the layer, read from the job through `model`
        (client.Model)."""
        _call(self._lib.lohan_checkpoint_save_layer(
            self._handle, model.handle, layer))

    def close_files(self) -> Dict[str, Dict[str, int]]:
        """This process's files' manifest entries."""
        text = ctypes.c_void_p()
        _call(self._lib.lohan_checkpoint_save_close_files(
            self._handle, ctypes.byref(text)))
        return json.loads(take_text(text))

    def commit(self, meta: Dict[str, Any],
               files: Optional[Dict[str, Dict[str, int]]] = None) -> None:
        _call(self._lib.lohan_checkpoint_save_commit(
            self._handle, json.dumps(meta).encode(),
            None if files is None else json.dumps(files).encode()))

    def close(self) -> None:
        if self._handle:
            self._lib.lohan_checkpoint_save_destroy(self._handle)
            self._handle = ctypes.c_void_p()

    def __enter__(self) -> Save:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_checkpoint(directory: PathLike, layers: Iterable[Any],
                     read_layer: Callable[[Any, str], torch.Tensor],
                     parts: List[str], meta: Dict[str, Any]) -> str:
    """Writes a checkpoint of `layers` (blocks.Layer) to `directory`,
    replacing what it held as a whole. `read_layer(layer, part)` returns
    the layer's flat fp32 values of `part` ("weights", "exp_avg", ...).
    Returns the weights file's path."""
    layers = list(layers)
    with Save(directory) as save:
        save.open(contents_of(layers, parts, meta))
        for position, layer in enumerate(layers):
            for part in parts:
                save.write(position, part, read_layer(layer, part))
        save.close_files()
        save.commit(meta)
    return str(Path(directory).absolute() / WEIGHTS_FILE)


def verify_checkpoint(directory: PathLike) -> None:
    """Reads every file of a checkpoint and checks it against its manifest
    (sizes, save id, CRC-32); raises CheckpointError on any difference."""
    _call(_native.library().lohan_checkpoint_verify(os.fsencode(directory)))


class CheckpointReader:
    """A checkpoint read tensor by tensor (nothing is loaded whole), in
    either format, or a bare safetensors file of weights. Parameters are
    found under any of their names (tied weights are stored once, under the
    first). Refuses a torn or mixed directory (CheckpointError)."""

    def __init__(self, directory: PathLike, weights_only: bool = False):
        """`weights_only`: a new job's starting weights (lohan.init's
        weights=): whatever else the checkpoint holds (moments, step,
        lohan.json's fields) is not read."""
        self._lib = _native.library()
        self.path = Path(directory)
        handle = ctypes.c_void_p()
        _call(self._lib.lohan_checkpoint_open(os.fsencode(directory), 0,
                                              ctypes.byref(handle)))
        self._handle = handle
        self.meta: Dict[str, Any] = {} if weights_only else json.loads(
            self._lib.lohan_checkpoint_meta_json(handle).decode())
        self.moments: List[str] = [] if weights_only else [
            part for part in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
            if self._lib.lohan_checkpoint_has_part(handle, part.encode())]
        self.iteration = 0 if weights_only else int(
            self._lib.lohan_checkpoint_iteration(handle))

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle:
            self._lib.lohan_checkpoint_destroy(handle)

    def entries(self) -> List[Dict[str, Any]]:
        """Every stored parameter's weights: its "name", "shape" and
        stored "dtype" (safetensors' name: "F32", "BF16", ...)."""
        text = ctypes.c_void_p()
        _call(self._lib.lohan_checkpoint_parameters_json(
            self._handle, ctypes.byref(text)))
        return json.loads(take_text(text))

    def names(self) -> List[str]:
        """The name every stored parameter's weights are under."""
        return [entry["name"] for entry in self.entries()]

    def _shape(self, name: str, part: str) -> Optional[List[int]]:
        dims = (ctypes.c_int64 * 16)()
        count = ctypes.c_size_t()
        status = self._lib.lohan_checkpoint_shape(
            self._handle, name.encode(), part.encode(), dims, 16,
            ctypes.byref(count))
        if status == StatusCode.NOT_FOUND:
            return None
        _call(status)
        return list(dims[:count.value])

    def find(self, aliases: List[str], part: str = "weights"
             ) -> Optional[torch.Tensor]:
        """The parameter's fp32 `part` under the first of `aliases` stored;
        None if none is (or the checkpoint lacks the part)."""
        for name in aliases:
            shape = self._shape(name, part)
            if shape is None:
                continue
            tensor = torch.empty(shape, dtype=torch.float32)
            _call(self._lib.lohan_checkpoint_read(
                self._handle, name.encode(), part.encode(),
                ctypes.c_void_p(tensor.data_ptr()), tensor.numel()))
            return tensor
        return None


    def restore(self, model: Any, layer: Any, parts: List[str],
                aliases: Dict[int, List[str]], rank: int = 0,
                world: int = 1) -> None:
        """A new job's layer (blocks.Layer; its shard with data-parallel
        ranks) from the checkpoint: each of `parts` staged through `model`
        (client.Model) and initialized (lohan_checkpoint_restore_layer);
        after "weights" the staging buffer holds the layer's fp32 values.
        A parameter the checkpoint lacks or holds in another shape is a
        LohanError naming it."""
        request = {"layer": layer_of(layer, aliases),
                   "index": layer.index, "parts": list(parts),
                   "rank": rank, "world_size": world}
        status = self._lib.lohan_checkpoint_restore_layer(
            self._handle, model.handle, json.dumps(request).encode())
        if status != 0:
            raise LohanError(status, self._lib.lohan_last_error().decode(
                errors="replace"))


def parameter_aliases(model: nn.Module) -> Dict[int, List[str]]:
    """Every name of every parameter object (tied ones have several)."""
    aliases: Dict[int, List[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    return aliases


def load_state(model: nn.Module, directory: PathLike,
               strict: bool = True) -> List[str]:
    """Loads a checkpoint's weights (`directory/model.safetensors`, or the
    shard files of one engine.save wrote with data-parallel ranks, or a
    safetensors file given by its path) into `model`'s parameters,
    converting to each parameter's dtype. A tied parameter is found under
    any of its names. Returns the names of the model's parameters the file
    did not have (with strict=True, a missing one or an extra tensor is a
    ValueError). To train on from these weights with fresh Adam moments,
    call lohan.init(model, ...) afterwards; to keep the moments, pass the
    directory as lohan.init(..., resume=directory)."""
    reader = CheckpointReader(directory)
    path = Path(directory)
    source = (path if path.is_file() else
              path / (META_FILE if "sharding" in reader.meta
                      else WEIGHTS_FILE))
    stored = set(reader.names())
    used = set()
    missing: List[str] = []
    aliases = parameter_aliases(model)
    params = list(model.named_parameters())
    progress = Progress(f"loading {directory}", len(params),
                        sum(param.numel() for _, param in params),
                        unit="tensors")
    with torch.no_grad():
        for name, param in params:
            found = next((n for n in aliases[id(param)] if n in stored), None)
            if found is None:
                missing.append(name)
                progress.advance(param.numel())
                continue
            value = reader.find([found])
            if value.shape != param.shape:
                raise ValueError(f"{source}: {found} has shape "
                                 f"{tuple(value.shape)}, the model's {name} "
                                 f"{tuple(param.shape)}")
            param.copy_(value)
            used.update(n for n in aliases[id(param)] if n in stored)
            progress.advance(param.numel())
    progress.done()
    extra = sorted(stored - used)
    if strict and (missing or extra):
        raise ValueError(f"{source} does not match the model: missing "
                         f"{missing[:5]}, unexpected {extra[:5]}")
    return missing
