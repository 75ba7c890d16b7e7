"""Checkpoints are replaced whole (lohan.checkpoint): a save killed at any
point leaves the previous checkpoint or the new one, never a mix; a mixed,
torn or damaged directory is refused by name; a user's own files in the
directory survive saves. write_checkpoint is driven directly with a small
model's layer plan (no daemon needed)."""

from __future__ import annotations

import json
import os
import shutil
import signal
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


def test_an_interrupted_two_rename_switch_names_the_previous_checkpoint(
        tmp_path, monkeypatch):
    layers = layers_of_net()
    target = tmp_path / "ckpt"
    save(target, layers, 1.0, 10)
    monkeypatch.setattr(checkpoint, "_exchange", lambda a, b: False)
    real_rename = os.rename
    calls: List[str] = []

    def rename(source, destination):
        calls.append(str(destination))
        if len(calls) == 2:
            raise KeyboardInterrupt  # between the two renames
        real_rename(source, destination)
    monkeypatch.setattr(checkpoint.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        save(target, layers, 2.0, 20)
    monkeypatch.setattr(checkpoint.os, "rename", real_rename)
    with pytest.raises(FileNotFoundError, match="previous checkpoint is "
                       "whole in .*lohan-old"):
        CheckpointReader(target)
    (old,) = tmp_path.glob(".ckpt.lohan-old-*")
    real_rename(old, target)
    assert contents(target, layers) == expected(1.0, 10)
    save(target, layers, 3.0, 30)  # and the two-rename switch completes
    assert contents(target, layers) == expected(3.0, 30)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def _killed_save(target: Path, layers: List[Layer], kill_at: int) -> int:
    """Forks a child that saves (value 2, iteration 20) over `target` and
    SIGKILLs itself at the kill_at-th step of the save (each tensor written,
    each fsync, the switch, the removal of the previous checkpoint);
    returns how many steps the save has when kill_at is past them all."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        steps = [0]

        def step():
            steps[0] += 1
            if steps[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        try:
            write_tensor = checkpoint.SafetensorsWriter.write
            fsync, switch, rmtree = (checkpoint._fsync, checkpoint._switch,
                                     checkpoint.shutil.rmtree)

            def counted(real):
                def call(*args, **kwargs):
                    step()
                    return real(*args, **kwargs)
                return call
            checkpoint.SafetensorsWriter.write = counted(write_tensor)
            checkpoint._fsync = counted(fsync)
            checkpoint._switch = counted(switch)
            checkpoint.shutil.rmtree = counted(rmtree)
            save(target, layers, 2.0, 20)
            os.write(write, str(steps[0]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as out:
        total = out.read()
    _, status = os.waitpid(pid, 0)
    if kill_at > 0 and not total:
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9
    return int(total) if total else 0


@pytest.fixture
def one_thread():
    """The test forks: no thread pool of torch's may be running then. The
    count is put back after (other tests compare bits with processes that
    run at the default)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_save_killed_at_any_step_leaves_one_whole_checkpoint(
        tmp_path, one_thread):
    layers = layers_of_net()
    target = tmp_path / "ckpt"
    save(target, layers, 1.0, 10)
    total = _killed_save(target, layers, kill_at=0)  # counts the steps
    assert total > 2 * sum(len(layer.names) for layer in layers)
    seen = {"old": 0, "new": 0}
    for kill_at in range(1, total + 1):
        save(target, layers, 1.0, 10)
        assert _killed_save(target, layers, kill_at) == 0
        found = contents(target, layers)
        verify_checkpoint(target)
        assert found in (expected(1.0, 10), expected(2.0, 20)), kill_at
        seen["old" if found == expected(1.0, 10) else "new"] += 1
    # Killed before its switch: the previous one; after: the new one.
    assert seen["old"] > 0 and seen["new"] > 0
    print(f"save killed at each of its {total} steps: previous checkpoint "
          f"{seen['old']} times, new {seen['new']}, mixed or torn 0")
    # The next save clears what the killed ones left beside it.
    save(target, layers, 3.0, 30)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
