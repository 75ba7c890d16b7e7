"""Elastic shares (issue #47): lohand asks a job whose arena holds more
than its owner's share of the host pool to move its data plane to a
smaller arena when another user needs that share, and to grow back when
the pool has room again (CompletionEntry.arena_asked, at an iteration's
end). The engine follows between steps (lohan/share_move.py): it keeps
training, says so once per move, engine.status() shows the arena it has,
the one its job asks for and the last move, and every loss and weight is
the uninterrupted run's, bit for bit.

The moves need root: a second user (nobody, through setpriv) opens a data
plane that needs the root job's share. What the engine does when the
client library's move fails runs without: Client.follow_share replaced.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
import torch
from torch import nn

import lohan
from conftest import REPO, Daemon, built
from lohan.client import Client, DataPlane, LohanError, Model, StatusCode

MIB = 1 << 20
LR, WD = 1e-3, 0.01
# Moves as soon as asked: no interval between takings-back, no grace, and
# a job grows back at the first iteration's end after the pool has room.
SHARES = ('[quotas]\nreclaim_interval = "0s"\nreclaim_grace = "0s"\n'
          'regrow_after = "0s"\n')

# Another user's job: created for POOL bytes, attached, its plane opened
# (retried while the pool is short: lohand asks root's job to give way
# meanwhile), a one-layer model registered and an iteration begun (a
# plane earns its owner's share only once it trains); holds until its
# stdin closes.
NOBODY = r"""
import sys, time
from lohan.client import Client, LohanError
socket, pool = sys.argv[1], int(sys.argv[2])
client = Client(socket)
job = client.create_job("nobody-trains", host_pool_bytes=pool)
client.attach_job(job.id)
deadline = time.monotonic() + 120
while True:
    try:
        plane = client.open_data_plane(job.id)
        break
    except LohanError as error:
        if time.monotonic() > deadline:
            print("refused", error, flush=True)
            sys.exit(1)
        time.sleep(0.05)
model = plane.register_model(job.id, [1024])
model.init_weights(0)
model.iter_begin()
print("began", job.id, plane.size, flush=True)
sys.stdin.read()
"""


class _Stack(nn.Module):
    """8 blocks of 384x384 fp32 and a head: one gradient and one weight
    buffer per layer take about 12 MiB of arena, two shared ones of each
    about 4."""

    def __init__(self, frozen: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(384, 384), nn.Tanh()) for _ in range(8))
        self.head = nn.Linear(384, 1)
        if frozen:  # a LoRA-like base: the blocks' biases stay as made
            for block in self.blocks:
                block[0].bias.requires_grad_(False)
                block[0].bias.data.normal_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


# The layouts a move must carry: resident parameters; offloaded blocks
# with their inputs and frozen weights on the daemon's SSDs (through the
# activation area, which the daemon drops with a plane); and blocks that
# fetch their weights lazily after step() (overlap_step).
LAYOUTS = {
    "resident": dict(activations="keep", activation_buffer_bytes=0),
    "offload-frozen-on-ssd": dict(
        activations="offload", params="offload", activation_host_bytes=0,
        activation_buffer_bytes=MIB, frozen_host_bytes=0),
    "overlap": dict(activations="keep", activation_buffer_bytes=0,
                    overlap_step=True),
}


def _engine(model: nn.Module, socket: str, name: str, layout: str,
            **more: Any) -> lohan.Engine:
    return lohan.init(model, lr=LR, weight_decay=WD, socket=socket,
                      job_name=name, stream_buffers=2, **LAYOUTS[layout],
                      **more)


def _step(engine: lohan.Engine, model: nn.Module, step: int) -> float:
    x = torch.randn(8, 384, generator=torch.Generator().manual_seed(step))
    loss = model(x).pow(2).mean()
    loss.backward()
    engine.step()
    return loss.item()


def _straight(socket: str, layout: str,
              steps: int) -> Tuple[List[float], nn.Module]:
    """The uninterrupted run: its losses and its model."""
    model = _Stack(frozen=layout == "offload-frozen-on-ssd")
    with _engine(model, socket, "straight", layout) as engine:
        losses = [_step(engine, model, step) for step in range(steps)]
        engine.close(delete_job=True)
    return losses, model


def _assert_same(model: nn.Module, straight: nn.Module) -> None:
    for (name, a), (_, b) in zip(model.named_parameters(),
                                 straight.named_parameters()):
        assert torch.equal(a, b), name


def _moves(said: List[warnings.WarningMessage]) -> List[str]:
    return [str(w.message) for w in said
            if str(w.message).startswith("lohan: lohand ")]


# --------------------------------------------------- a real second user


class _SharedDaemon:
    """A lohand a second uid reaches (its directory 0755 in /tmp), with
    SHARES, and that user's processes."""

    def __init__(self, pool: str) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="lohan-shares-",
                                               dir="/tmp"))
        self.directory.chmod(0o755)
        shutil.copy(built("client/liblohan_client.so"), self.directory)
        config = self.directory / "lohand.toml"
        config.write_text(SHARES)
        self.daemon = Daemon(self.directory, host_pool=pool,
                             ssd_capacity="256MiB",
                             extra_args=["--config", str(config)])
        self.others: List[subprocess.Popen] = []

    @property
    def socket(self) -> str:
        return self.daemon.socket

    def nobody(self, pool: int) -> subprocess.Popen:
        """NOBODY as uid 65534, training in a plane of `pool` bytes."""
        process = subprocess.Popen(
            ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
             "--clear-groups", "/usr/bin/python3", "-c", NOBODY,
             self.socket, str(pool)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            env={"PYTHONPATH": str(REPO / "plugins" / "pytorch"),
                 "LOHAN_CLIENT_LIB": str(
                     self.directory / "liblohan_client.so"),
                 "PYTHONDONTWRITEBYTECODE": "1"})
        self.others.append(process)
        return process

    def session(self, job_id: str) -> Dict[str, Any]:
        with Client(self.socket) as client:
            for session in client.status().get("sessions", []):
                if session.get("job_id") == job_id:
                    return session
        return {}

    def asked(self, job_id: str) -> int:
        """Waits until lohand asks the job to shrink (what it will ask at
        the job's next iteration end) and returns the arena asked."""
        return self._until(lambda: int(
            self.session(job_id).get("arena_asked_bytes", 0)))

    def only(self, job_id: str) -> None:
        """Waits until the job's arena is all the pool holds (the other
        user's plane gone): lohand asks it to grow at its next iteration
        end (regrow_after 0)."""
        def alone() -> bool:
            with Client(self.socket) as client:
                used = int(client.status()["pool"].get("used_bytes", 0))
            return used == int(self.session(job_id)["arena_bytes"])
        self._until(alone)

    def _until(self, value: Callable[[], Any], timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = value()
            if found:
                return found
            time.sleep(0.02)
        raise AssertionError("lohand never got there: "
                             + self.daemon.log()[-4000:])

    def close(self) -> None:
        for process in self.others:
            process.kill()
            process.wait(timeout=60)
        self.daemon.stop(signal.SIGKILL)
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def shared() -> Iterator[_SharedDaemon]:
    if os.getuid() != 0:
        pytest.skip("needs root to run a second user as nobody")
    daemon = _SharedDaemon(pool="16MiB")
    try:
        yield daemon
    finally:
        daemon.close()


def _first_line(process: subprocess.Popen, timeout: float = 120.0) -> str:
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, "the second user's process said nothing"
    return process.stdout.readline().strip()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_job_over_its_share_shrinks_for_another_user_and_grows_back(
        shared: _SharedDaemon, layout: str) -> None:
    """Root's job holds about 12 of the pool's 16 MiB (its share beside
    another user: 8). Nobody's plane of 8 MiB makes lohand ask root's job
    to shrink; it moves at its next step's end to a streamed arena and
    nobody's plane opens; once nobody has gone it grows back to one
    buffer per layer. Eight steps, both moves inside them, give the
    uninterrupted run's losses and weights bit for bit."""
    straight_losses, straight = _straight(shared.socket, layout, 8)
    model = _Stack(frozen=layout == "offload-frozen-on-ssd")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with _engine(model, shared.socket, "wide", layout) as engine:
            job = engine.status()["job_id"]
            wanted = engine.status()["wanted_arena_bytes"]
            assert engine.buffers == "resident"
            assert engine.status()["arena_bytes"] == wanted > 8 * MIB
            losses = [_step(engine, model, step) for step in range(2)]

            nobody = shared.nobody(8 * MIB)
            smaller = shared.asked(job)
            assert smaller < wanted
            losses.append(_step(engine, model, 2))  # moves at its end
            status = engine.status()
            assert status["arena_bytes"] == smaller
            assert engine.buffers == "streamed"
            assert status["stream_buffers"] >= 1
            assert status["wanted_arena_bytes"] == wanted
            assert status["arena_moves"] == 1
            move = status["last_arena_move"]
            assert (move["from_bytes"], move["to_bytes"]) == (wanted,
                                                              smaller)
            assert move["buffers"] == "streamed" and move["why"]
            assert int(status["session"]["arena_bytes"]) == smaller
            assert _first_line(nobody).startswith("began j-")

            losses += [_step(engine, model, step) for step in (3, 4)]
            nobody.stdin.close()  # nobody's plane goes
            nobody.wait(timeout=60)
            shared.only(job)
            losses.append(_step(engine, model, 5))  # grows back at its end
            status = engine.status()
            assert status["arena_bytes"] == wanted
            assert engine.buffers == "resident"
            assert status["arena_moves"] == 2
            assert status["last_arena_move"]["to_bytes"] == wanted
            losses += [_step(engine, model, step) for step in (6, 7)]
            assert engine.iteration == 8
    moves = _moves(said)
    assert len(moves) == 2, moves
    assert moves[0].startswith(
        f"lohan: lohand moved job 'wide' to a {smaller // MIB} MiB arena "
        f"(was {wanted // MIB} MiB; gradients and weights now streamed "
        "through ")
    assert moves[1].startswith(
        f"lohan: lohand grew job 'wide' back to a {wanted // MIB} MiB "
        f"arena (was {smaller // MIB} MiB; gradients and weights now "
        "resident")
    assert losses == straight_losses
    _assert_same(model, straight)


# Data-parallel ranks (torchrun on gloo), each its own job with a shard of
# every layer: each job moves on its own, lohand asking one of them or
# both, so the ranks' layouts may differ for a while. Every rank pauses
# before the steps PAUSES names (out/paused-R-S, waits for out/go-S).
DP_WORKER = r"""
import json, sys, time, warnings
from pathlib import Path
import torch
import torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from test_share_move import _engine, _Stack
import lohan
out, pauses = Path(sys.argv[2]), [int(s) for s in sys.argv[3:]]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
model = _Stack()
losses = []
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    engine = _engine(model, None, "dp", "resident")  # $LOHAN_SOCKET
    for step in range(8):
        if step in pauses:
            (out / f"paused-{rank}-{step}").touch()
            while not (out / f"go-{step}").exists():
                time.sleep(0.01)
        x = torch.randn(8, 384, generator=torch.Generator().manual_seed(
            10 * step + rank))
        loss = model(x).pow(2).mean()
        loss.backward()
        engine.step()
        losses.append(loss.item())
    status = engine.status()
    engine.close(delete_job=True)
moves = [str(w.message) for w in said
         if str(w.message).startswith("lohan: lohand ")]
(out / f"rank{rank}.json").write_text(json.dumps(
    {"losses": losses, "moves": moves, "arena_moves": status["arena_moves"]}))
if rank == 0:
    torch.save(dict(model.named_parameters()), out / "weights.pt")
dist.destroy_process_group()
"""


def _ranks(socket: str, out: Path, *pauses: int) -> subprocess.Popen:
    out.mkdir()
    script = out / "worker.py"
    script.write_text(DP_WORKER)
    env = {**os.environ, "LOHAN_SOCKET": socket, "OMP_NUM_THREADS": "1",
           "TMPDIR": str(out),
           "PYTHONPATH": str(REPO / "plugins" / "pytorch")}
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc_per_node", "2", str(script),
         str(Path(__file__).resolve().parent), str(out),
         *map(str, pauses)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _ranks_done(run: subprocess.Popen, out: Path) -> List[Dict[str, Any]]:
    output, _ = run.communicate(timeout=300)
    assert run.returncode == 0, output[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _paused(out: Path, step: int, run: subprocess.Popen) -> None:
    for rank in (0, 1):
        _wait_for(out / f"paused-{rank}-{step}", run)


def test_data_parallel_ranks_move_each_on_their_own(
        shared: _SharedDaemon, tmp_path: Path) -> None:
    """Two ranks' jobs hold about 13 of the pool's 16 MiB; nobody's 8 MiB
    plane makes lohand ask one or both to shrink at step 2's end and to
    grow back at step 5's once nobody has gone. Every rank's losses and
    the final weights are those of the unmoved run, bit for bit."""
    straight_out = tmp_path / "straight"
    straight = _ranks_done(_ranks(shared.socket, straight_out),
                           straight_out)
    out = tmp_path / "moved"
    run = _ranks(shared.socket, out, 2, 5)
    _paused(out, 2, run)
    with Client(shared.socket) as client:
        jobs = [j.id for j in client.jobs() if j.name.startswith("dp.")]
    assert len(jobs) == 2
    nobody = shared.nobody(8 * MIB)
    shared._until(lambda: any(
        int(shared.session(job).get("arena_asked_bytes", 0)) for job in jobs))
    (out / "go-2").touch()
    assert _first_line(nobody).startswith("began j-")
    _paused(out, 5, run)
    nobody.stdin.close()
    nobody.wait(timeout=60)

    def alone() -> bool:
        with Client(shared.socket) as client:
            used = int(client.status()["pool"].get("used_bytes", 0))
        return used == sum(int(shared.session(job)["arena_bytes"])
                           for job in jobs)
    shared._until(alone)
    (out / "go-5").touch()
    ranks = _ranks_done(run, out)
    moved = [rank["arena_moves"] for rank in ranks]
    assert sum(moved) >= 2 and all(m % 2 == 0 for m in moved), ranks
    for rank in ranks:
        assert len(rank["moves"]) == rank["arena_moves"], rank
    assert [r["losses"] for r in ranks] == [r["losses"] for r in straight]
    a = torch.load(out / "weights.pt")
    b = torch.load(straight_out / "weights.pt")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# The libtorch plugin's Engine (plugins/libtorch/engine.cc) follows at its
# step's end the same way: plugins/libtorch/checkpoint_tool trains
# linear_tanh.h's model (here as wide as _Stack), pausing before the
# steps named, and saves.
LIBTORCH = ["--dim", "384", "--blocks", "8", "--steps", "8"]


def _libtorch(socket: str, job: str, out: Path,
              *args: str) -> subprocess.Popen:
    out.mkdir()
    return subprocess.Popen(
        [str(built("plugins/libtorch/checkpoint_tool")), "--socket", socket,
         "--job", job, *LIBTORCH, "--save", str(out / "saved"),
         "--losses", str(out / "losses"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.02)


def _job_of(socket: str, name: str) -> str:
    with Client(socket) as client:
        (job,) = [j for j in client.jobs() if j.name == name]
    return job.id


def test_the_libtorch_engine_follows_too(shared: _SharedDaemon,
                                         tmp_path: Path) -> None:
    """checkpoint_tool's 8 steps with a shrink at step 2's end and a grow
    at step 5's save the checkpoint and losses of its uninterrupted run,
    bit for bit, and say each move on stderr."""
    from safetensors.torch import load_file
    straight = _libtorch(shared.socket, "straight", tmp_path / "straight")
    _, errors = straight.communicate(timeout=300)
    assert straight.returncode == 0, errors

    go = tmp_path / "go"
    go.mkdir()
    moved = _libtorch(shared.socket, "wide", tmp_path / "moved",
                      "--pause-before", "2,5", "--go", str(go))
    _wait_for(go / "paused-2", moved)
    job = _job_of(shared.socket, "wide")
    nobody = shared.nobody(8 * MIB)
    shared.asked(job)
    (go / "go-2").touch()
    assert _first_line(nobody).startswith("began j-")
    _wait_for(go / "paused-5", moved)
    nobody.stdin.close()
    nobody.wait(timeout=60)
    shared.only(job)
    (go / "go-5").touch()
    _, errors = moved.communicate(timeout=300)
    assert moved.returncode == 0, errors
    lines = [l for l in errors.splitlines() if l.startswith("lohan: ")]
    assert len(lines) == 2, errors
    assert lines[0].startswith('lohan: lohand moved job "wide" to a ')
    assert "gradients and weights now streamed through" in lines[0]
    assert lines[1].startswith('lohan: lohand grew job "wide" back to a ')
    assert "resident" in lines[1]
    assert ((tmp_path / "moved" / "losses").read_text()
            == (tmp_path / "straight" / "losses").read_text())
    for part in ("model", "optimizer"):
        a = load_file(str(tmp_path / "moved" / "saved"
                          / f"{part}.safetensors"))
        b = load_file(str(tmp_path / "straight" / "saved"
                          / f"{part}.safetensors"))
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), name


# ------------------------------------------------ when a move goes wrong


@pytest.fixture
def asked_once(monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    """Model.arena_asked says 1 MiB once `ask["now"]` is set (then
    clears it); Client.follow_share does `ask["follow"](plane)`."""
    ask: Dict[str, Any] = {"now": False}

    def asked(model: Model) -> int:
        now, ask["now"] = ask["now"], False
        return MIB if now else 0

    def follow(client: Client, job_id: str, plane: DataPlane,
               model: Model) -> bool:
        return ask["follow"](plane)

    monkeypatch.setattr(Model, "arena_asked", property(asked))
    monkeypatch.setattr(Client, "follow_share", follow)
    return ask


def test_a_refused_move_leaves_the_job_training_where_it_was(
        lohand: Daemon, asked_once: Dict[str, Any]) -> None:
    """The client library refusing with nothing done (its plane as it
    was): step() warns and training goes on in the same arena, bit for
    bit."""
    straight_losses, straight = _straight(lohand.socket,
                                          "offload-frozen-on-ssd", 4)

    def refuse(plane: DataPlane) -> bool:
        raise LohanError(StatusCode.FAILED_PRECONDITION, "a ticket waits")
    asked_once["follow"] = refuse
    model = _Stack(frozen=True)
    with _engine(model, lohand.socket, "wide",
                 "offload-frozen-on-ssd") as engine:
        arena = engine.status()["arena_bytes"]
        losses = [_step(engine, model, step) for step in range(2)]
        asked_once["now"] = True
        with pytest.warns(UserWarning, match=(
                "lohan: job 'wide' stays in its .* arena: the move to the "
                "1 MiB one lohand asks for was refused \\(a ticket "
                "waits\\); lohand asks again at the next step's end")):
            losses.append(_step(engine, model, 2))
        losses.append(_step(engine, model, 3))
        status = engine.status()
        assert status["arena_bytes"] == arena
        assert status["arena_moves"] == 0
    assert losses == straight_losses
    _assert_same(model, straight)


def test_a_move_that_loses_the_plane_says_how_to_go_on(
        lohand: Daemon, asked_once: Dict[str, Any]) -> None:
    """A failed move that closed the old plane (the job has none): step()
    raises saying so and how to resume; close() still gives the model
    back, and resume=True goes on from the committed step."""
    def lose(plane: DataPlane) -> bool:
        plane.close()
        raise LohanError(StatusCode.UNAVAILABLE, "lohand went away")
    asked_once["follow"] = lose
    model = _Stack()
    engine = _engine(model, lohand.socket, "wide", "resident")
    _step(engine, model, 0)
    asked_once["now"] = True
    with pytest.raises(LohanError, match=(
            "lohan: job 'wide' could not move to the arena lohand asked "
            "for \\(lohand went away\\); it has no data plane now: close "
            "the engine, and lohan.init\\(..., resume=True\\) continues "
            "it from step 2")):
        _step(engine, model, 1)
    engine.close()
    with _engine(model, lohand.socket, "wide", "resident",
                 resume=True) as engine:
        assert engine.iteration == 2
