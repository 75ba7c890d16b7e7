"""A model as a Hugging Face checkpoint directory (engine.save_pretrained):
config.json (and generation_config.json), the weights in safetensors
shards of at most `max_shard_size` with model.safetensors.index.json
(one model.safetensors when they fit one), the model's own names, what
transformers' from_pretrained loads as it is.

Each tensor is produced when its turn comes (`OutTensor.read`) and
written at once: the shards' headers are known up front, so every file
is written front to back and nothing holds more than one tensor (the
engine reads the masters a layer at a time). The directory is replaced
all or nothing: the files go to a hidden staging sibling that takes the
directory's place in one rename exchange (two renames where the
filesystem lacks it); the directory's other files (a tokenizer's, say)
are linked into the staging directory first; a failed save removes its
staging directory and leaves the directory as it was."""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import errno
import json
import os
import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from lohan.progress import Progress

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
# The files a save writes: an older save's are not kept beside a new one
# (a stale model.safetensors beside a new index would be loaded first).
_MODEL_FILE = re.compile(
    r"^(model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json|"
    r"config\.json|generation_config\.json|adapter_model\.safetensors|"
    r"adapter_config\.json)$")
_STAGING = ".{name}.lohan-pretrained-{pid}"

SAFETENSORS_DTYPES: Dict[torch.dtype, str] = {
    torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
    torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
    torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL"}
_SIZE_UNITS = {"GIB": 1 << 30, "MIB": 1 << 20, "KIB": 1 << 10,
               "GB": 10**9, "MB": 10**6, "KB": 10**3, "B": 1}


def shard_limit(size: Union[int, str]) -> int:
    """max_shard_size in bytes: an int, or "5GB", "500MiB", ... (as
    transformers reads it); ValueError otherwise."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    if isinstance(size, str):
        match = re.fullmatch(r"\s*(\d+)\s*([KMG]I?B|B)\s*", size.upper())
        if match and int(match.group(1)) > 0:
            return int(match.group(1)) * _SIZE_UNITS[match.group(2)]
    raise ValueError(f"max_shard_size={size!r}: a number of bytes > 0 or a "
                     "size such as '5GB' or '500MiB'")


@dataclass
class OutTensor:
    """One tensor of the checkpoint: `read()` gives its values (of `shape`,
    converted to `dtype` on the CPU) when the writer reaches it."""

    name: str
    shape: Sequence[int]
    dtype: torch.dtype
    read: Callable[[], torch.Tensor]

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


def plan_shards(tensors: List[OutTensor], limit: int) -> List[List[OutTensor]]:
    """Tensors into shards in their order, a new shard when the next one
    would pass `limit` (a tensor larger than it has a shard of its own)."""
    shards: List[List[OutTensor]] = [[]]
    size = 0
    for tensor in tensors:
        if shards[-1] and size + tensor.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor.nbytes
    return [shard for shard in shards if shard]


def _header(tensors: List[OutTensor]) -> bytes:
    entries: Dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        entries[tensor.name] = {
            "dtype": SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes]}
        offset += tensor.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-aligned
    return struct.pack("<Q", len(text)) + text


def _write_shard(path: Path, tensors: List[OutTensor]) -> None:
    with open(path, "wb") as out:
        out.write(_header(tensors))
        for tensor in tensors:
            values = tensor.read()
            if tuple(values.shape) != tuple(tensor.shape) or (
                    values.dtype != tensor.dtype):
                raise RuntimeError(
                    f"lohan: {tensor.name} came as {tuple(values.shape)} "
                    f"{values.dtype}, declared {tuple(tensor.shape)} "
                    f"{tensor.dtype}")
            data = values.detach().to("cpu").contiguous().reshape(-1)
            out.write(memoryview(data.view(torch.uint8).numpy()))


def write_pretrained(directory: Union[str, os.PathLike],
                     tensors: List[OutTensor], max_shard_size: Union[int, str],
                     write_configs: Callable[[Path], None]) -> Path:
    """Writes the checkpoint (see the module's doc) and returns its
    directory. `write_configs(staging)` adds config.json and the like."""
    limit = shard_limit(max_shard_size)

    def write(staging: Path) -> None:
        shards = plan_shards(tensors, limit)
        names = ([WEIGHTS_NAME] if len(shards) == 1 else
                 [f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
                  for n in range(len(shards))])
        for name, shard in zip(names, shards):
            _write_shard(staging / name, shard)
        if len(shards) > 1:
            index = {"metadata": {"total_size": sum(t.nbytes
                                                    for t in tensors)},
                     "weight_map": {t.name: name
                                    for name, shard in zip(names, shards)
                                    for t in shard}}
            (staging / INDEX_NAME).write_text(json.dumps(index, indent=2))
        write_configs(staging)

    return replace_directory(directory, write)


class SaveFailed(RuntimeError):
    """save_pretrained with data-parallel ranks failed on rank 0, which
    writes; the message names its error. Nothing was replaced."""


def write_from_ranks(sharding: Any, directory: Union[str, os.PathLike],
                     tensors: List[OutTensor],
                     max_shard_size: Union[int, str],
                     write_configs: Callable[[Path], None]) -> Path:
    """write_pretrained with data-parallel ranks, every rank calling it
    with the same `tensors` (`sharding`: sharding.Sharding): reading a
    trained tensor gathers its layer from the ranks (a collective), so
    every rank reads every tensor in order, and rank 0 writes. A failure
    on rank 0 does not stop its reads (the others' gathers would wait for
    them): it reads on and writes nothing more; then every rank raises,
    rank 0 its own error, the others SaveFailed naming it, and the
    directory is as it was."""
    done = [False] * len(tensors)

    def marked(position: int, tensor: OutTensor) -> OutTensor:
        def read() -> torch.Tensor:
            done[position] = True
            return tensor.read()
        return OutTensor(tensor.name, tensor.shape, tensor.dtype, read)

    own: Optional[BaseException] = None
    if sharding.rank == 0:
        try:
            write_pretrained(directory,
                             [marked(n, t) for n, t in enumerate(tensors)],
                             max_shard_size, write_configs)
        except Exception as error:  # noqa: BLE001 - raised after the reads
            own = error
    for position, tensor in enumerate(tensors):
        if not done[position]:
            tensor.read()
    failures = sharding.exchange(
        "agreeing on save_pretrained",
        None if own is None else f"{type(own).__name__}: {own}")
    if own is not None:
        raise own
    if failures[0] is not None:
        raise SaveFailed(f"lohan: save_pretrained failed on rank 0, which "
                         f"writes: {failures[0]}; {directory} is as it was")
    return Path(directory).absolute()


def replace_directory(directory: Union[str, os.PathLike],
                      write: Callable[[Path], None]) -> Path:
    """`write(staging)` fills a staging sibling of `directory`, which then
    replaces it all or nothing (see the module's doc); returns the
    directory."""
    target = Path(directory).absolute()
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"lohan: {target} is a file; "
                                 "save_pretrained writes a directory")
    staging = _begin(target)
    try:
        write(staging)
        for path in staging.iterdir():
            if path.is_file() and not path.is_symlink():
                _fsync_file(path)
        _fsync_directory(staging)
        _switch(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _begin(target: Path) -> Path:
    """A fresh staging sibling of `target` holding `target`'s other files
    (hard links); stale ones of dead processes removed."""
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    stale = re.compile(re.escape(_STAGING.format(name=target.name,
                                                 pid="@")).replace("@",
                                                                   r"(\d+)"))
    for entry in parent.iterdir():
        found = stale.fullmatch(entry.name)
        if found and not _alive(int(found.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
    staging = parent / _STAGING.format(name=target.name, pid=os.getpid())
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    if target.is_dir():
        for entry in target.iterdir():
            if _MODEL_FILE.match(entry.name):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.copytree(entry, staging / entry.name,
                                copy_function=os.link, symlinks=True)
            else:
                os.link(entry, staging / entry.name,
                        follow_symlinks=False)
    return staging


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """renameat2(RENAME_EXCHANGE): whether it swapped them (False where the
    C library or the filesystem lacks it)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6",
                       use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
                 _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _switch(staging: Path, target: Path) -> None:
    """`staging` becomes `target`; the old `target` goes."""
    if not target.exists():
        os.rename(staging, target)
    elif _exchange(staging, target):
        shutil.rmtree(staging)  # holds the old directory now
    else:
        old = staging.with_name(staging.name + ".old")
        os.rename(target, old)
        os.rename(staging, target)
        shutil.rmtree(old)
    _fsync_directory(target.parent)


def write_configs(model: nn.Module, directory: Path,
                  dtype: torch.dtype) -> None:
    """config.json (with the saved dtype and the model's class as its
    architecture, as transformers writes them) and generation_config.json
    when the model can generate; nothing for a model without a
    transformers config (its weights alone)."""
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(config, "save_pretrained",
                                              None)):
        return
    config = copy.deepcopy(config)
    config.dtype = str(dtype).split(".")[1]
    config.architectures = [type(model).__name__]
    config.save_pretrained(directory)
    generation = getattr(model, "generation_config", None)
    can_generate = getattr(model, "can_generate", None)
    if generation is not None and callable(can_generate) and can_generate():
        generation.save_pretrained(directory)


def save_model(model: nn.Module, tensors: List[OutTensor],
               directory: Union[str, os.PathLike], dtype: torch.dtype,
               max_shard_size: Union[int, str],
               sharding: Any = None) -> Path:
    """`tensors` of `model` written as its Hugging Face checkpoint in
    `dtype` (write_pretrained; with `sharding`, data-parallel ranks,
    write_from_ranks), its configs beside them, with a progress line."""
    progress = Progress(f"saving to {directory}", len(tensors),
                        sum(t.numel for t in tensors), unit="tensors")

    def counted(tensor: OutTensor) -> OutTensor:
        def read() -> torch.Tensor:
            value = tensor.read()
            progress.advance(value.numel())
            return value
        return OutTensor(tensor.name, tensor.shape, tensor.dtype, read)

    def configs(staging: Path) -> None:
        write_configs(model, staging, dtype)

    counted_tensors = [counted(t) for t in tensors]
    path = (write_pretrained(directory, counted_tensors, max_shard_size,
                             configs) if sharding is None else
            write_from_ranks(sharding, directory, counted_tensors,
                             max_shard_size, configs))
    progress.done()
    return path
