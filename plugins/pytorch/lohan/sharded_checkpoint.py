"""Sharded checkpoints: engine.save with data-parallel ranks.

Every rank writes its own shard of every layer into one checkpoint
directory, in parallel, and rank 0 adds the one lohan.json that makes the
files a checkpoint:

- `shard-<r>-of-<W>.safetensors` (r, W: five digits): rank r's fp32 shard
  of each layer's flat vector (sharding.py: elements [r*s, r*s + s) of
  layer i, s = ceil(n_i / W), zero padding past n_i), one flat tensor per
  layer and part, `layer.<i>/weights`, `layer.<i>/exp_avg`, ...; its
  safetensors metadata holds the save id, the rank and the world size;
- `lohan.json`: the single-process fields (job, iteration, layer names,
  optimizer_state, save_id, and in `files` every shard file's size and
  CRC-32, checked as checkpoint.check_checkpoint checks any manifest) plus
  `sharding`: {"world_size": W, "files": [the shard files by rank],
  "layers": [{"numel", "shard", "names", "shapes", "offsets"} per layer]}.

The save is all or nothing as a single-process one (checkpoint.py): rank 0
makes the hidden staging directory and tells every rank its path; each
rank must see it (a directory every rank sees: a shared filesystem), else
every rank raises. Each rank streams its shard file into it layer by
layer (memory holds one layer's shard) and syncs it; the ranks then agree
on the outcome, so a failure on any rank fails every rank, removes the
staging directory and leaves the previous checkpoint untouched. Only when
every file is written does rank 0 write lohan.json and switch the
directory in.

A reader (checkpoint.CheckpointReader) assembles each parameter's full
tensor from the pieces of the shards that hold its elements, so any
number of ranks, or one process, resumes from it.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Optional,
                    Tuple, Union)

import torch

from lohan.checkpoint import (META_FILE, SAVE_ID_KEY, SHARD_FILE,
                              CheckpointError, SafetensorsWriter, begin_save,
                              commit_save, write_meta)

if TYPE_CHECKING:
    from lohan.blocks import Layer
    from lohan.sharding import Sharding

SHARDING_KEY = "sharding"


def shard_file(rank: int, world: int) -> str:
    return SHARD_FILE.format(rank=rank, world=world)


def tensor_name(index: int, part: str) -> str:
    """A shard file's tensor of layer `index`'s `part`."""
    return f"layer.{index}/{part}"


def sharding_plan(layers: List["Layer"], world: int) -> Dict[str, Any]:
    """lohan.json's `sharding`: how the shard files cut every layer."""
    return {
        "world_size": world,
        "files": [shard_file(r, world) for r in range(world)],
        "layers": [{"numel": layer.numel,
                    "shard": math.ceil(layer.numel / world),
                    "names": list(layer.names),
                    "shapes": [list(shape) for shape in layer.shapes],
                    "offsets": list(layer.offsets)} for layer in layers],
    }


class SaveFailed(RuntimeError):
    """engine.save with data-parallel ranks failed on another rank; the
    message names it and its error. Nothing was replaced."""


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def save_sharded(sharding: "Sharding", directory: Union[str, os.PathLike],
                 layers: List["Layer"],
                 read_shard: Callable[["Layer", str], torch.Tensor],
                 parts: List[str], meta: Dict[str, Any]) -> str:
    """engine.save with data-parallel ranks (every rank calls it, see the
    module doc). `read_shard(layer, part)` returns this rank's fp32 shard
    of the layer's `part` (sharding.shard[index] elements). Returns the
    checkpoint's lohan.json path on every rank once it is in place; on a
    failure anywhere every rank raises (the failing rank its own error,
    the others a SaveFailed naming it) and the directory is as it was."""
    rank, world = sharding.rank, sharding.world
    own: Optional[BaseException] = None
    start: Optional[Tuple[str, str, str]] = None
    if rank == 0:
        try:
            start = tuple(str(p) for p in begin_save(directory))
        except Exception as error:  # noqa: BLE001 - told to every rank
            own = error
    told = sharding.exchange("starting the checkpoint save",
                             start if own is None else _describe(own))[0]
    if own is not None:
        raise own
    if isinstance(told, str):
        raise SaveFailed(f"lohan: rank 0 could not start the save into "
                         f"{directory}: {told}; nothing was replaced")
    final, staging, save_id = Path(told[0]), Path(told[1]), told[2]
    try:
        _check_visible(sharding, staging)
        name = shard_file(rank, world)
        metadata = {"format": "pt", "lohan_job": str(meta["job_name"]),
                    "lohan_iteration": str(meta["iteration"]),
                    SAVE_ID_KEY: save_id, "lohan_rank": str(rank),
                    "lohan_world_size": str(world)}
        entries = _agreed(sharding, "writing the shard files", lambda: (
            _write_shard(staging / name, layers, read_shard, parts,
                         sharding.shard, metadata)))
        full = dict(meta, save_id=save_id,
                    optimizer_state=[p for p in parts if p != "weights"],
                    files={shard_file(r, world): entry
                           for r, entry in enumerate(entries)},
                    **{SHARDING_KEY: sharding_plan(layers, world)})
        _agreed(sharding, "switching the checkpoint in", lambda: (
            _commit(final, staging, full) if rank == 0 else None))
    except BaseException:
        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    return str(final / META_FILE)


def _commit(final: Path, staging: Path, meta: Dict[str, Any]) -> None:
    write_meta(staging, meta)
    commit_save(final, staging)


def _check_visible(sharding: "Sharding", staging: Path) -> None:
    """Every rank must see rank 0's staging directory (its name holds the
    save id: no other directory has it)."""
    seen = sharding.exchange("checking the checkpoint directory",
                             staging.is_dir())
    blind = [r for r, sees in enumerate(seen) if not sees]
    if blind:
        raise SaveFailed(
            f"lohan: engine.save with data-parallel ranks needs a directory "
            f"every rank sees (a shared filesystem): rank(s) "
            f"{', '.join(map(str, blind))} cannot see {staging}, which rank "
            f"0 made for the save into {staging.parent}; nothing was "
            "replaced")


def _agreed(sharding: "Sharding", what: str,
            work: Callable[[], Any]) -> List[Any]:
    """`work()` on every rank, then their results by rank; if it raised on
    any rank, every rank raises (that rank its own error)."""
    own: Optional[BaseException] = None
    result: Any = None
    try:
        result = work()
    except Exception as error:  # noqa: BLE001 - told to every rank
        own = error
    outcomes = sharding.exchange(
        what, ("failed", _describe(own)) if own is not None
        else ("done", result))
    if own is not None:
        raise own
    failed = [(r, why) for r, (state, why) in enumerate(outcomes)
              if state == "failed"]
    if failed:
        raise SaveFailed(
            f"lohan: engine.save failed {what} on rank {failed[0][0]} "
            f"({failed[0][1]}); nothing was replaced")
    return [result for _, result in outcomes]


def _write_shard(path: Path, layers: List["Layer"],
                 read_shard: Callable[["Layer", str], torch.Tensor],
                 parts: List[str], shard: List[int],
                 metadata: Dict[str, str]) -> Dict[str, int]:
    """This rank's shard file, layer by layer; its manifest entry."""
    declared = [(tensor_name(layer.index, part),
                 torch.Size([shard[layer.index]]))
                for layer in layers for part in parts]
    writer = SafetensorsWriter(path, declared, metadata)
    try:
        for layer in layers:
            for part in parts:
                writer.write(tensor_name(layer.index, part),
                             read_shard(layer, part))
        return writer.close()
    except BaseException:
        writer.abandon()
        raise


class ShardedTensors:
    """A sharded checkpoint's parameters, each assembled from the shard
    files that hold its elements (read slice by slice: nothing is loaded
    whole). The manifest must have been checked (check_checkpoint)."""

    def __init__(self, path: Path, meta: Dict[str, Any]) -> None:
        from safetensors import safe_open

        plan = meta[SHARDING_KEY]
        files = list(plan["files"])
        listed = meta.get("files", {})
        if len(files) != int(plan["world_size"]) or any(
                name not in listed for name in files):
            raise CheckpointError(
                f"checkpoint {path} is inconsistent: {META_FILE}'s sharding "
                f"names {len(files)} shard files for world size "
                f"{plan['world_size']}, not all in its manifest")
        self._files = [safe_open(str(path / name), "pt") for name in files]
        self._keys = [set(f.keys()) for f in self._files]
        self._layers = plan["layers"]
        # name -> (layer index, offset in its flat vector, shape)
        self._where: Dict[str, Tuple[int, int, List[int]]] = {}
        for index, layer in enumerate(self._layers):
            for name, shape, offset in zip(layer["names"], layer["shapes"],
                                           layer["offsets"]):
                self._where[name] = (index, int(offset), list(shape))

    def names(self) -> List[str]:
        return list(self._where)

    def find(self, aliases: List[str], part: str) -> Optional[torch.Tensor]:
        for name in aliases:
            if name in self._where:
                return self._assemble(*self._where[name], part)
        return None

    def _assemble(self, index: int, offset: int, shape: List[int],
                  part: str) -> Optional[torch.Tensor]:
        key = tensor_name(index, part)
        if any(key not in keys for keys in self._keys):
            return None
        count = math.prod(shape)
        if count == 0:
            return torch.zeros(shape, dtype=torch.float32)
        size = int(self._layers[index]["shard"])
        begin, end = offset, offset + count
        pieces = []
        while begin < end:
            rank = begin // size
            stop = min(end, (rank + 1) * size)
            pieces.append(self._files[rank].get_slice(key)[
                begin - rank * size:stop - rank * size])
            begin = stop
        return torch.cat(pieces).reshape(shape)
