"""Data-parallel ranks through lohan (sharding.py), launched as users do
with torchrun on gloo: 2 and 4 ranks against one lohand, and 4 ranks on two
"servers" (two torchrun nodes, each with its own lohand, socket, state and
SSD directory). Each rank's job holds a shard of every layer's states;
the results must equal single-process torch AdamW on the global batch
within the fp32 tolerances of docs/pytorch.md (losses 1e-6 relative,
weights 1e-5 of the largest element, norms 1e-5 relative): the gradients
are only summed in another order. bf16 against the single-process lohan
run, within the bf16 5-step bounds (losses 1e-3, masters 1e-2).
"""

from __future__ import annotations

import json
import math
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest
import torch
from safetensors import safe_open

from conftest import Daemon, built
from data_parallel_worker import global_batches
from test_engine import BETAS, EPS, LR, WD, lm_loss, tiny_gpt

import lohan
from lohan.blocks import plan_layers
from lohan.checkpoint import (CheckpointError, CheckpointReader,
                              verify_checkpoint)
from lohan.client import DistributedRun, LohanError, StatusCode
from lohan.model_spec import ModelSpec

WORKER = Path(__file__).resolve().parent / "data_parallel_worker.py"
LOSS_RTOL, WEIGHT_ATOL_SCALE, NORM_RTOL = 1e-6, 1e-5, 1e-5
SIXTEEN_LOSS_RTOL, SIXTEEN_MASTER_RTOL = 1e-3, 1e-2
# Bounds a hung run only (a collective that never completes); a healthy
# one takes seconds.
RUN_SECONDS = 300


@pytest.fixture
def two_daemons() -> Iterator[List[Daemon]]:
    with tempfile.TemporaryDirectory(prefix="lohan-dp-") as directory:
        daemons = []
        try:
            for name in ("server0", "server1"):
                path = Path(directory) / name
                path.mkdir()
                daemons.append(Daemon(path))
            yield daemons
        finally:
            for daemon in daemons:
                daemon.stop(signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(config: Dict[str, Any], out: Path, socket_path: str,
           ranks_per_node: int, nodes: int = 1, node: int = 0,
           port: Optional[int] = None,
           prefix: Sequence[str] = ()) -> subprocess.Popen:
    """torchrun of the worker on one node (its ranks use `socket_path`),
    its command line after `prefix`."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"config{node}.json"
    path.write_text(json.dumps({**config, "out": str(out)}))
    rendezvous = (["--standalone"] if nodes == 1 else
                  ["--nnodes", str(nodes), "--node_rank", str(node),
                   "--master_addr", "127.0.0.1", "--master_port", str(port)])
    # TMPDIR: torchrun's agent leaves a torchelastic_* directory there.
    env = {**os.environ, "LOHAN_SOCKET": socket_path,
           "OMP_NUM_THREADS": "1", "TMPDIR": str(out)}
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "torch.distributed.run", *rendezvous,
         "--nproc_per_node", str(ranks_per_node), str(WORKER), str(path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)


def outputs_of(runs: Sequence[subprocess.Popen]) -> List[str]:
    """Every run's output once it ended (bounded by RUN_SECONDS: a rank
    left waiting in a collective fails the test)."""
    outputs = []
    for run in runs:
        try:
            output, _ = run.communicate(timeout=RUN_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            output, _ = run.communicate()
            pytest.fail(f"a torchrun did not finish in {RUN_SECONDS} s:\n"
                        + output[-4000:])
        outputs.append(output)
    return outputs


def finish(runs: Sequence[subprocess.Popen]) -> List[str]:
    """Every run's output; each must have succeeded."""
    outputs = outputs_of(runs)
    for run, output in zip(runs, outputs):
        assert run.returncode == 0, output[-6000:]
    return outputs


def train(config: Dict[str, Any], out: Path, sockets: Sequence[str],
          ranks_per_node: int) -> Dict[str, Any]:
    """The worker on len(sockets) nodes; rank 0's result.pt, with every
    rank's rank<r>.json under "ranks" and each node's output under
    "outputs"."""
    port = free_port()
    outputs = finish([launch(config, out, path, ranks_per_node, len(sockets),
                             node, port) for node, path in enumerate(sockets)])
    result = torch.load(out / "result.pt")
    result["outputs"] = outputs
    world = ranks_per_node * len(sockets)
    result["ranks"] = [json.loads((out / f"rank{r}.json").read_text())
                       for r in range(world)]
    return result


def config(**overrides: Any) -> Dict[str, Any]:
    return {"steps": 4, "micro": 1, "samples": 4, "dtype": "fp32",
            "max_grad_norm": 0.0,
            "buffers": "resident", "job_name": "dp", **overrides}


def reference(steps: int, micro: int, max_norm: float, world: int,
              skip: Sequence[int] = (), samples: int = 4,
              device: str = "cpu", sublayers: bool = False) -> Dict[str, Any]:
    """torch AdamW on the global batches (weight decay but for 1-D
    parameters, as no_weight_decay="1d"); steps in `skip` update nothing
    (lohan's inf/nan skip). Each global batch's gradient is accumulated
    over the `world` rank shares, each loss weighed by its share: the
    global batch's gradient, computed with the matmul shapes the ranks
    use, so that only the order of the sum over ranks differs."""
    model = tiny_gpt(sublayers=sublayers).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    exempt = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay},
                             {"params": exempt, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    losses, norms = [], []
    for index, step in enumerate(global_batches(steps, micro, samples)):
        for ids in step:
            total = 0.0
            for share in torch.tensor_split(torch.arange(len(ids)), world):
                loss = (lm_loss(model, ids[share].to(device)) * len(share)
                        / len(ids))
                (loss / micro).backward()
                total += loss.item()
            losses.append(total / micro)
        norms.append(float(torch.nn.utils.clip_grad_norm_(
            model.parameters(), max_norm if max_norm else math.inf)))
        if index not in skip:
            opt.step()
        opt.zero_grad()
    return {"losses": losses, "norms": norms,
            "weights": {k: v.detach().cpu().clone()
                        for k, v in model.state_dict().items()}}


def assert_weights_close(found: Dict[str, torch.Tensor],
                         expected: Dict[str, torch.Tensor],
                         rtol: float) -> None:
    # Masters name a tied parameter once (head.weight is tok.weight).
    assert found and found.keys() <= expected.keys()
    for name, got in found.items():
        want, got = expected[name], got.float()
        bound = rtol * float(want.abs().max())
        assert float((got - want.float()).abs().max()) <= bound, name


def max_relative(got: Sequence[float], want: Sequence[float]) -> float:
    return max(abs(g - w) / abs(w) for g, w in zip(got, want))


def max_weight_gap(found: Dict[str, torch.Tensor],
                   expected: Dict[str, torch.Tensor]) -> float:
    return max(float((got.float() - expected[name].float()).abs().max())
               / float(expected[name].abs().max())
               for name, got in found.items())


def assert_matches_adamw(result: Dict[str, Any], steps: int, micro: int,
                         max_norm: float, world: int,
                         device: str = "cpu",
                         sublayers: bool = False) -> Dict[str, Any]:
    want = reference(steps, micro, max_norm, world, device=device,
                     sublayers=sublayers)
    print(f"{world} ranks vs AdamW: losses "
          f"{max_relative(result['losses'], want['losses']):.2e}, norms "
          f"{max_relative([r[0] for r in result['results']], want['norms']):.2e}"
          f", weights {max_weight_gap(result['weights'], want['weights']):.2e}"
          " (of each tensor's largest)")
    assert result["losses"] == pytest.approx(want["losses"], rel=LOSS_RTOL)
    norms = [r[0] for r in result["results"]]
    assert norms == pytest.approx(want["norms"], rel=NORM_RTOL)
    clipped = [bool(r[1]) for r in result["results"]]
    assert clipped == [bool(max_norm) and n > max_norm
                       for n in want["norms"]]
    assert_weights_close(result["weights"], want["weights"],
                         WEIGHT_ATOL_SCALE)
    assert_weights_close(result["masters"], want["weights"],
                         WEIGHT_ATOL_SCALE)
    return want


def train_alone(socket_path: str, first: int, steps: int,
                **options: Any) -> Tuple[List[float], Dict[str, torch.Tensor]]:
    """One process through lohan on the whole global batches of steps
    first .. first + steps (the workers' settings otherwise): the losses
    and the final masters; its job deleted."""
    model = tiny_gpt()
    engine = lohan.init(model, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                        no_weight_decay="1d", blocks=list(model.blocks),
                        activations="keep", params="resident",
                        socket=socket_path, job_name="alone", **options)
    losses = []
    for step in global_batches(first + steps, 1, 4)[first:]:
        loss = lm_loss(model, step[0])
        engine.backward(loss)
        losses.append(loss.item())
        engine.step()
    masters = engine.master_weights()
    engine.close(delete_job=True)
    return losses, masters


def test_a_process_group_that_is_not_one_is_refused(lohand):
    model = tiny_gpt()
    with pytest.raises(TypeError, match="process_group must be"):
        lohan.init(model, socket=lohand.socket, process_group="gloo")
    # Nothing was created, and the daemon serves the next engine.
    with lohan.Client(lohand.socket) as client:
        assert client.jobs() == []
    engine = lohan.init(model, socket=lohand.socket, process_group=False,
                        job_name="after", blocks=list(model.blocks))
    assert engine.world_size == 1 and engine.rank == 0
    engine.close(delete_job=True)


def assert_sharded(result: Dict[str, Any], world: int) -> None:
    """Every rank had its own job, each layer cut into equal shards, and
    every rank saw the same step outcomes."""
    ranks = result["ranks"]
    assert [r["world_size"] for r in ranks] == [world] * world
    assert len({r["job_name"] for r in ranks}) == world
    model = tiny_gpt()
    layers = [layer.numel for layer in plan_layers(model,
                                                   list(model.blocks))]
    for r in ranks:
        assert r["shard_elements"] == [math.ceil(n / world) for n in layers]
        assert r["results"] == ranks[0]["results"]
        assert r["loss_scale"] == ranks[0]["loss_scale"]


def test_two_ranks_match_adamw_on_the_global_batch(lohand, tmp_path):
    # A clip limit below the first steps' norms: each daemon holds half of
    # every layer, so only the all-reduced sum of squares can decide it.
    norm = reference(1, 1, 0.0, 2)["norms"][0]
    max_norm = 0.6 * norm
    result = train(config(steps=5, max_grad_norm=max_norm), tmp_path,
                   [lohand.socket], 2)
    want = assert_matches_adamw(result, 5, 1, max_norm, 2)
    assert any(n > max_norm for n in want["norms"])
    assert_sharded(result, 2)


def test_two_ranks_with_offloaded_parameters(lohand, tmp_path):
    # Each block's weights are gathered from the ranks' shards just before
    # it runs, in forward and again for its recompute in backward.
    max_norm = 0.6 * reference(1, 1, 0.0, 2)["norms"][0]
    result = train(config(steps=4, max_grad_norm=max_norm, params="offload",
                          activations="offload"),
                   tmp_path, [lohand.socket], 2)
    assert_matches_adamw(result, 4, 1, max_norm, 2)
    assert_sharded(result, 2)


def test_two_ranks_start_a_meta_model_from_a_checkpoint(lohand, tmp_path):
    # The model built on meta in every rank; each rank's job takes its
    # shard of every layer from the file (lohan.init's weights=): the same
    # run as the model built with those weights.
    from safetensors.torch import save_file
    model = tiny_gpt()
    start = tmp_path / "start.safetensors"
    save_file({name: p.detach().contiguous()
               for name, p in model.named_parameters()}, start)
    max_norm = 0.6 * reference(1, 1, 0.0, 2)["norms"][0]
    out = tmp_path / "pretrained"
    result = train(config(steps=3, max_grad_norm=max_norm, params="offload",
                          activations="offload", weights=str(start),
                          save_pretrained=str(out)),
                   tmp_path, [lohand.socket], 2)
    assert_matches_adamw(result, 3, 1, max_norm, 2)
    assert_sharded(result, 2)
    # save_pretrained from the ranks: one checkpoint, every layer gathered
    # from the ranks' shards, equal to the trained masters (fp32, as the
    # file it started from).
    from safetensors.torch import load_file
    files = sorted(out.glob("*.safetensors"))
    assert len(files) > 1 and (out / "model.safetensors.index.json").exists()
    saved = {k: v for path in files for k, v in load_file(path).items()}
    assert sorted(saved) == sorted(name for name, _ in
                                   model.named_parameters())
    for name, tensor in saved.items():
        assert torch.equal(tensor, result["masters"][name]), name


def test_a_save_pretrained_that_fails_on_rank_0_fails_every_rank(
        lohand, tmp_path):
    # Rank 0 writes; past 64 KiB a file of its fails (RLIMIT_FSIZE). It
    # goes on with the gathers, so no rank waits for it, and then every
    # rank raises; nothing was put in place.
    from safetensors.torch import save_file
    start = tmp_path / "start.safetensors"
    save_file({name: p.detach().contiguous()
               for name, p in tiny_gpt().named_parameters()}, start)
    out = tmp_path / "pretrained"
    train(config(steps=1, params="offload", activations="offload",
                 weights=str(start), save_pretrained=str(out),
                 save_file_limit={"rank": 0, "bytes": 64 << 10}),
          tmp_path, [lohand.socket], 2)
    errors = [(tmp_path / f"save_error{r}.txt").read_text() for r in (0, 1)]
    assert errors[0].startswith("OSError"), errors
    assert errors[1].startswith("SaveFailed") and "rank 0" in errors[1], (
        errors)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()
            if p.name.startswith(".pretrained")] == []


def test_two_ranks_with_weights_a_sublayer_at_a_time(lohand, tmp_path):
    # Each sublayer's weights are gathered from the ranks' shards around
    # each of its runs (the ranks run them in the same order, keeping a
    # sublayer's weights for its next run alike); two micro-batches a
    # step.
    max_norm = 0.6 * reference(1, 2, 0.0, 2, sublayers=True)["norms"][0]
    result = train(config(steps=3, micro=2, max_grad_norm=max_norm,
                          params="offload", activations="offload",
                          sublayers=True, param_unit="sublayer"),
                   tmp_path, [lohand.socket], 2)
    assert_matches_adamw(result, 3, 2, max_norm, 2, sublayers=True)
    ranks = result["ranks"]
    # Per block its own layer (the norms) and two sublayers: 2 + 3 x 3.
    assert all(len(r["shard_elements"]) == 2 + 3 * 3 for r in ranks)
    assert ranks[0]["results"] == ranks[1]["results"]


def test_two_ranks_with_overlapped_steps(lohand, tmp_path):
    # overlap_step=True: each block's new weights are gathered just before
    # it next runs, the rest at the step's first gradient.
    max_norm = 0.6 * reference(1, 1, 0.0, 2)["norms"][0]
    result = train(config(steps=4, max_grad_norm=max_norm,
                          overlap_step=True),
                   tmp_path, [lohand.socket], 2)
    assert_matches_adamw(result, 4, 1, max_norm, 2)
    assert_sharded(result, 2)


def test_four_ranks_accumulate_through_streamed_buffers(lohand, tmp_path):
    max_norm = 0.8 * reference(1, 2, 0.0, 4)["norms"][0]
    result = train(config(steps=3, micro=2, buffers="streamed",
                          max_grad_norm=max_norm),
                   tmp_path, [lohand.socket], 4)
    assert_matches_adamw(result, 3, 2, max_norm, 4)
    assert_sharded(result, 4)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_four_ranks_on_two_servers_in_16_bits(two_daemons, tmp_path, dtype):
    # fp16 with a fixed loss scale: a dynamic one moves with how the
    # gradients overflow, which differs between a rank's share and the
    # whole batch (the ranks agree among themselves: assert_sharded).
    scale = 1024.0 if dtype == "fp16" else None
    sockets = [d.socket for d in two_daemons]
    result = train(config(steps=4, dtype=dtype, max_grad_norm=1.0,
                          loss_scale=scale),
                   tmp_path / "dp", sockets, 2)
    assert_sharded(result, 4)
    # The single-process lohan run of the same global batches.
    losses, masters = train_alone(sockets[0], 0, 4, max_grad_norm=1.0,
                                  dtype=dtype, loss_scale=scale)
    assert result["losses"] == pytest.approx(losses, rel=SIXTEEN_LOSS_RTOL)
    # The ranks' 16-bit gradients are rounded per rank share, the single
    # process's over the whole batch: an element whose true gradient is
    # about zero then moves by up to lr a step in a rounding-chosen
    # direction in either run (docs/pytorch.md's noise elements), so every
    # master is bounded by 2 lr a step, and all but 1% of them by the
    # 16-bit tolerance (measured: 0.022 at most, 0.15% beyond).
    total = beyond = 0
    for name, got in result["masters"].items():
        want = masters[name].float()
        gap = (got.float() - want).abs()
        assert float(gap.max()) <= 2 * LR * 4, name
        beyond += int((gap > SIXTEEN_MASTER_RTOL * float(want.abs().max()))
                      .sum())
        total += gap.numel()
    assert beyond <= 0.01 * total


SHARDS = [f"shard-{r:05d}-of-00004.safetensors" for r in range(4)]


def assert_sharded_checkpoint(saved: Path, world: int) -> Dict[str, Any]:
    """The ranks' shard files and the lohan.json describing them; its
    contents."""
    meta = json.loads((saved / "lohan.json").read_text())
    names = [f"shard-{r:05d}-of-{world:05d}.safetensors"
             for r in range(world)]
    assert not (saved / "model.safetensors").exists()
    plan = meta["sharding"]
    assert plan["world_size"] == world and plan["files"] == names
    model = tiny_gpt()
    layers = plan_layers(model, list(model.blocks))
    assert [(entry["numel"], entry["shard"], entry["names"])
            for entry in plan["layers"]] == [
        (layer.numel, math.ceil(layer.numel / world), layer.names)
        for layer in layers]
    assert sorted(meta["files"]) == names
    for rank, name in enumerate(names):
        assert meta["files"][name]["bytes"] == (saved / name).stat().st_size
        with safe_open(str(saved / name), "pt") as shard:
            assert shard.metadata()["lohan_save_id"] == meta["save_id"]
            assert shard.metadata()["lohan_rank"] == str(rank)
            for layer in layers:
                for part in ["weights", "exp_avg", "exp_avg_sq"]:
                    assert shard.get_slice(
                        f"layer.{layer.index}/{part}").get_shape() == [
                        math.ceil(layer.numel / world)]
    assert meta["optimizer_state"] == ["exp_avg", "exp_avg_sq"]
    assert meta["iteration"] == 3
    verify_checkpoint(saved)  # every CRC-32
    return meta


def refused(directory: Path, says: str, verify: bool = False) -> str:
    """The CheckpointError opening (or, with `verify`, verifying) the
    checkpoint raises; it must contain `says`."""
    with pytest.raises(CheckpointError) as error:
        (verify_checkpoint if verify else CheckpointReader)(directory)
    assert says in str(error.value), str(error.value)
    return str(error.value)


def assembled(checkpoint: Path, name: str, part: str) -> torch.Tensor:
    """A parameter's `part` put together from the shard files with the
    safetensors package alone, from lohan.json's sharding (an independent
    reader of the format liblohan_client writes and reads)."""
    plan = json.loads((checkpoint / "lohan.json").read_text())["sharding"]
    for index, layer in enumerate(plan["layers"]):
        if name not in layer["names"]:
            continue
        position = layer["names"].index(name)
        offset, shape = layer["offsets"][position], layer["shapes"][position]
        whole = torch.cat([
            safe_open(str(checkpoint / file), "pt").get_tensor(
                f"layer.{index}/{part}") for file in plan["files"]])
        return whole[offset:offset + math.prod(shape)].reshape(shape)
    raise KeyError(name)


def assert_reader_agrees(checkpoint: Path) -> None:
    """lohan's CheckpointReader (liblohan_client) assembles every
    parameter's weights and moments from the shards bit for bit as the
    safetensors package does."""
    reader = CheckpointReader(checkpoint)
    assert reader.names()
    for part in ["weights", *reader.moments]:
        for name in reader.names():
            assert torch.equal(reader.find([name], part),
                               assembled(checkpoint, name, part)), (part, name)


def test_a_sharded_checkpoint_of_four_ranks_resumes_on_two_and_alone(
        lohand, tmp_path):
    saved = tmp_path / "checkpoint"
    saved.mkdir()
    (saved / "notes.txt").write_text("mine")  # a save keeps the user's files
    train(config(steps=3, save=str(saved), job_name="first"),
          tmp_path / "four", [lohand.socket], 4)
    meta = assert_sharded_checkpoint(saved, 4)
    assert_reader_agrees(saved)
    assert (saved / "notes.txt").read_text() == "mine"
    want = reference(5, 1, 0.0, 4)
    after_three = reference(3, 1, 0.0, 4)["weights"]

    # Two ranks resume from it; rank 1 then cannot write its shard file of
    # the save into the same directory: every rank fails the save, and the
    # checkpoint stays the four ranks' one.
    result = train(config(steps=2, first_step=3, resume=str(saved),
                          job_name="second", save=str(saved),
                          save_file_limit={"rank": 1, "bytes": 16384}),
                   tmp_path / "two", [lohand.socket], 2)
    assert result["losses"] == pytest.approx(want["losses"][3:],
                                             rel=LOSS_RTOL)
    assert [r[3] for r in result["results"]] == [4.0, 5.0]
    assert_weights_close(result["weights"], want["weights"],
                         WEIGHT_ATOL_SCALE)
    errors = [(tmp_path / "two" / f"save_error{r}.txt").read_text()
              for r in range(2)]
    assert "File too large" in errors[1], errors
    assert "failed writing the shard files on rank 1" in errors[0], errors
    assert "File too large" in errors[0], errors
    assert json.loads((saved / "lohan.json").read_text()) == meta
    verify_checkpoint(saved)
    assert sorted(p.name for p in saved.iterdir()) == sorted(
        SHARDS + ["lohan.json", "notes.txt"])
    assert not list(tmp_path.glob(".checkpoint.lohan-*"))  # no staging left

    # One process resumes from it too (any number of ranks does).
    losses, masters = train_alone(lohand.socket, 3, 2, dtype="fp32",
                                  resume=str(saved))
    assert losses == pytest.approx(want["losses"][3:], rel=LOSS_RTOL)
    assert_weights_close(masters, want["weights"], WEIGHT_ATOL_SCALE)
    # load_state assembles the weights from the shards as well.
    fresh = tiny_gpt(seed=5)
    assert lohan.load_state(fresh, saved) == []
    assert_weights_close({k: v.detach() for k, v in fresh.named_parameters()},
                         after_three,
                         WEIGHT_ATOL_SCALE)

    # A torn, damaged, incomplete or mixed copy is refused naming the file.
    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(saved, target)
        return target

    torn = copy("torn")
    with open(torn / SHARDS[1], "r+b") as shard:
        shard.truncate((torn / SHARDS[1]).stat().st_size - 4)
    refused(torn, f"is torn: {SHARDS[1]} has")
    with pytest.raises(CheckpointError, match="is torn"):
        lohan.load_state(tiny_gpt(), torn)
    damaged = copy("damaged")
    with open(damaged / SHARDS[3], "r+b") as shard:
        shard.seek(-10, os.SEEK_END)
        byte = shard.read(1)
        shard.seek(-10, os.SEEK_END)
        shard.write(bytes([byte[0] ^ 0x10]))
    refused(damaged, f"{SHARDS[3]} is damaged (CRC-32", verify=True)
    missing = copy("missing")
    (missing / SHARDS[2]).unlink()
    refused(missing, f"lists {SHARDS[2]}, which is missing")
    with pytest.raises(CheckpointError, match=SHARDS[2]):
        lohan.init(tiny_gpt(), socket=lohand.socket, job_name="never",
                   resume=str(missing))
    mixed = copy("mixed")
    other = dict(meta, save_id="0" * 32)
    (mixed / "lohan.json").write_text(json.dumps(other))
    refused(mixed, f"is mixed: {SHARDS[0]} comes from save {meta['save_id']}")


def private_mounts() -> bool:
    """Whether this process may run a command in its own mount namespace
    (root, or a user namespace allowed)."""
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private",
                               "true"], capture_output=True,
                              timeout=60).returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not private_mounts(),
                    reason="needs unshare -m (a mount namespace)")
def test_a_save_the_ranks_do_not_all_see_is_refused(two_daemons, tmp_path):
    # Server1's ranks see an empty directory of their own (a tmpfs in
    # their mount namespace) where server0's see the save's directory:
    # two servers without a shared filesystem.
    shared = tmp_path / "shared"
    shared.mkdir()
    alone = ["unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs lohan-test "$0" && exec "$@"', str(shared)]
    out, port = tmp_path / "out", free_port()
    runs = [launch(config(steps=1, save=str(shared / "checkpoint")), out,
                   daemon.socket, 2, 2, node, port,
                   prefix=alone if node == 1 else ())
            for node, daemon in enumerate(two_daemons)]
    for output in ended(runs):
        assert ("engine.save with data-parallel ranks needs a directory "
                "every rank sees (a shared filesystem): rank(s) 2, 3 cannot "
                "see") in output, output[-4000:]
    assert list(shared.iterdir()) == []  # rank 0 removed its staging


def test_a_non_finite_gradient_on_one_rank_skips_every_rank(lohand,
                                                            tmp_path):
    # Three ranks: no layer of TinyGPT divides by 3, so every shard set
    # ends in padding.
    max_norm = 0.6 * reference(1, 1, 0.0, 3, samples=6)["norms"][0]
    result = train(config(steps=3, poison=1, max_grad_norm=max_norm,
                          samples=6),
                   tmp_path, [lohand.socket], 3)
    assert_sharded(result, 3)  # the others skipped as rank 1 did
    assert [bool(r[2]) for r in result["results"]] == [False, True, False]
    assert [r[3] for r in result["results"]] == [1.0, 1.0, 2.0]
    want = reference(3, 1, max_norm, 3, skip=[1], samples=6)
    assert_weights_close(result["weights"], want["weights"],
                         WEIGHT_ATOL_SCALE)


def wait_for_step(out: Path, rank: int, step: int,
                  runs: Sequence[subprocess.Popen]) -> None:
    """Until `rank` has committed `step` steps (bounded like a run)."""
    deadline = time.monotonic() + RUN_SECONDS
    marker = out / f"step{rank}"
    while not (marker.exists() and marker.read_text()
               and int(marker.read_text()) >= step):
        if any(run.poll() is not None for run in runs):
            pytest.fail("a torchrun ended early:\n" + "".join(
                run.communicate()[0][-4000:] for run in runs))
        if time.monotonic() > deadline:
            pytest.fail(f"rank {rank} did not reach step {step}")
        time.sleep(0.05)


def ended(runs: Sequence[subprocess.Popen]) -> List[str]:
    """Every run's output once it ended; each must have failed."""
    outputs = outputs_of(runs)
    for run, output in zip(runs, outputs):
        assert run.returncode != 0, output[-4000:]
    return outputs


def two_servers(two_daemons: List[Daemon], out: Path,
                **overrides: Any) -> List[subprocess.Popen]:
    port = free_port()
    return [launch(config(steps=100000, **overrides), out, daemon.socket, 2,
                   2, node, port) for node, daemon in enumerate(two_daemons)]


def test_a_killed_daemon_ends_every_rank_naming_it(two_daemons, tmp_path):
    # Server1's lohand (ranks 2 and 3) dies as step 2's gradients start to
    # reach the daemons, after the ranks agreed on step 1's commit.
    port = free_port()
    killed = {"rank": 2, "step": 2, "pid": two_daemons[1].process.pid,
              "after": True}
    runs = [launch(config(steps=4, kill_daemon=killed), tmp_path,
                   daemon.socket, 2, 2, node, port)
            for node, daemon in enumerate(two_daemons)]
    first, second = ended(runs)
    # Server1's ranks lose their daemon; server0's are told which rank
    # stopped and why, not just that a peer vanished.
    assert "LohanError" in second, second[-4000:]
    assert "data-parallel ranks failed: rank " in first, first[-4000:]
    # Server0's jobs stay with their daemon.
    with lohan.Client(two_daemons[0].socket) as client:
        names = sorted(job.name for job in client.jobs())
    assert names == ["dp.rank0", "dp.rank1"]


def committed_steps(socket_path: str) -> Dict[str, int]:
    """Per job name, the committed steps of the jobs with a data plane
    open on that daemon."""
    with lohan.Client(socket_path) as client:
        names = {job.id: job.name for job in client.jobs()}
        sessions = client.status().get("sessions", [])
    return {names[s["job_id"]]: int(s.get("committed_iteration", 0))
            for s in sessions if s.get("job_id") in names}


def test_a_daemon_lost_between_the_ranks_commits_resumes_where_all_did(
        two_daemons, tmp_path):
    # Rank 2 freezes server1's daemon once every rank has summed step 2's
    # norm: server0's ranks commit it (their jobs at 3 steps), rank 2
    # cannot, nor rank 3 (it waits for the freeze before its ITER_END), and
    # server0's then wait in the next collective.
    server0, server1 = two_daemons
    port = free_port()
    frozen = {"rank": 2, "step": 2, "pid": server1.process.pid, "then": [3]}
    runs = [launch(config(steps=3, stop_daemon=frozen), tmp_path / "first",
                   daemon.socket, 2, 2, node, port)
            for node, daemon in enumerate(two_daemons)]
    deadline = time.monotonic() + RUN_SECONDS
    while committed_steps(server0.socket) != {"dp.rank0": 3, "dp.rank1": 3}:
        assert time.monotonic() < deadline, committed_steps(server0.socket)
        assert all(run.poll() is None for run in runs)
        time.sleep(0.05)
    server1.stop(signal.SIGKILL)
    ended(runs)
    two_daemons[1] = server1 = Daemon(server1.directory)  # restarted

    # Resumed, server0's ranks go back the step server1's never committed
    # (their daemon kept it), and every rank trains on from step 2: the
    # same as AdamW without the interruption.
    result = train(config(steps=2, first_step=2, resume=True),
                   tmp_path / "second", [server0.socket, server1.socket], 2)
    want = reference(4, 1, 0.0, 4)
    print(f"resumed where all committed vs AdamW: losses "
          f"{max_relative(result['losses'], want['losses'][2:]):.2e}, "
          f"weights {max_weight_gap(result['weights'], want['weights']):.2e},"
          f" masters {max_weight_gap(result['masters'], want['weights']):.2e}")
    assert result["losses"] == pytest.approx(want["losses"][2:],
                                             rel=LOSS_RTOL)
    assert [r[3] for r in result["results"]] == [3.0, 4.0]
    assert_weights_close(result["weights"], want["weights"],
                         WEIGHT_ATOL_SCALE)
    assert_weights_close(result["masters"], want["weights"],
                         WEIGHT_ATOL_SCALE)
    first_server, second_server = result["outputs"]
    assert first_server.count("goes back to step 2") == 2, first_server
    # Neither of server1's ranks committed step 2: neither goes back.
    assert "goes back" not in second_server, second_server[-4000:]


def test_a_daemon_lost_between_steps_is_named_at_the_agreement(
        two_daemons, tmp_path):
    # Server1's lohand dies as rank 2 begins step 3: server1's ranks' next
    # request (rank 3's waits for the kill) is the agreement on step 2's
    # commit, which tells every rank who failed; no rank stops before
    # every rank has the agreement.
    port = free_port()
    killed = {"rank": 2, "step": 2, "pid": two_daemons[1].process.pid,
              "then": [3]}
    runs = [launch(config(steps=4, kill_daemon=killed), tmp_path,
                   daemon.socket, 2, 2, node, port)
            for node, daemon in enumerate(two_daemons)]
    first, second = ended(runs)
    assert ("data-parallel ranks [2, 3] did not commit step 2 (the ranks "
            "report [2, 2, -1, -1]") in first, first[-4000:]
    assert "UNAVAILABLE" in second, second[-4000:]


def test_a_killed_rank_ends_every_rank(two_daemons, tmp_path):
    runs = two_servers(two_daemons, tmp_path)
    wait_for_step(tmp_path, 3, 2, runs)
    os.kill(int((tmp_path / "pid3").read_text()), signal.SIGKILL)
    first, second = ended(runs)
    assert "data-parallel ranks failed" in first, first[-4000:]


def lohanctl(socket_path: str, *args: str) -> str:
    done = subprocess.run(
        [str(built("client/ctl/lohanctl")), "--socket", socket_path, *args],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_rows(text: str, run: str) -> List[List[str]]:
    """The rows of lohanctl's run table for `run`, split at blanks."""
    return [line.split() for line in text.splitlines()
            if line.split()[:1] == [run]]


def test_the_ranks_jobs_show_as_one_run(lohand, tmp_path):
    result = train(config(steps=2, keep_job=True, job_name="tied"),
                   tmp_path / "a", [lohand.socket], 2)
    status = json.loads(lohanctl(lohand.socket, "status", "--json"))
    # Closed cleanly, each job keeps one version of its states (fp32: 12
    # bytes a parameter, and its meta), not the step before as well.
    for job in status["jobs"]:
        rank = job["spec"]["run"]["rank"]
        states = 12 * sum(result["ranks"][rank]["shard_elements"])
        assert states <= int(job["ssd_bytes"]) < 1.5 * states, job
    # Every job's JSON has its run: the name without ".rank<r>", its rank
    # and the world size.
    assert {job["spec"]["name"]: job["spec"]["run"]
            for job in status["jobs"]} == {
        f"tied.rank{r}": {"name": "tied", "rank": r, "world_size": 2}
        for r in range(2)}
    ids = [job["id"] for job in sorted(
        status["jobs"], key=lambda job: job["spec"]["run"]["rank"])]
    owner = pwd.getpwuid(os.getuid()).pw_name
    for command in ("status", "jobs"):
        text = lohanctl(lohand.socket, command)
        assert "distributed runs" in text, text
        rows = run_rows(text, "tied")
        # One entry for both jobs, neither listed on its own.
        assert len(rows) == 1, text
        assert rows[0][:5] == ["tied", owner, "2", "0,1", "detached"], text
        assert rows[0][-2:] == ids, text
        assert "tied.rank" not in text, text
    # status has the ranks' iterations: none training now.
    assert run_rows(lohanctl(lohand.socket, "status"), "tied")[0][5] == "-"

    # resume=True finds each rank's job by its name: the same two jobs, still
    # one run, two steps on.
    train(config(steps=2, keep_job=True, job_name="tied", resume=True,
                 first_step=2), tmp_path / "b", [lohand.socket], 2)
    status = json.loads(lohanctl(lohand.socket, "status", "--json"))
    assert sorted(job["id"] for job in status["jobs"]) == sorted(ids)
    rows = run_rows(lohanctl(lohand.socket, "status"), "tied")
    assert len(rows) == 1 and rows[0][-2:] == ids


def test_a_rank_closing_without_the_others_warns_and_closes(lohand, tmp_path):
    # Rank 1 ends without closing: rank 0's close cannot agree on the last
    # commit with it, says so, and closes all the same (its job keeps the
    # step before until its next step; nothing waits).
    port = free_port()
    run = launch(config(steps=2, keep_job=True, exit_before_close=1),
                 tmp_path, lohand.socket, 2, 1, 0, port)
    output = outputs_of([run])[0]
    assert "rank 0 closed without the other ranks" in output, output[-4000:]
    assert (tmp_path / "closed0").exists(), output[-4000:]
    assert not (tmp_path / "closed1").exists()
    with lohan.Client(lohand.socket) as client:
        assert sorted(job.name for job in client.jobs()) == [
            "dp.rank0", "dp.rank1"]


def test_bad_runs_are_refused_saying_what_is_allowed(lohand):
    spec = ModelSpec(layer_elements=[1024])
    bad = [
        (DistributedRun("", 0, 2), "run name must be 1 to 64 characters"),
        (DistributedRun("a/b", 0, 2),
         "may hold only letters, digits, '.', '_' and '-'"),
        (DistributedRun("dp", 0, 1),
         "a distributed run has at least 2 ranks"),
        (DistributedRun("dp", 2, 2),
         "rank 2 is not below its world_size 2"),
    ]
    with lohan.Client(lohand.socket) as client:
        for run, says in bad:
            with pytest.raises(LohanError) as refused:
                client.create_job_for_model("bad", spec, run=run)
            assert refused.value.code == StatusCode.INVALID_ARGUMENT, run
            assert says in refused.value.message, refused.value.message
        assert client.jobs() == []
        job, _ = client.create_job_for_model(
            "dp.rank0", spec, run=DistributedRun("dp", 0, 2))
        with pytest.raises(LohanError) as refused:
            client.create_job_for_model(
                "again", spec, run=DistributedRun("dp", 0, 2))
        assert refused.value.code == StatusCode.ALREADY_EXISTS
        assert (f"rank 0 of run 'dp' is already job {job.id} ('dp.rank0')"
                in refused.value.message), refused.value.message
        client.create_job_for_model("dp.rank1", spec,
                                    run=DistributedRun("dp", 1, 2))


OLD_SHARDED = (Path(__file__).resolve().parents[1] / "data" / "checkpoints"
               / "main-63a1563" / "tiny-gpt-2-ranks")


def test_a_sharded_checkpoint_main_wrote_before_the_client_core_resumes(
        lohand):
    """Two ranks of main at 63a1563 saved it after 2 steps
    (tests/data/checkpoints/main-63a1563): it still verifies, reads as the
    safetensors package assembles it, and one process resumes from it where
    torch AdamW is after 2 more steps."""
    verify_checkpoint(OLD_SHARDED)
    assert_reader_agrees(OLD_SHARDED)
    want = reference(4, 1, 0.0, 2)
    losses, masters = train_alone(lohand.socket, 2, 2, dtype="fp32",
                                  resume=str(OLD_SHARDED))
    assert losses == pytest.approx(want["losses"][2:], rel=LOSS_RTOL)
    assert_weights_close(masters, want["weights"], WEIGHT_ATOL_SCALE)
