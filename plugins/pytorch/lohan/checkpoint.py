"""Checkpoints: safetensors files written layer by layer, replaced whole.

A checkpoint directory holds
- `model.safetensors`: the fp32 master weights by parameter name;
- `optimizer.safetensors` (optional): the Adam moments of every parameter,
  `exp_avg/<name>`, `exp_avg_sq/<name>` (and `max_exp_avg_sq/<name>` with
  AMSGrad), fp32;
- `lohan.json`: the job, the step (Adam steps taken), the layer plan,
  whether the optimizer state is there, and the manifest: this save's id
  and each file's size and CRC-32 (the id is also in each file's
  safetensors metadata).

With data-parallel ranks a checkpoint is sharded instead
(sharded_checkpoint.py): no model.safetensors or optimizer.safetensors but
`shard-<r>-of-<W>.safetensors`, each rank's fp32 shard of every layer's
flat vector per part, with lohan.json's manifest listing the shard files
and its `sharding` field how they cut each layer (names, shapes,
offsets). CheckpointReader and load_state read both formats; a save of
either replaces the other's files.

The writer streams: its header (every tensor's name, shape and offset) is
known before any data, so each layer's tensors are written as they are read
from the daemon, and memory never holds more than one layer.

A save is all or nothing: it writes a complete new checkpoint into a hidden
sibling directory (`.<name>.lohan-save-<pid>-<id>`), with everything else
the old directory held linked in (the user's own files stay), syncs it, and
exchanges it with the old directory in one rename (renameat2
RENAME_EXCHANGE; where the filesystem lacks it, two renames, and a reader
that finds the directory missing names the previous checkpoint left
beside it). An interrupted save leaves the previous checkpoint as it was. A
reader checks the manifest (sizes and save ids) and refuses a torn or mixed
directory; verify_checkpoint also checks every file's CRC-32.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import struct
import uuid
import zlib
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import nn

WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
META_FILE = "lohan.json"
CHECKPOINT_FILES = (WEIGHTS_FILE, OPTIMIZER_FILE, META_FILE)
MOMENT_PREFIXES = ("exp_avg/", "exp_avg_sq/", "max_exp_avg_sq/")
SAVE_ID_KEY = "lohan_save_id"
# A sharded checkpoint's file of rank r of W (sharded_checkpoint.py).
SHARD_FILE = "shard-{rank:05d}-of-{world:05d}.safetensors"
SHARD_FILE_PATTERN = re.compile(r"shard-\d{5}-of-\d{5}\.safetensors")
_SAVE_TAG = ".lohan-save-"
_OLD_TAG = ".lohan-old-"


class CheckpointError(ValueError):
    """A checkpoint directory that is torn, mixed or damaged."""


class SafetensorsWriter:
    """Writes one safetensors file of fp32 tensors declared up front, whose
    data then arrives in declaration order (write()); close() syncs it and
    returns its size and CRC-32."""

    def __init__(self, path: Path, tensors: List[Tuple[str, torch.Size]],
                 metadata: Dict[str, str]):
        self._path = path
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
        self._file = open(path, "wb")
        self._bytes = 0
        self._crc = 0
        self._put(struct.pack("<Q", len(encoded)) + encoded)
        self._next = 0

    def _put(self, data: bytes) -> None:
        self._file.write(data)
        self._bytes += len(data)
        self._crc = zlib.crc32(data, self._crc)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        expected, nbytes = self._order[self._next]
        if name != expected:
            raise RuntimeError(f"checkpoint: {name} written where {expected} "
                               "was declared")
        data = tensor.detach().to(torch.float32).contiguous().reshape(-1)
        if 4 * data.numel() != nbytes:
            raise RuntimeError(f"checkpoint: {name} has {4 * data.numel()} "
                               f"bytes, {nbytes} declared")
        self._put(data.numpy().tobytes())
        self._next += 1

    def close(self) -> Dict[str, int]:
        """The file's manifest entry: {"bytes", "crc32"}."""
        self._file.flush()
        if self._next != len(self._order):
            self._file.close()
            raise RuntimeError(f"checkpoint: {len(self._order) - self._next} "
                               "declared tensors were not written")
        _fsync(self._file.fileno())
        self._file.close()
        return {"bytes": self._bytes, "crc32": self._crc}

    def abandon(self) -> None:
        self._file.close()


def _fsync(fd: int) -> None:
    os.fsync(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swaps two directories in one step; False where the system cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
                 _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, f"exchanging {a} and {b}: {os.strerror(code)}")


def _switch(staging: Path, final: Path) -> Optional[Path]:
    """Puts `staging` in place of `final`; returns where the previous
    checkpoint is now (to delete), or None."""
    if not final.exists():
        os.rename(staging, final)
        return None
    if _exchange(staging, final):
        return staging
    old = final.with_name(f".{final.name}{_OLD_TAG}{staging.name[-12:]}")
    os.rename(final, old)
    os.rename(staging, final)
    return old


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_saves(final: Path) -> None:
    """What interrupted saves into `final` left beside it: their staging
    directories (a new checkpoint not switched in, or an old one switched
    out) once their process is gone; previous checkpoints set aside by the
    two-rename switch once `final` is whole again."""
    prefix = f".{final.name}"
    for entry in final.parent.glob(prefix + ".lohan-*"):
        rest = entry.name[len(prefix):]
        if rest.startswith(_SAVE_TAG):
            pid = rest[len(_SAVE_TAG):].split("-", 1)[0]
            if pid.isdigit() and (int(pid) == os.getpid()
                                  or not _alive(int(pid))):
                shutil.rmtree(entry, ignore_errors=True)
        elif rest.startswith(_OLD_TAG) and (final / META_FILE).exists():
            shutil.rmtree(entry, ignore_errors=True)


def is_lohan_file(name: str) -> bool:
    """Whether a checkpoint directory's entry is one a save writes (either
    format's): a save replaces these and keeps everything else."""
    return name in CHECKPOINT_FILES or SHARD_FILE_PATTERN.fullmatch(
        name) is not None


def _link_tree(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _keep_foreign_entries(final: Path, staging: Path) -> None:
    """Everything but lohan's own files in the old directory, linked (or
    copied) into the new one, so a save never drops a user's file."""
    if not final.is_dir():
        return
    for entry in final.iterdir():
        if is_lohan_file(entry.name) or entry.name.endswith(".partial"):
            continue
        target = staging / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry), target)
        elif entry.is_dir():
            shutil.copytree(entry, target, symlinks=True,
                            copy_function=_link_tree)
        else:
            _link_tree(entry, target)


def begin_save(directory: Union[str, os.PathLike]) -> Tuple[Path, Path, str]:
    """A save into `directory`: (the checkpoint's absolute path, its new
    staging directory, the save id). What earlier interrupted saves left
    beside it is removed first."""
    final = Path(directory).absolute()
    if final.exists() and not final.is_dir():
        raise NotADirectoryError(f"checkpoint path {final} is a file; "
                                 "engine.save writes a directory")
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_saves(final)
    save_id = uuid.uuid4().hex
    staging = final.with_name(
        f".{final.name}{_SAVE_TAG}{os.getpid()}-{save_id[:12]}")
    staging.mkdir()
    return final, staging, save_id


def commit_save(final: Path, staging: Path) -> None:
    """Makes the complete checkpoint in `staging` the one in `final`, in
    one switch, with the user's files of the old one linked in. On an
    error `final` is as it was; the caller removes `staging`."""
    _keep_foreign_entries(final, staging)
    _fsync_dir(staging)
    previous = _switch(staging, final)
    _fsync_dir(final.parent)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)


def write_meta(path: Path, meta: Dict[str, Any]) -> None:
    """`path/lohan.json`, synced."""
    with open(path / META_FILE, "w") as out:
        out.write(json.dumps(meta, indent=1) + "\n")
        out.flush()
        _fsync(out.fileno())


def write_checkpoint(directory: Union[str, os.PathLike],
                     layers: Iterable[Any],
                     read_layer: Callable[[Any, str], torch.Tensor],
                     parts: List[str], meta: Dict[str, Any]) -> str:
    """Writes a checkpoint of `layers` (blocks.Layer) to `directory`,
    replacing what it held as a whole (see the module doc). `read_layer(
    layer, part)` returns the layer's flat fp32 values of `part`
    ("weights", "exp_avg", ...): weights go to model.safetensors, the other
    parts to optimizer.safetensors. Returns the weights file's path."""
    final, staging, save_id = begin_save(directory)
    try:
        _write_files(staging, list(layers), read_layer, parts, meta, save_id)
        commit_save(final, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return str(final / WEIGHTS_FILE)


def _write_files(path: Path, layers: List[Any],
                 read_layer: Callable[[Any, str], torch.Tensor],
                 parts: List[str], meta: Dict[str, Any],
                 save_id: str) -> None:
    metadata = {"format": "pt", "lohan_job": str(meta["job_name"]),
                "lohan_iteration": str(meta["iteration"]),
                SAVE_ID_KEY: save_id}

    def declare(prefixes: List[str]) -> List[Tuple[str, torch.Size]]:
        # Per layer, every part of it: the order the data is read in.
        return [(prefix + name, shape)
                for layer in layers for prefix in prefixes
                for name, shape in zip(layer.names, layer.shapes)]

    moments = [p for p in parts if p != "weights"]
    files = [(WEIGHTS_FILE, ["weights"])]
    if moments:
        files.append((OPTIMIZER_FILE, moments))
    manifest: Dict[str, Dict[str, int]] = {}
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
            manifest[file_name] = writer.close()
        except BaseException:
            writer.abandon()
            raise
    write_meta(path, dict(meta, optimizer_state=moments, save_id=save_id,
                          files=manifest))


def _safetensors_metadata(file: Path) -> Dict[str, str]:
    with open(file, "rb") as data:
        head = data.read(8)
        if len(head) < 8:
            return {}
        (length,) = struct.unpack("<Q", head)
        if length > 100 << 20:
            return {}
        try:
            header = json.loads(data.read(length))
        except ValueError:
            return {}
    found = header.get("__metadata__", {}) if isinstance(header, dict) else {}
    return found if isinstance(found, dict) else {}


def check_checkpoint(directory: Union[str, os.PathLike],
                     meta: Dict[str, Any], crc: bool = False) -> None:
    """Raises CheckpointError unless every file lohan.json's manifest lists
    is there, of its size and from the same save (with `crc`, also of its
    CRC-32: a read of every byte). A checkpoint written before manifests
    existed (no save_id) passes."""
    path = Path(directory)
    save_id = meta.get("save_id")
    if save_id is None:
        return
    for name, entry in meta.get("files", {}).items():
        file = path / name
        if not file.exists():
            raise CheckpointError(
                f"checkpoint {path} is incomplete: {META_FILE} lists {name}, "
                "which is missing")
        size = file.stat().st_size
        if size != entry["bytes"]:
            raise CheckpointError(
                f"checkpoint {path} is torn: {name} has {size} bytes, "
                f"{META_FILE} says {entry['bytes']}")
        found = _safetensors_metadata(file).get(SAVE_ID_KEY)
        if found != save_id:
            raise CheckpointError(
                f"checkpoint {path} is mixed: {name} comes from save "
                f"{found or '(none)'}, {META_FILE} from save {save_id}; "
                "it was assembled from two saves, load neither part "
                "without the other")
        if crc:
            value = 0
            with open(file, "rb") as data:
                while chunk := data.read(16 << 20):
                    value = zlib.crc32(chunk, value)
            if value != entry["crc32"]:
                raise CheckpointError(
                    f"checkpoint {path}: {name} is damaged (CRC-32 "
                    f"{value:08x}, {META_FILE} says {entry['crc32']:08x})")


def _missing_checkpoint(path: Path, what: Path) -> FileNotFoundError:
    left = sorted(path.parent.glob(f".{path.name}{_OLD_TAG}*"))
    if left:
        return FileNotFoundError(
            f"{what} does not exist: a save into {path} was interrupted "
            f"between its two renames; the previous checkpoint is whole in "
            f"{left[0]} (rename it to {path.name})")
    return FileNotFoundError(f"{what} does not exist: not a lohan "
                             "checkpoint (engine.save(dir) writes one)")


def verify_checkpoint(directory: Union[str, os.PathLike]) -> None:
    """Reads every file of a checkpoint and checks it against its manifest
    (sizes, save id, CRC-32); raises CheckpointError on any difference."""
    path = Path(directory)
    meta_file = path / META_FILE
    if not meta_file.exists():
        raise _missing_checkpoint(path, meta_file)
    check_checkpoint(path, json.loads(meta_file.read_text()), crc=True)


class CheckpointReader:
    """A checkpoint directory, read tensor by tensor (nothing is loaded
    whole), in either format: the single-process files or the ranks'
    shard files (sharded_checkpoint.py), whose parameters are assembled
    from the shards that hold them. Parameters are found under any of
    their names (tied weights are stored once, under the first). Refuses a
    torn or mixed directory (check_checkpoint; verify_checkpoint also
    checks the CRC-32s)."""

    def __init__(self, directory: Union[str, os.PathLike]):
        from safetensors import safe_open

        self.path = Path(directory)
        meta_file = self.path / META_FILE
        self.meta: Dict[str, Any] = (json.loads(meta_file.read_text())
                                     if meta_file.exists() else {})
        self._sharded: Optional[Any] = None  # a ShardedTensors
        if "sharding" in self.meta:
            from lohan.sharded_checkpoint import ShardedTensors

            check_checkpoint(self.path, self.meta)
            self._sharded = ShardedTensors(self.path, self.meta)
            self.moments: List[str] = list(self.meta.get("optimizer_state",
                                                         []))
            return
        weights = self.path / WEIGHTS_FILE
        if not weights.exists():
            raise _missing_checkpoint(self.path, weights)
        check_checkpoint(self.path, self.meta)
        self._weights = safe_open(str(weights), "pt")
        optimizer = self.path / OPTIMIZER_FILE
        self._optimizer = (safe_open(str(optimizer), "pt")
                           if optimizer.exists() else None)
        self.moments = list(self.meta.get("optimizer_state", []))
        if self._optimizer is None:
            self.moments = []

    @property
    def iteration(self) -> int:
        return int(self.meta.get("iteration", 0))

    def names(self) -> List[str]:
        """The name every stored parameter's weights are under."""
        if self._sharded is not None:
            return self._sharded.names()
        return list(self._weights.keys())

    def find(self, aliases: List[str], part: str = "weights"
             ) -> Optional[torch.Tensor]:
        """The parameter's fp32 `part` under the first of `aliases` stored;
        None if none is (or the checkpoint lacks the part)."""
        if self._sharded is not None:
            if part != "weights" and part not in self.moments:
                return None
            return self._sharded.find(aliases, part)
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
    """Loads a checkpoint's weights (`directory/model.safetensors`, or the
    shard files of one engine.save wrote with data-parallel ranks) into
    `model`'s parameters, converting to each parameter's dtype. A tied
    parameter is found under any of its names. Returns the names of the
    model's parameters the file did not have (with strict=True, a missing
    one or an extra tensor is a ValueError). To train on from these weights
    with fresh Adam moments, call lohan.init(model, ...) afterwards; to keep
    the moments, pass the directory as lohan.init(..., resume=directory)."""
    from safetensors.torch import load_file

    file = Path(directory) / WEIGHTS_FILE
    meta_file = Path(directory) / META_FILE
    if Path(directory).is_file():
        file = Path(directory)
        stored = load_file(str(file))
    elif meta_file.exists() and "sharding" in json.loads(
            meta_file.read_text()):
        file = meta_file  # named in errors: the shard files' checkpoint
        reader = CheckpointReader(directory)
        stored = {name: reader.find([name]) for name in reader.names()}
    else:
        if meta_file.exists():
            check_checkpoint(directory, json.loads(meta_file.read_text()))
        if not file.exists():
            raise _missing_checkpoint(Path(directory), file)
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
