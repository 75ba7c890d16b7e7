"""Training steps per second through lohan beside plain PyTorch AdamW, in the
same run, on the same model and data (the demo's GPT-2 shape by default).

    bazel build //daemon/main:lohand //client:liblohan_client.so
    .venv/bin/python bench/train/train_bench.py [--steps 60] [--rounds 3]
    .venv/bin/python bench/train/train_bench.py --compare clip \
        [--layers 8 --width 512 --batch 8]

Starts its own lohand (socket, state and SSD directory in a scratch
directory). Each configuration runs --steps steps after 5 warm-up steps;
configurations are interleaved round by round and the median per
configuration is reported with its ratio to plain PyTorch (higher is
slower). On a CPU-only machine the optimizer and the model share the cores,
so this measures lohan's overhead, not the overlap a GPU would give.

--compare clip: the clip schedules through the plugin, clip_schedule=
"redo-all" (every update made at once, all redone when the step clips)
against "deferred" (the default), with max_grad_norm never reached, always
reached and near the gradients' median norm (so some steps clip), and
plain PyTorch AdamW with clip_grad_norm_ at the same limits; reports the
time per step and lohand's SSD bytes read and written per parameter per
step (its /proc/<pid>/io), interleaved round by round.

--compare units: params="offload" with the weights streamed a block at a
time against a sublayer at a time (param_unit="sublayer"), and whole
blocks' weights under a sublayer-at-a-time backward between them: time
per step against torch AdamW and against the block, and the link's bytes
per step (weights copied to the device, block inputs stored).

--compare streaming: resident buffers against streamed ones (one gradient
and one weight buffer, the gradients and 16-bit weights through the SSDs),
the latter with the daemon's lanes (service="lanes", the default) and in
arrival order (service="in-order"); beside each round, fio's sequential
O_DIRECT read and write bandwidth on the daemon's SSD directory. Reports
the time per step, SSD bytes per parameter per step, and what the
streamed layout's extra bytes cost at fio's speed against what it costs.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugins" / "pytorch"))

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

import lohan  # noqa: E402


def start_daemon(directory: Path, bazel_bin: Path, pool: str = "512MiB",
                 ssd_capacity: str = "2GiB", config: str = "",
                 extra: Sequence[str] = ("--profile-probe", "0")
                 ) -> subprocess.Popen:
    """lohand on a socket, state and SSD directory in `directory`. `extra`
    flags go last (by default no SSD probe for the planner: it would run
    beside the first steps)."""
    (directory / "ssd0").mkdir()
    socket = directory / "lohand.sock"
    process = subprocess.Popen(
        [str(bazel_bin / "daemon/main/lohand"), "--socket", str(socket),
         "--state-dir", str(directory / "state"), "--ssd-path",
         str(directory / "ssd0"), "--ssd-capacity", ssd_capacity,
         "--host-pool-size", pool, *extra] + (
             ["--config", config] if config else []),
        stdout=open(directory / "lohand.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not socket.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((directory / "lohand.log").read_text())
        time.sleep(0.01)
    return process


def make_model(args) -> torch.nn.Module:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=64, n_positions=args.seq, n_embd=args.width,
        n_layer=args.layers, n_head=4))


def batches(args, count: int):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 64, (args.batch, args.seq), generator=g)
            for _ in range(count)]


def torch_seconds_per_step(args, data, limit: float = 0.0) -> float:
    """Plain PyTorch AdamW (with clip_grad_norm_ to `limit` when > 0):
    seconds per step after 5 warm-up steps."""
    model = make_model(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = 0.0
    for n, ids in enumerate(data):
        if n == 5:
            start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        if limit > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), limit)
        opt.step()
        opt.zero_grad()
    return (time.perf_counter() - start) / (len(data) - 5)


def run_torch(args, data) -> float:
    return 1.0 / torch_seconds_per_step(args, data)


def run_lohan(args, data, socket: str, name: str, **options) -> float:
    model = make_model(args)
    with lohan.init(model, lr=1e-3, socket=socket, job_name=name,
                    **options) as engine:
        start = 0.0
        for n, ids in enumerate(data):
            if n == 5:
                start = time.perf_counter()
            model(input_ids=ids, labels=ids).loss.backward()
            engine.step()
        rate = (len(data) - 5) / (time.perf_counter() - start)
    with lohan.Client(socket) as client:
        for job in client.jobs():
            if job.name == name:
                client.delete_job(job.id)
    return rate


def daemon_io(pid: int) -> Tuple[int, int]:
    """lohand's read_bytes and write_bytes so far (what reached storage)."""
    fields = dict(line.split(": ") for line in
                  Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["read_bytes"]), int(fields["write_bytes"])


def run_lohan_clipped(args, data, socket: str, daemon_pid: int, name: str,
                      **options) -> Tuple[float, float, float, List[float],
                                          int]:
    """Seconds per step, SSD bytes read and written per parameter per step,
    the norms, and how many timed steps clipped."""
    model = make_model(args)
    params = sum(p.numel() for p in model.parameters())
    norms: List[float] = []
    clipped = 0
    with lohan.init(model, lr=1e-3, socket=socket, job_name=name,
                    dtype=args.dtype, **options) as engine:
        start, io0 = 0.0, (0, 0)
        for n, ids in enumerate(data):
            if n == 5:
                start, io0 = time.perf_counter(), daemon_io(daemon_pid)
            model(input_ids=ids, labels=ids).loss.backward()
            result = engine.step()
            norms.append(result.global_norm)
            clipped += n >= 5 and result.clipped
        # The last step's updates, which may still run: every layer's.
        engine.master_weights()
        seconds = time.perf_counter() - start
        io1 = daemon_io(daemon_pid)
    with lohan.Client(socket) as client:
        for job in client.jobs():
            if job.name == name:
                client.delete_job(job.id)
    steps = len(data) - 5
    return (seconds / steps, (io1[0] - io0[0]) / params / steps,
            (io1[1] - io0[1]) / params / steps, norms, clipped)


def fio_bandwidth(directory: Path) -> Tuple[float, float]:
    """Sequential read and write bytes per second with O_DIRECT, 1 MiB
    blocks, queue depth 32, on a 512 MiB file in `directory` (removed)."""
    rates = []
    for mode in ("write", "read"):
        out = subprocess.run(
            ["fio", "--name=bw", f"--directory={directory}", "--size=512M",
             f"--rw={mode}", "--bs=1M", "--iodepth=32", "--direct=1",
             "--ioengine=libaio", "--minimal"],
            capture_output=True, text=True, check=True).stdout
        fields = out.strip().split(";")
        # Terse format v3: read KiB/s is field 7, write KiB/s field 48.
        rates.append(float(fields[6 if mode == "read" else 47]) * 1024)
    for leftover in directory.glob("bw.*"):
        leftover.unlink()
    return rates[1], rates[0]


def compare_streaming(args, data, socket: str, daemon_pid: int,
                      ssd_dir: Path) -> None:
    configs = {
        "resident": dict(buffers="resident"),
        "streamed, lanes": dict(buffers="streamed", stream_buffers=1),
        "streamed, in order": dict(buffers="streamed", stream_buffers=1,
                                   service="in-order"),
    }
    rows: Dict[str, List[Tuple[float, float, float]]] = {c: [] for c in configs}
    disk: List[Tuple[float, float]] = []
    for round_ in range(args.rounds):
        disk.append(fio_bandwidth(ssd_dir))
        order = list(configs) if round_ % 2 == 0 else list(configs)[::-1]
        for name in order:
            seconds, read, written, _, _ = run_lohan_clipped(
                args, data, socket, daemon_pid,
                f"stream-{round_}-{list(configs).index(name)}",
                max_grad_norm=1.0, **configs[name])
            rows[name].append((seconds, read, written))
            print(f"round {round_ + 1} {name:20s} {seconds:6.3f} s/step, "
                  f"SSD {read:5.1f} read {written:5.1f} written B/param",
                  flush=True)
    parameters = sum(p.numel() for p in make_model(args).parameters())
    read_bw = statistics.median(d[0] for d in disk)
    write_bw = statistics.median(d[1] for d in disk)
    print(f"\nGPT-2 {args.layers} blocks, width {args.width}, {parameters:,} "
          f"parameters, batch {args.batch}x{args.seq}, lohan in {args.dtype}, "
          f"clip 1.0; median of {args.rounds} rounds of {args.steps} steps; "
          f"fio {read_bw / 1e9:.2f} GB/s read, {write_bw / 1e9:.2f} GB/s "
          "write")
    base = [statistics.median(r[i] for r in rows["resident"]) for i in range(3)]
    print(f"{'layout':20s} {'s/step':>7s} {'read B/p':>8s} {'wrt B/p':>8s} "
          f"{'extra s':>8s} {'at fio':>7s} {'ratio':>6s}")
    for name in configs:
        seconds, read, written = [statistics.median(r[i] for r in rows[name])
                                  for i in range(3)]
        at_disk = ((read - base[1]) / read_bw
                   + (written - base[2]) / write_bw) * parameters
        extra = seconds - base[0]
        ratio = extra / at_disk if at_disk > 0 else float("nan")
        print(f"{name:20s} {seconds:7.3f} {read:8.2f} {written:8.2f} "
              f"{extra:8.3f} {at_disk:7.3f} {ratio:6.2f}")


def compare_clip(args, data, socket: str, daemon_pid: int) -> None:
    # The limit near the gradients' median norm, from an unclipped run.
    norms = run_lohan_clipped(args, data, socket, daemon_pid, "clip-probe",
                              max_grad_norm=1e9)[3]
    near = statistics.median(norms[5:])
    limits = {"never": 1e9, "always": 1e-6, "near": near}
    schedules = ("redo-all", "deferred")
    results: Dict[Tuple[str, str], List[Tuple[float, float, float, int]]] = {}
    for round_ in range(args.rounds):
        for regime, limit in limits.items():
            torch_seconds = torch_seconds_per_step(args, data, limit)
            results.setdefault((regime, "torch"), []).append(
                (torch_seconds, 0.0, 0.0, 0))
            for k, schedule in enumerate(schedules):
                seconds, read, written, _, clipped = run_lohan_clipped(
                    args, data, socket, daemon_pid,
                    f"clip-{round_}-{regime}-{k}", max_grad_norm=limit,
                    clip_schedule=schedule)
                results.setdefault((regime, schedule), []).append(
                    (seconds, read, written, clipped))
                print(f"round {round_ + 1} {regime:6s} {schedule:8s} "
                      f"{seconds:6.3f} s/step, SSD {read:5.1f} read "
                      f"{written:5.1f} written B/param, {clipped} of "
                      f"{args.steps} clipped", flush=True)
    parameters = sum(p.numel() for p in make_model(args).parameters())
    print(f"\nGPT-2 {args.layers} blocks, width {args.width}, {parameters:,} "
          f"parameters, batch {args.batch}x{args.seq}, torch threads "
          f"{args.threads}; lohan in {args.dtype}; median of {args.rounds} "
          f"rounds of {args.steps} steps; near = {near:.3f}")
    print(f"{'regime':7s} {'schedule':9s} {'s/step':>7s} {'vs torch':>8s} "
          f"{'vs never':>8s} {'read B/p':>8s} {'wrt B/p':>8s} "
          f"{'clipped':>7s}")
    for schedule in ("torch",) + schedules:
        never = statistics.median(r[0] for r in results[("never", schedule)])
        for regime in limits:
            rows = results[(regime, schedule)]
            seconds = statistics.median(r[0] for r in rows)
            torch_s = statistics.median(r[0] for r in results[(regime,
                                                               "torch")])
            print(f"{regime:7s} {schedule:9s} {seconds:7.3f} "
                  f"{seconds / torch_s:7.2f}x {seconds / never:7.2f}x "
                  f"{statistics.median(r[1] for r in rows):8.2f} "
                  f"{statistics.median(r[2] for r in rows):8.2f} "
                  f"{statistics.median(r[3] for r in rows):7.0f}")


def run_units(args, data, socket: str, name: str,
              **options) -> Tuple[float, float, float]:
    """Seconds per step, and per step the weight bytes copied to the
    device and the block inputs stored (the activations' link traffic)."""
    model = make_model(args)
    with lohan.init(model, lr=1e-3, socket=socket, job_name=name,
                    activations="offload", params="offload",
                    **options) as engine:
        start = 0.0
        for n, ids in enumerate(data):
            if n == 5:
                start = time.perf_counter()
                copied = engine._residency.copied_bytes
                puts = engine.activation_stats.host_puts
            model(input_ids=ids, labels=ids).loss.backward()
            engine.step()
        steps = len(data) - 5
        seconds = (time.perf_counter() - start) / steps
        weight_bytes = (engine._residency.copied_bytes - copied) / steps
        inputs = (engine.activation_stats.host_puts - puts) / steps
    with lohan.Client(socket) as client:
        for job in client.jobs():
            if job.name == name:
                client.delete_job(job.id)
    return seconds, weight_bytes, inputs


def compare_units(args, data, socket: str) -> None:
    """params="offload" a block at a time against a sublayer at a time
    (param_unit="sublayer"), and whole-block weights with a sublayer-at-a-
    time backward between them; torch AdamW interleaved as the reference."""
    configs = {
        "weights and backward by block": {},
        "weights by block, backward by sublayer": dict(
            recompute_unit="sublayer"),
        "weights and backward by sublayer": dict(param_unit="sublayer"),
    }
    rows: Dict[str, List[Tuple[float, float, float]]] = {c: [] for c in configs}
    torch_seconds: List[float] = []
    for round_ in range(args.rounds):
        torch_seconds.append(torch_seconds_per_step(args, data))
        order = list(configs) if round_ % 2 == 0 else list(configs)[::-1]
        for name in order:
            rows[name].append(run_units(
                args, data, socket,
                f"units-{round_}-{list(configs).index(name)}",
                **configs[name]))
            print(f"round {round_ + 1} {name:40s} "
                  f"{rows[name][-1][0] * 1e3:8.1f} ms/step", flush=True)
    model = make_model(args)
    in_blocks = sum(p.numel() * p.element_size()
                    for block in model.transformer.h
                    for p in block.parameters())
    reference = statistics.median(torch_seconds)
    whole = statistics.median(r[0] for r in rows[list(configs)[0]])
    print(f"\nGPT-2 {args.layers} blocks, width {args.width}, batch "
          f"{args.batch}x{args.seq}, fp32; the blocks' weights "
          f"{in_blocks / 1e6:.2f} MB; median of {args.rounds} rounds of "
          f"{args.steps} steps; torch AdamW {reference * 1e3:.1f} ms/step")
    for name, values in rows.items():
        seconds = statistics.median(v[0] for v in values)
        weights = statistics.median(v[1] for v in values)
        inputs = statistics.median(v[2] for v in values)
        print(f"{name:40s} {seconds / reference:5.2f}x torch "
              f"{seconds / whole:5.2f}x by block; weights to the device "
              f"{weights / 1e6:7.2f} MB/step ({weights / in_blocks:4.2f}x "
              f"the blocks'); block inputs stored {inputs:.0f}/step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--width", type=int, default=96)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (leave a core to the daemon)")
    parser.add_argument("--compare",
                        choices=("configs", "clip", "streaming", "units"),
                        default="configs")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="--compare clip / streaming: lohan's training "
                        "dtype (torch runs fp32)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bazel_bin = Path(os.environ.get("LOHAN_BAZEL_BIN", REPO / "bazel-bin"))
    os.environ.setdefault("LOHAN_BAZEL_BIN", str(bazel_bin))
    configs = {
        "torch AdamW": None,
        "lohan keep": dict(activations="keep"),
        "lohan recompute": dict(activations="recompute"),
        "lohan offload": dict(activations="offload"),
        "lohan offload, sublayer": dict(activations="offload",
                                        recompute_unit="sublayer"),
        "lohan offload+params": dict(activations="offload",
                                     params="offload"),
        "lohan offload, streamed": dict(activations="offload",
                                        buffers="streamed",
                                        stream_buffers=1),
        "lohan offload, streamed, in order": dict(activations="offload",
                                                  buffers="streamed",
                                                  stream_buffers=1,
                                                  service="in-order"),
    }
    data = batches(args, args.steps + 5)
    if args.compare in ("clip", "streaming", "units"):
        with tempfile.TemporaryDirectory(prefix="lohan-train-bench-") as tmp:
            daemon = start_daemon(Path(tmp), bazel_bin)
            try:
                if args.compare == "units":
                    compare_units(args, data, str(Path(tmp) / "lohand.sock"))
                elif args.compare == "clip":
                    compare_clip(args, data, str(Path(tmp) / "lohand.sock"),
                                 daemon.pid)
                else:
                    compare_streaming(args, data,
                                      str(Path(tmp) / "lohand.sock"),
                                      daemon.pid, Path(tmp) / "ssd0")
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(timeout=60)
        return 0
    rates = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="lohan-train-bench-") as tmp:
        daemon = start_daemon(Path(tmp), bazel_bin)
        socket = str(Path(tmp) / "lohand.sock")
        try:
            for round_ in range(args.rounds):
                for n, (name, options) in enumerate(configs.items()):
                    rate = (run_torch(args, data) if options is None else
                            run_lohan(args, data, socket,
                                      f"bench-{round_}-{n}", **options))
                    rates[name].append(rate)
                    print(f"round {round_ + 1} {name:34s} {rate:7.1f} "
                          "steps/s", flush=True)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
    parameters = sum(p.numel() for p in make_model(args).parameters())
    print(f"\nGPT-2 {args.layers} blocks, width {args.width}, {parameters:,} "
          f"parameters, batch {args.batch}x{args.seq}, torch threads "
          f"{args.threads}; median of {args.rounds} rounds of "
          f"{args.steps} steps")
    reference = statistics.median(rates["torch AdamW"])
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:34s} {median:7.1f} steps/s  time per step "
              f"{reference / median:5.2f}x torch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
