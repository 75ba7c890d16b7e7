"""Data-parallel ranks through lohan against one process on the same
global batch, in the same run, interleaved round by round:

    bazel build //daemon/main:lohand //client:liblohan_client.so
    .venv/bin/python bench/train/data_parallel_bench.py [--ranks 2]
        [--steps 20] [--rounds 3] [--layers 4 --width 256 --batch 8]
        [--buffers resident|streamed]

One lohand (its own scratch directory). Each round runs the single
process (lohan, the whole global batch) and then `torchrun
--nproc_per_node N` of this script's worker (each rank 1/N of the global
batch, gloo); both time the steps after 3 warm-up steps. Reports the
median seconds per step of each and their ratio (the collectives and the
shard handling are the difference, but on a CPU the ranks also split the
model's compute, so a ratio below 1 is possible), and, from the daemon's
status, each job's arena and its SSD bytes read and written per
parameter of the model per step: every rank's should be 1/N of the
single job's. Each rank also times, per step, the agreement that every
rank committed the last step (rank_commits.agree_committed: waiting for
its daemon's commit, then an all-gather) and its ITER_BEGIN (which frees
the states the last commit kept).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugins" / "pytorch"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch.distributed as dist  # noqa: E402

import lohan  # noqa: E402
from train_bench import batches, make_model, start_daemon  # noqa: E402

WARMUP = 3


def train(args: argparse.Namespace, socket: str, name: str,
          out: Path) -> None:
    """Trains on this process's share of each global batch (the whole of
    it alone); writes its seconds per step and its job's byte counts."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    model = make_model(args)
    parameters = sum(p.numel() for p in model.parameters())
    data = batches(args, args.steps + WARMUP)
    share = args.batch // world
    engine = lohan.init(model, lr=1e-3, socket=socket, job_name=name,
                        buffers=args.buffers, params="resident",
                        activations="keep", max_grad_norm=1.0)
    timers = time_commit_agreement(engine) if world > 1 else {}
    start = 0.0
    for n, ids in enumerate(data):
        if n == WARMUP:
            start = time.perf_counter()
            timers.update({key: 0.0 for key in timers})
        mine = ids[rank * share:(rank + 1) * share]
        model(input_ids=mine, labels=mine).loss.backward()
        engine.step()
    seconds = (time.perf_counter() - start) / args.steps
    status = session_status(engine)
    (out / f"{name}.rank{rank}.json").write_text(json.dumps({
        "seconds": seconds, "parameters": parameters,
        "arena_bytes": int(status.get("arena_bytes", 0)),
        "ssd_read_bytes": int(status.get("ssd_read_bytes", 0)),
        "ssd_written_bytes": int(status.get("ssd_written_bytes", 0)),
        "steps": args.steps + WARMUP,
        **{f"{key}_seconds": value / args.steps
           for key, value in timers.items()}}))
    engine.close(delete_job=True)


def time_commit_agreement(engine: lohan.Engine) -> Dict[str, float]:
    """Seconds spent (summed, from now) in the ranks' agreement on the
    last commit and in ITER_BEGIN, by wrapping both."""
    import lohan.iteration as iteration_module
    timers = {"agreement": 0.0, "iter_begin": 0.0}

    def timed(key: str, call: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            begun = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                timers[key] += time.perf_counter() - begun
        return wrapper

    iteration_module.agree_committed = timed(
        "agreement", iteration_module.agree_committed)
    remote = engine._session.remote
    remote.iter_begin = timed("iter_begin", remote.iter_begin)
    return timers


def session_status(engine: lohan.Engine) -> Dict[str, Any]:
    """The daemon's SessionStatus of the engine's job."""
    for session in engine._session.client.status().get("sessions", []):
        if session.get("job_id") == engine._job.id:
            return session
    return {}


def worker(args: argparse.Namespace) -> int:
    dist.init_process_group("gloo")
    train(args, os.environ["LOHAN_SOCKET"], args.name, Path(args.out))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def ranks_run(args: argparse.Namespace, socket: str, name: str,
              out: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(args.ranks), __file__, "--worker",
               "--name", name, "--out", str(out)] + shape_flags(args)
    # TMPDIR: torchrun's agent leaves a torchelastic_* directory there.
    env = {**os.environ, "LOHAN_SOCKET": socket, "TMPDIR": str(out),
           "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1)
                                      // args.ranks))}
    subprocess.run(command, env=env, check=True, timeout=1800)


def shape_flags(args: argparse.Namespace) -> List[str]:
    return ["--steps", str(args.steps), "--layers", str(args.layers),
            "--width", str(args.width), "--batch", str(args.batch),
            "--seq", str(args.seq), "--buffers", args.buffers]


def per_parameter_step(record: Dict[str, Any], key: str) -> float:
    return record[key] / record["parameters"] / record["steps"]


def report(singles: List[Dict[str, Any]],
           ranked: List[List[Dict[str, Any]]], ranks: int) -> None:
    alone = statistics.median(r["seconds"] for r in singles)
    spread = statistics.median(max(x["seconds"] for x in round_)
                               for round_ in ranked)
    print(f"one process, global batch: {alone * 1e3:8.1f} ms/step")
    print(f"{ranks} ranks, 1/{ranks} each:   {spread * 1e3:8.1f} ms/step "
          f"(ratio {spread / alone:.3f})")
    single = singles[-1]
    print(f"single job: arena {single['arena_bytes'] >> 20} MiB, SSD read "
          f"{per_parameter_step(single, 'ssd_read_bytes'):.2f} B, written "
          f"{per_parameter_step(single, 'ssd_written_bytes'):.2f} B "
          "per parameter per step")
    for rank, record in enumerate(ranked[-1]):
        share = lambda key: record[key] / max(single[key], 1)  # noqa: E731
        print(f"rank {rank}: arena {record['arena_bytes'] >> 20} MiB "
              f"({share('arena_bytes'):.3f} of the single job's), SSD read "
              f"{per_parameter_step(record, 'ssd_read_bytes'):.2f} B "
              f"({share('ssd_read_bytes'):.3f}), written "
              f"{per_parameter_step(record, 'ssd_written_bytes'):.2f} B "
              f"({share('ssd_written_bytes'):.3f}); agreeing on the last "
              f"commit {record.get('agreement_seconds', 0) * 1e3:.2f} ms, "
              f"ITER_BEGIN {record.get('iter_begin_seconds', 0) * 1e3:.2f} "
              "ms per step")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--buffers", default="resident")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--name", default="dp-bench")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.batch % args.ranks:
        parser.error("--batch must be a multiple of --ranks")
    bazel_bin = Path(os.environ.get("LOHAN_BAZEL_BIN", REPO / "bazel-bin"))
    with tempfile.TemporaryDirectory(prefix="lohan-dp-bench-") as scratch:
        directory = Path(scratch)
        daemon = start_daemon(directory, bazel_bin)
        socket = str(directory / "lohand.sock")
        singles, ranked = [], []
        try:
            for n in range(args.rounds):
                out = directory / f"round{n}"
                out.mkdir()
                train(args, socket, f"alone{n}", out)
                singles.append(json.loads(
                    (out / f"alone{n}.rank0.json").read_text()))
                ranks_run(args, socket, f"ranks{n}", out)
                ranked.append([json.loads(
                    (out / f"ranks{n}.rank{r}.json").read_text())
                    for r in range(args.ranks)])
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
        report(singles, ranked, args.ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
