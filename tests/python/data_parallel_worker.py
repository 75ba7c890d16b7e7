"""One data-parallel rank for test_data_parallel.py, started by torchrun
(`python -m torch.distributed.run ... data_parallel_worker.py CONFIG`):
trains test_engine's TinyGPT through lohan on its share of each global
batch and writes what the test compares.

CONFIG (JSON file): steps, micro (backward passes per step), samples
(the global batch: global_batches), dtype,
max_grad_norm, buffers, job_name, out (a directory), and optionally
save (a directory to engine.save into after the last step),
save_file_limit (see `save`), resume (a
checkpoint directory for lohan.init), weights (a safetensors file:
the model is built on the meta device and starts from it),
save_pretrained (a directory for engine.save_pretrained after the last
step), first_step (the global step the
data starts at, for a resumed run), poison (a global step at which rank
1 multiplies its loss by inf), backend ("gloo", the default, or
"nccl": each rank then trains on cuda:<LOCAL_RANK>), loss_scale, params,
activations and overlap_step (as lohan.init's), stop_daemon ({"rank",
"step", "pid", "then"}: that rank SIGSTOPs process `pid`, its daemon, once
every rank has summed that global step's norm, before its ITER_END; the
ranks in "then" wait for that, after their own sum, before theirs),
kill_daemon ({"rank", "step", "pid", "then", "after"}: that rank SIGKILLs
process `pid` when that global step's first gradient is about to reach
the daemons, just before the ranks agree on the last commit, or with
"after" just after they agreed; the ranks in "then" wait for the kill
before they ask), exit_before_close (a
rank that ends without closing its engine; every rank that closes writes
out/closed<r>). Every rank
writes out/pid<r> at the start
and out/step<r> (its committed steps) after each step, for the tests that
kill a rank or a daemon mid-run. The daemon's socket is $LOHAN_SOCKET (one
per "server"). Rank 0 writes out/result.pt: the global loss of every
micro-batch (the mean over ranks), each step's StepResult, and the final
weights; every rank writes out/rank<r>.json with its job's name and its
shard sizes.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_engine import (BETAS, EPS, LR, SEQ, VOCAB, WD,  # noqa: E402
                         lm_loss, tiny_gpt)

import lohan  # noqa: E402


def global_batches(steps: int, micro: int, samples: int) -> torch.Tensor:
    """(steps, micro, samples, SEQ + 1) token ids, the same in every
    process."""
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (steps, micro, samples, SEQ + 1),
                         generator=g)


def save(engine: Any, config: Dict[str, Any], rank: int, out: Path) -> None:
    """engine.save(config["save"]) and engine.save_pretrained(
    config["save_pretrained"]), those given; with save_file_limit {"rank", "bytes"}
    that rank may not write files past that many bytes (RLIMIT_FSIZE,
    which binds root too), so its shard file fails, and every rank writes
    the error it got to out/save_error<r>.txt instead of stopping."""
    limit = config.get("save_file_limit")
    previous = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit and limit["rank"] == rank:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE,
                           (limit["bytes"], previous[1]))
    try:
        if config.get("save"):
            engine.save(config["save"], optimizer_state=True)
        if config.get("save_pretrained"):
            engine.save_pretrained(config["save_pretrained"],
                                   max_shard_size="100KB")
    except Exception as error:  # noqa: BLE001 - what the test compares
        if not limit:
            raise
        (out / f"save_error{rank}.txt").write_text(
            f"{type(error).__name__}: {error}")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, previous)


def signal_on_call(owner: Any, name: str, call: int, pid: int, sig: int,
                   after: bool, marker: Path) -> None:
    """Replaces owner.<name> by a wrapper that sends `sig` to `pid` on its
    `call`-th call (0-based), before or `after` the real one, and then
    writes `marker`."""
    real = getattr(owner, name)
    calls = iter(range(1 << 30))

    def send() -> None:
        os.kill(pid, sig)
        marker.write_text(str(pid))

    def wrapper(*args: Any) -> Any:
        now = next(calls) == call
        if now and not after:
            send()
        result = real(*args)
        if now and after:
            send()
        return result

    setattr(owner, name, wrapper)


def wait_on_call(owner: Any, name: str, call: int, marker: Path,
                 after: bool) -> None:
    """Replaces owner.<name> by a wrapper that, on its `call`-th call,
    waits (before or `after` the real one) until `marker` exists: another
    rank writes it once it has signalled the daemon, so this rank's next
    request certainly finds it stopped or gone."""
    real = getattr(owner, name)
    calls = iter(range(1 << 30))

    def wait() -> None:
        while not marker.exists():
            time.sleep(0.01)

    def wrapper(*args: Any) -> Any:
        now = next(calls) == call
        if now and not after:
            wait()
        result = real(*args)
        if now and after:
            wait()
        return result

    setattr(owner, name, wrapper)


def stop_daemon_after_the_norm(engine: Any, step: int, pid: int,
                               marker: Path) -> None:
    """Freezes the daemon (SIGSTOP) once this rank has the global norm of
    its `step`-th step (one sum over the ranks a step), before it sends
    ITER_END, then writes `marker`: the other daemons' ranks commit that
    step, this daemon's cannot."""
    signal_on_call(engine._sharding, "sum", step, pid, signal.SIGSTOP,
                   after=True, marker=marker)


def kill_daemon_at_the_agreement(step: int, pid: int, marker: Path,
                                 after: bool) -> None:
    """SIGKILLs the daemon as the `step`-th step's first gradient is about
    to reach it, then writes `marker`: before the ranks agree on the last
    commit (every rank's next request is then that agreement: the ranks
    finished the last step's weight gathers), or `after` every rank has
    (the next requests hand over gradients)."""
    import lohan.iteration as iteration_module
    signal_on_call(iteration_module, "agree_committed", step, pid,
                   signal.SIGKILL, after=after, marker=marker)


def main() -> int:
    config: Dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    backend = config.get("backend", "gloo")
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(config["out"])
    (out / f"pid{rank}").write_text(str(os.getpid()))
    steps, micro = config["steps"], config["micro"]
    first = config.get("first_step", 0)
    # The global batch of every micro-batch, cut into rank shares (unequal
    # when the ranks do not divide it: each rank's mean loss is weighed by
    # its share, so the mean over ranks is the global batch's mean).
    data = global_batches(first + steps, micro, config["samples"])[first:]
    samples = data.shape[2]
    mine = torch.tensor_split(torch.arange(samples), world)[rank]
    weight = len(mine) * world / samples
    # weights (a safetensors file): the model built on the meta device,
    # its starting weights read from the file, each rank its shard.
    with torch.device("meta" if config.get("weights") else "cpu"):
        model = tiny_gpt(sublayers=config.get("sublayers", False))
    engine = lohan.init(
        model, device=device, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
        no_weight_decay="1d", max_grad_norm=config["max_grad_norm"],
        dtype=config["dtype"], loss_scale=config.get("loss_scale"),
        grad_accumulation_steps=micro,
        blocks=list(model.blocks),
        activations=config.get("activations", "keep"),
        params=config.get("params", "resident"),
        param_unit=config.get("param_unit", "block"),
        overlap_step=config.get("overlap_step", False),
        buffers=config["buffers"], stream_buffers=2,
        job_name=config["job_name"],
        resume=config.get("resume") or False,
        weights=config.get("weights"))
    stop = config.get("stop_daemon")
    if stop and stop["rank"] == rank:
        stop_daemon_after_the_norm(engine, stop["step"] - first, stop["pid"],
                                   out / "stopped")
    elif stop and rank in stop.get("then", []):
        wait_on_call(engine._sharding, "sum", stop["step"] - first,
                     out / "stopped", after=True)
    kill = config.get("kill_daemon")
    if kill and kill["rank"] == rank:
        kill_daemon_at_the_agreement(kill["step"] - first, kill["pid"],
                                     out / "killed",
                                     bool(kill.get("after")))
    elif kill and rank in kill.get("then", []):
        import lohan.iteration as iteration_module
        wait_on_call(iteration_module, "agree_committed",
                     kill["step"] - first, out / "killed", after=False)
    # Summed over the ranks after training: the only collectives during
    # it are lohan's (a test kills a rank or a daemon mid-run).
    losses: List[float] = []
    results: List[List[float]] = []
    for index, step in enumerate(data):
        for ids in step:
            loss = lm_loss(model, ids[mine].to(device)) * weight
            if config.get("poison") == first + index and rank == 1:
                loss = loss * float("inf")
            engine.backward(loss / micro)  # fp16: scaled by the engine
            losses.append(float(loss.item()) / world / micro)
        result = engine.step()
        results.append([result.global_norm, float(result.clipped),
                        float(result.skipped), float(result.iteration)])
        (out / f"step{rank}").write_text(str(result.iteration))
    if config.get("save") or config.get("save_pretrained"):
        save(engine, config, rank, out)
    masters = engine.master_weights()
    (out / f"rank{rank}.json").write_text(json.dumps({
        "job_name": engine.job_name, "world_size": engine.world_size,
        "shard_elements": list(engine._sharding.shard),
        "loss_scale": engine.loss_scale,
        "results": results}))
    # On every rank: with offloaded parameters state_dict() gathers each
    # block's weights from the ranks' shards (a collective).
    weights = {k: v.detach().float().cpu().clone()
               for k, v in model.state_dict().items()}
    summed = torch.tensor(losses, dtype=torch.float64, device=device)
    dist.all_reduce(summed)
    if rank == 0:
        torch.save({"losses": summed.cpu().tolist(), "results": results,
                    "weights": weights,
                    "masters": {k: v.cpu() for k, v in masters.items()}},
                   out / "result.pt")
    if config.get("exit_before_close") == rank:
        os._exit(0)  # the others then close without this rank
    engine.close(delete_job=not config.get("keep_job", False))
    (out / f"closed{rank}").write_text("closed")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
