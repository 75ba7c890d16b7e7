"""lohand SIGKILLed inside each phase of a job whose states live in the state
tier (updated where the tier holds them) with durability by steps (a
commit interval) or by time (durable_every): during an update between
durable commits,
during a durable commit, and while a second job's arrival moves the first
job's states from the tier back to the SSDs (migration). Each kill lands at
a random point of its phase (seeded; the seed is in the test's name): in
backward after a random block and delay (the daemon updating the blocks
whose gradients it has), or after a random fraction of the phase's SSD
writes, watched in the daemon's /proc/<pid>/io while the step runs, before
the phase can end. The job must resume at its last durable iteration and,
from there, reach the losses and weights of an uninterrupted run bit for
bit."""

from __future__ import annotations

import random
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional

import pytest
import torch
from torch import nn

from test_engine import (HEADS, SEQ, VOCAB, Block, batches, engine_for,
                         tiny_gpt, train_lohan)

WIDE = 512          # 3 blocks of about 3.1M parameters: 113 MB of states
INTERVAL = 3        # durable iterations: 3, 6, ...
STATE_BYTES = 12    # fp32 master and Adam's two moments, per parameter


class WideGPT(nn.Module):
    """test_engine's TinyGPT at a width whose states take the SSDs long
    enough to be caught writing them."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDE)
        self.pos = nn.Embedding(SEQ, WIDE)
        self.blocks = nn.ModuleList(Block(WIDE, HEADS) for _ in range(3))
        self.ln_f = nn.LayerNorm(WIDE)
        self.head = nn.Linear(WIDE, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def wide_gpt(seed: int = 0) -> WideGPT:
    torch.manual_seed(seed)
    return WideGPT()


def parameters_of(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def written_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/io has no write_bytes")


def kill_inside_step(daemon, step: Callable[[], None], kill_at: int,
                     phase_end: int) -> int:
    """Runs `step` on a thread and SIGKILLs `daemon` once it has written
    `kill_at` bytes since the step began; returns what it had written then.
    Fails if the step ended first, or if the daemon had already written
    `phase_end` (the kill would not be inside the phase)."""
    pid = daemon.process.pid
    start = written_bytes(pid)
    failure: List[Optional[BaseException]] = [None]

    def run() -> None:
        try:
            step()
        except BaseException as error:  # the daemon's death, expected
            failure[0] = error

    # The watcher must not wait the default 5 ms for the GIL while the step
    # runs Python: at a fast SSD's speed that is megabytes.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0001)
    try:
        thread = threading.Thread(target=run)
        thread.start()
        written = 0
        while thread.is_alive() and written < kill_at:
            written = written_bytes(pid) - start
            time.sleep(0.0001)
        daemon.stop(signal.SIGKILL)
        thread.join(timeout=60)
    finally:
        sys.setswitchinterval(switch)
    assert written >= kill_at, (
        f"the step ended after {written} bytes, before the kill at "
        f"{kill_at}")
    assert written < phase_end, (written, phase_end)
    assert failure[0] is not None, "the step survived the daemon's death"
    return written


def start_daemon(tmp_path: Path, tier: str):
    """A lohand with room for three versions of the states (durable,
    committed, pending) and the meta, and the state tier `tier`."""
    from conftest import Daemon
    return Daemon(tmp_path, host_pool="512MiB", ssd_capacity="512MiB",
                  extra_args=["--state-tier", tier])


@pytest.fixture(autouse=True)
def free_the_ssd_files(tmp_path):
    """Each test's SSD file is preallocated: gone with the test, not kept
    with pytest's last runs."""
    yield
    shutil.rmtree(tmp_path / "ssd0", ignore_errors=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The losses and final weights of the same training through lohan,
    never killed: what a resumed run must reach bit for bit (the same
    kernels on the same states; against torch AdamW, lohan's exactness
    is test_engine's)."""
    directory = tmp_path_factory.mktemp("uninterrupted")
    daemon = start_daemon(directory, "1GiB")
    try:
        model = wide_gpt()
        with engine_for(model, daemon, job_name="tiered",
                        commit_interval=INTERVAL) as engine:
            losses = train_lohan(engine, model, batches(2 * INTERVAL))
    finally:
        daemon.stop(signal.SIGKILL)
        shutil.rmtree(directory / "ssd0", ignore_errors=True)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def resume_and_finish(tmp_path: Path, tier: str, losses: List[float],
                      data: torch.Tensor, uninterrupted) -> None:
    """lohand restarted: the job is at its last durable iteration and goes
    on from there to the uninterrupted run's losses and weights, bit for
    bit."""
    ref_losses, ref_weights = uninterrupted
    daemon = start_daemon(tmp_path, tier)
    try:
        resumed = wide_gpt(seed=1)  # the weights come from the daemon
        with engine_for(resumed, daemon, job_name="tiered", resume=True,
                        commit_interval=INTERVAL) as engine:
            assert engine.iteration == INTERVAL
            again = train_lohan(engine, resumed, data[INTERVAL:])
        assert losses[:INTERVAL] + again == ref_losses
        for name, param in resumed.named_parameters():
            assert torch.equal(param.detach(), ref_weights[name]), name
    finally:
        daemon.stop(signal.SIGKILL)


class Durability:
    """A job's durability in one of its two forms, both durable at the
    same iterations (INTERVAL, 2 * INTERVAL): by steps (commit_interval)
    or by time (durable_every SECONDS: the test waits that long before
    each iteration meant to be durable, and runs the others well within
    it)."""

    SECONDS = 4.0

    def __init__(self, form: str):
        self.form = form

    def options(self) -> dict:
        return ({"commit_interval": INTERVAL} if self.form == "steps"
                else {"durable_every": self.SECONDS})

    def train(self, engine, model: nn.Module, data: torch.Tensor,
              done: int) -> List[float]:
        """Trains `data`'s iterations after the `done` ones."""
        losses: List[float] = []
        for offset in range(len(data)):
            if (done + offset + 1) % INTERVAL == 0:
                self.before_durable(engine)
            losses += train_lohan(engine, model, data[offset:offset + 1])
        return losses

    def before_durable(self, engine) -> None:
        if self.form == "time":
            wait_for(engine, lambda session: session.get(
                "seconds_since_durable", 0) > self.SECONDS + 0.1)

    def check_durable(self, engine, iteration: int) -> None:
        """lohand says `iteration` is the job's last durable one (once the
        last step's commit has settled)."""
        wait_for(engine, lambda session: int(
            session.get("durable_iteration", 0)) == iteration)


def wait_for(engine, condition: Callable[[dict], bool],
             timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition(engine.status()["session"]):
        assert time.monotonic() < deadline, engine.status()["session"]
        time.sleep(0.05)


# Seeds whose draws spread over the phase: fractions 0.21, 0.36 and 0.60 of
# its writes (leaving the watcher room before the phase ends); blocks 0, 1
# and 2. Durability by steps with each; by time with the first.
@pytest.mark.parametrize("seed, form", [(1, "steps"), (7, "steps"),
                                        (5, "steps"), (1, "time")])
@pytest.mark.parametrize("phase", ["update", "durable-commit", "migration"])
def test_a_kill_inside_a_phase_resumes_at_the_last_durable_iteration(
        tmp_path, uninterrupted, phase, seed, form):
    fraction = random.Random(seed).uniform(0.1, 0.9)
    durability = Durability(form)
    model = wide_gpt()
    states = STATE_BYTES * parameters_of(model)
    data = batches(2 * INTERVAL)
    # The tier holds the job's states and little more: a second job of
    # the same user halves it.
    tier = str(states + (4 << 20)) if phase == "migration" else "1GiB"
    daemon = start_daemon(tmp_path, tier)
    engines = []
    try:
        engine = engine_for(model, daemon, job_name="tiered",
                            **durability.options())
        engines.append(engine)
        losses = durability.train(engine, model, data[:INTERVAL], 0)
        durability.check_durable(engine, INTERVAL)
        # A step between durable commits writes the 16-bit weights and
        # the meta only: every state stays in RAM.
        pid = daemon.process.pid
        before = written_bytes(pid)
        losses += durability.train(engine, model,
                                   data[INTERVAL:INTERVAL + 1], INTERVAL)
        volatile = written_bytes(pid) - before
        assert volatile < states / 4, (volatile, states)
        if phase == "update":
            # The next step between durable commits, killed while its
            # updates run: once backward has passed a random block (the
            # blocks after it have sent their gradients, the daemon is
            # updating them; the ones before have not), after a random
            # delay.
            rng = random.Random(seed)
            block, delay = rng.randrange(3), rng.uniform(0, 0.02)

            def kill(*_: object) -> None:
                time.sleep(delay)
                daemon.stop(signal.SIGKILL)

            model.blocks[block].register_full_backward_hook(kill)
            with pytest.raises(Exception):
                train_lohan(engine, model, data[INTERVAL + 1:INTERVAL + 2])
            print(f"update, seed {seed}, {form}: killed in backward at block "
                  f"{block} after {delay * 1000:.1f} ms")
        else:
            if phase == "durable-commit":
                # The durable step writes every state; killed before its
                # commit can be made.
                losses += durability.train(
                    engine, model, data[INTERVAL + 1:INTERVAL + 2],
                    INTERVAL + 1)
                durability.before_durable(engine)
                phase_end = volatile + states
                kill_at = int(fraction * phase_end)
            else:
                # A second job arrives: at the first one's next iteration
                # its share is half the tier, and the states beyond it go
                # back to the SSDs before its updates begin.
                engines.append(
                    engine_for(tiny_gpt(), daemon, job_name="second"))
                phase_end = states // 2 - (2 << 20)
                kill_at = int(fraction * 0.9 * phase_end)
            killed = data[len(losses):len(losses) + 1]

            def step() -> None:
                # step() returns once the norm decides (overlap_step): the
                # step lasts until its updates are done and, for a durable
                # one, its commit is.
                train_lohan(engine, model, killed)
                engine.sync_weights()
                if phase == "durable-commit":
                    durability.check_durable(engine, 2 * INTERVAL)

            written = kill_inside_step(daemon, step, kill_at, phase_end)
            print(f"{phase}, seed {seed}, {form}: killed after {written} of "
                  f"the phase's {phase_end} bytes")
    finally:
        daemon.stop(signal.SIGKILL)
        for each in engines:
            each.close()
    resume_and_finish(tmp_path, tier, losses, data, uninterrupted)
