"""Sharded checkpoints: engine.save with data-parallel ranks.

Every rank writes its own shard of every layer into one checkpoint
directory, in parallel, and rank 0 adds the one lohan.json that makes the
files a checkpoint (the files and their layout are liblohan_client's,
lohan_checkpoint.h: `shard-<r>-of-<W>.safetensors` holds rank r's fp32
shard of each layer's flat vector, as sharding.py cuts it, and lohan.json's
`sharding` says how).

What is this module's own is the agreement between ranks, over
torch.distributed: rank 0 begins the save (a hidden staging directory) and
tells every rank its path and save id; each rank must see it (a directory
every rank sees: a shared filesystem), else every rank raises. Each rank
streams its shard file into it layer by layer and syncs it; the ranks then
agree on the outcome, so a failure on any rank fails every rank, removes
the staging directory and leaves the previous checkpoint untouched. Only
when every file is written does rank 0 commit: lohan.json, then the
directory switched in.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Optional,
                    Tuple, Union)

from lohan.checkpoint import META_FILE, Save, contents_of

if TYPE_CHECKING:
    from lohan.blocks import Layer
    from lohan.sharding import Sharding


class SaveFailed(RuntimeError):
    """engine.save with data-parallel ranks failed on another rank; the
    message names it and its error. Nothing was replaced."""


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def save_sharded(sharding: "Sharding", directory: Union[str, os.PathLike],
                 layers: List["Layer"],
                 write_layer: Callable[[Save, "Layer"], None],
                 parts: List[str], meta: Dict[str, Any]) -> str:
    """engine.save with data-parallel ranks (every rank calls it, see the
    module doc). `write_layer(save, layer)` writes this rank's shard of
    every part of the layer. Returns the checkpoint's lohan.json path on
    every rank once it is in place; on a failure anywhere every rank
    raises (the failing rank its own error, the others a SaveFailed naming
    it) and the directory is as it was."""
    rank = sharding.rank
    own: Optional[BaseException] = None
    save: Optional[Save] = None
    start: Optional[Tuple[str, str]] = None
    if rank == 0:
        try:
            save = Save(directory)
            start = (save.staging, save.save_id)
        except Exception as error:  # noqa: BLE001 - told to every rank
            own = error
    told = sharding.exchange("starting the checkpoint save",
                             start if own is None else _describe(own))[0]
    if own is not None:
        raise own
    if isinstance(told, str):
        raise SaveFailed(f"lohan: rank 0 could not start the save into "
                         f"{directory}: {told}; nothing was replaced")
    staging = Path(told[0])
    if save is None:
        save = Save(joined=told)
    with save:
        _check_visible(sharding, staging)
        contents = contents_of(layers, parts, meta, rank, sharding.world)

        def write() -> Dict[str, Dict[str, int]]:
            save.open(contents)
            for layer in layers:
                write_layer(save, layer)
            return save.close_files()
        entries = _agreed(sharding, "writing the shard files", write)
        files = {name: entry for own_files in entries
                 for name, entry in own_files.items()}
        _agreed(sharding, "switching the checkpoint in", lambda: (
            save.commit(meta, files) if rank == 0 else None))
    return str(Path(directory).absolute() / META_FILE)


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
