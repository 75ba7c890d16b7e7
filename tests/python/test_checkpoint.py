"""Checkpoints are replaced whole (lohan.checkpoint, over liblohan_client's
client/checkpoint, whose checkpoint_save_test kills a save at each of its
steps): a mixed, torn or damaged directory is refused by name; a user's own
files in the directory survive saves. write_checkpoint is driven directly
with a small model's layer plan (no daemon needed)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from torch import nn

from lohan import checkpoint
from lohan.blocks import Layer, find_blocks, plan_layers
from lohan.checkpoint import (CheckpointError, CheckpointReader,
                              verify_checkpoint, write_checkpoint)

PARTS = ["weights", "exp_avg", "exp_avg_sq"]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.head = nn.Linear(4, 7, bias=False)


def layers_of_net() -> List[Layer]:
    model = Net()
    return plan_layers(model, find_blocks(model))


def save(directory: Path, layers: List[Layer], value: float,
         iteration: int) -> None:
    """A checkpoint whose every element of part k is value + k."""
    def read_layer(layer: Layer, part: str) -> torch.Tensor:
        return torch.full((layer.numel,), value + PARTS.index(part))
    write_checkpoint(directory, layers, read_layer, PARTS,
                     {"job_name": "t", "iteration": iteration})


def contents(directory: Path, layers: List[Layer]) -> Dict[str, float]:
    """Each part's single value (and the iteration), or an error if the
    checkpoint mixes values within a part."""
    reader = CheckpointReader(directory)
    found: Dict[str, float] = {"iteration": float(reader.iteration)}
    for part in PARTS:
        values = set()
        for layer in layers:
            for name in layer.names:
                tensor = reader.find([name], part)
                assert tensor is not None, (part, name)
                values.update(tensor.unique().tolist())
        assert len(values) == 1, (part, values)
        found[part] = values.pop()
    return found


def expected(value: float, iteration: int) -> Dict[str, float]:
    found = {"iteration": float(iteration)}
    found.update({part: value + k for k, part in enumerate(PARTS)})
    return found


def test_a_save_replaces_the_checkpoint_and_keeps_the_users_files(tmp_path):
    layers = layers_of_net()
    target = tmp_path / "ckpt"
    save(target, layers, 1.0, 10)
    (target / "README.txt").write_text("mine")
    (target / "tokenizer").mkdir()
    (target / "tokenizer" / "vocab.json").write_text("{}")
    save(target, layers, 2.0, 20)
    assert contents(target, layers) == expected(2.0, 20)
    verify_checkpoint(target)
    assert (target / "README.txt").read_text() == "mine"
    assert (target / "tokenizer" / "vocab.json").read_text() == "{}"
    # Nothing left beside it.
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    meta = json.loads((target / "lohan.json").read_text())
    assert set(meta["files"]) == {"model.safetensors",
                                  "optimizer.safetensors"}


def test_a_save_drops_the_shard_files_of_a_sharded_checkpoint(tmp_path):
    # A single-process save over a data-parallel one: the ranks' shard
    # files are lohan's, replaced with the rest; a look-alike is not.
    layers = layers_of_net()
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "shard-00001-of-00002.safetensors").write_text("a shard")
    (target / "shard-1-of-2.safetensors").write_text("mine")
    save(target, layers, 1.0, 10)
    assert sorted(p.name for p in target.iterdir()) == [
        "lohan.json", "model.safetensors", "optimizer.safetensors",
        "shard-1-of-2.safetensors"]
    assert contents(target, layers) == expected(1.0, 10)


def test_a_save_onto_a_file_is_refused_and_the_file_kept(tmp_path):
    target = tmp_path / "weights.bin"
    target.write_text("not a directory")
    with pytest.raises(NotADirectoryError, match="is a file"):
        save(target, layers_of_net(), 1.0, 10)
    assert target.read_text() == "not a directory"
    assert [p.name for p in tmp_path.iterdir()] == ["weights.bin"]


def test_mixed_torn_and_damaged_checkpoints_are_refused(tmp_path):
    layers = layers_of_net()
    first, second = tmp_path / "a", tmp_path / "b"
    save(first, layers, 1.0, 10)
    save(second, layers, 2.0, 20)
    mixed = tmp_path / "mixed"
    shutil.copytree(second, mixed)
    shutil.copy(first / "model.safetensors", mixed / "model.safetensors")
    with pytest.raises(CheckpointError, match="mixed: model.safetensors"):
        CheckpointReader(mixed)
    with pytest.raises(CheckpointError, match="mixed"):
        checkpoint.load_state(Net(), mixed)
    torn = tmp_path / "torn"
    shutil.copytree(second, torn)
    with open(torn / "optimizer.safetensors", "r+b") as data:
        data.truncate(100)
    with pytest.raises(CheckpointError, match="torn: optimizer.safetensors"):
        CheckpointReader(torn)
    missing = tmp_path / "missing"
    shutil.copytree(second, missing)
    os.unlink(missing / "optimizer.safetensors")
    with pytest.raises(CheckpointError, match="incomplete"):
        CheckpointReader(missing)
    damaged = tmp_path / "damaged"
    shutil.copytree(second, damaged)
    with open(damaged / "model.safetensors", "r+b") as data:
        data.seek(-3, os.SEEK_END)
        byte = data.read(1)
        data.seek(-3, os.SEEK_END)
        data.write(bytes([byte[0] ^ 0x10]))
    CheckpointReader(damaged)  # sizes and ids agree: only the CRC sees it
    with pytest.raises(CheckpointError, match="damaged"):
        verify_checkpoint(damaged)




def test_the_checkpoint_calls_refuse_bad_input_and_leave_nothing(tmp_path):
    """liblohan_client's checkpoint entry points (lohan_checkpoint.h) given
    NULLs, malformed JSON or calls out of order: each a clear error, no
    crash, and a save that never committed leaves nothing behind."""
    import ctypes

    from lohan import _native
    from lohan.client import LohanError, StatusCode

    lib = _native.library()
    out = ctypes.c_void_p()
    assert lib.lohan_checkpoint_open(None, 0, ctypes.byref(out)) == \
        StatusCode.INVALID_ARGUMENT
    assert lib.lohan_checkpoint_verify(None) == StatusCode.INVALID_ARGUMENT
    assert lib.lohan_checkpoint_save_begin(None, ctypes.byref(out)) == \
        StatusCode.INVALID_ARGUMENT
    assert lib.lohan_checkpoint_restore_layer(None, None, b"{}") == \
        StatusCode.INVALID_ARGUMENT
    assert lib.lohan_checkpoint_save_layer(None, None, 0) == \
        StatusCode.INVALID_ARGUMENT
    layers = layers_of_net()
    target = tmp_path / "ckpt"
    with checkpoint.Save(target) as save:
        with pytest.raises(LohanError, match="open the save") as early:
            save.write(0, "weights", torch.zeros(layers[0].numel))
        assert early.value.code == StatusCode.FAILED_PRECONDITION
        status = lib.lohan_checkpoint_save_open(save._handle, b"{\"layers\": 7")
        assert status == StatusCode.INVALID_ARGUMENT
        assert b"CheckpointContents" in lib.lohan_last_error()
        with pytest.raises(LohanError, match="unknown part"):
            save.open(checkpoint.contents_of(layers, ["weights", "momentum"],
                                             {}))
        save.open(checkpoint.contents_of(layers, PARTS, {}))
        with pytest.raises(LohanError, match="closed after 0 of"):
            save.close_files()
        for bad in (b"[1]", b"{\"x\": {}}", b"{\"x\": {\"bytes\": -1, "
                    b"\"crc32\": 0}}", b"{nope"):
            assert lib.lohan_checkpoint_save_commit(
                save._handle, b"{}", bad) == StatusCode.INVALID_ARGUMENT, bad
        staging = Path(save.staging)
        assert staging.is_dir()
    assert not staging.exists() and not target.exists()
    assert list(tmp_path.iterdir()) == []
