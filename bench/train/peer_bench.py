"""lohan beside DeepSpeed ZeRO-3 with NVMe offload (ZeRO-Infinity), with cpu
offload (ZeRO-Offload) and plain PyTorch AdamW, in the same run, on the same
model, data and optimizer settings (AdamW, clipping at 1.0, fp32).

    bazel build //daemon/main:lohand //client:liblohan_client.so \
        //client/ctl:lohanctl //bench/store:store_bench
    scripts/setup --peers        # DeepSpeed into .venv
    .venv/bin/python bench/train/peer_bench.py [--rounds 3] [--steps 8]

Configurations, each in a fresh process, interleaved round by round (the
order reversed every other round):
- torch: torch.optim.AdamW, everything in memory (the reference);
- ds-nvme-opt: ZeRO-3, optimizer states on NVMe, parameters in host memory;
- ds-nvme-all: ZeRO-3, optimizer states and parameters on NVMe
  (ZeRO-Infinity);
- ds-cpu: ZeRO-3, optimizer states and parameters in host memory
  (ZeRO-Offload);
- lohan-resident: a gradient and a weight buffer per layer in lohand's host
  pool, states in its state tier as far as --state-tier holds them (the
  rest on its SSDs; the tier's written to them at the durable steps:
  lohand's default, a minute apart, or every --commit-interval steps);
- lohan-resident-copy: lohan-resident on a lohand whose updates copy the
  tier's states into chunk buffers and back ([pool] state_tier_updates =
  "copy", the tier before updates in place);
- lohan-resident-ssd: the same on a second lohand without a state tier
  (every state read from and written to its SSDs);
- lohan-streamed: the same, gradients and weights streamed through
  --stream-buffers shared buffers of each (4) and the SSDs (a pool that
  does not hold the model; 1 is the least arena).
DeepSpeed's NVMe files and lohand's SSD directory are in the same scratch
directory. Reports seconds per step (median over rounds of each run's mean
over the timed steps), the ratio to torch and to each DeepSpeed
configuration, each phase's median (forward, backward, the optimizer's
step), SSD bytes read and written per parameter per step (from
/proc/<pid>/io: DeepSpeed's own process, lohand's for lohan), and for lohan
the host memory bytes its updates moved and those lohand copied beside them
per parameter per step (`lohanctl status`'s counters), and how busy the
scratch directory's disk was in the timed steps (bench/train/disk_busy.py:
the share of the time it had a request in flight, and the bytes it moved
per busy second, by anyone). With --disk SIZE,
each round starts with bench/store/store_bench on the scratch directory:
sequential O_DIRECT write then read of SIZE at lohand's stripe unit and
queue depth, then both at once (a read stream beside a write stream), by
lohan's own libaio engine (what lohand's probe measures) and by fio,
interleaved; each lohan configuration's s/step is then also given against
what its SSD bytes take at each of those speeds, measured in its round
(read and written one after the other, or all at the mixed speed). DeepSpeed's
CPU ops are JIT-built on first use (minutes, cached in
~/.cache/torch_extensions).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

# The script's own directory is on sys.path (it and its workers run as
# scripts).
from disk_busy import busy_between, device_of, read_counters

REPO = Path(__file__).resolve().parents[2]
CONFIGS = ("torch", "ds-nvme-opt", "ds-nvme-all", "ds-cpu", "lohan-resident",
           "lohan-resident-copy", "lohan-resident-ssd", "lohan-streamed")


def io_bytes(pid: int) -> Tuple[int, int]:
    """read_bytes and write_bytes of `pid` so far (what reached storage)."""
    fields = dict(line.split(": ") for line in
                  Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["read_bytes"]), int(fields["write_bytes"])


def build(args: argparse.Namespace):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=args.vocab, n_positions=args.seq, n_embd=args.width,
        n_layer=args.layers, n_head=max(1, args.width // 64)))
    generator = torch.Generator().manual_seed(1)
    data = [torch.randint(0, args.vocab, (args.batch, args.seq),
                          generator=generator)
            for _ in range(args.steps + args.warmup)]
    return model, data


def deepspeed_engine(model, args: argparse.Namespace, nvme: Path,
                     params_on_nvme: bool, states_on_nvme: bool = True):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(29500 + os.getpid() % 1000))
    import deepspeed
    offload_param = ({"device": "nvme", "nvme_path": str(nvme),
                      "pin_memory": False} if params_on_nvme
                     else {"device": "cpu", "pin_memory": False})
    offload_optimizer = ({"device": "nvme", "nvme_path": str(nvme),
                          "pin_memory": False} if states_on_nvme
                         else {"device": "cpu", "pin_memory": False})
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {
            "lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8,
            "weight_decay": 0.0}},
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": offload_optimizer,
            "offload_param": offload_param},
        "steps_per_print": 1 << 30,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config)
    return engine


def worker(args: argparse.Namespace) -> Dict[str, float]:
    """One configuration: seconds per timed step (and the medians of its
    forward, backward and optimizer step) and SSD bytes per parameter per
    step."""
    import torch
    torch.set_num_threads(args.threads)
    model, data = build(args)
    parameters = sum(p.numel() for p in model.parameters())
    scratch = Path(args.scratch)
    io_pid = os.getpid()
    finish = lambda: None  # noqa: E731
    forward = lambda ids: model(input_ids=ids, labels=ids).loss  # noqa: E731
    backward = lambda loss: loss.backward()  # noqa: E731
    if args.worker == "torch":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def update():
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    elif args.worker.startswith("ds-"):
        nvme = scratch / f"ds-nvme-{os.getpid()}"
        nvme.mkdir()
        engine = deepspeed_engine(model, args, nvme,
                                  args.worker == "ds-nvme-all",
                                  args.worker != "ds-cpu")
        forward = lambda ids: engine(input_ids=ids, labels=ids).loss  # noqa
        backward = engine.backward
        update = engine.step
    else:
        sys.path.insert(0, str(REPO / "plugins" / "pytorch"))
        import lohan
        options = (dict(buffers="streamed",
                        stream_buffers=args.stream_buffers)
                   if args.worker == "lohan-streamed"
                   else dict(buffers="resident"))  # -ssd too
        if args.worker != "lohan-resident-ssd" and args.commit_interval:
            options["commit_interval"] = args.commit_interval
        options.update(json.loads(args.lohan_options))
        engine = lohan.init(model, lr=1e-4, max_grad_norm=1.0,
                            socket=args.socket,
                            job_name=f"peer-{os.getpid()}", **options)
        io_pid = args.daemon_pid
        update = engine.step

        def finish():
            engine.close(delete_job=True)
    phases: List[Tuple[float, float, float]] = []

    def step(ids) -> None:
        t0 = time.perf_counter()
        loss = forward(ids)
        t1 = time.perf_counter()
        backward(loss)
        t2 = time.perf_counter()
        update()
        phases.append((t1 - t0, t2 - t1, time.perf_counter() - t2))

    for ids in data[:args.warmup]:
        step(ids)
    if args.worker.startswith("lohan"):
        # The warm-up's last updates done before the timed steps begin
        # (overlap_step: step() returns before them).
        engine.sync_weights()
    phases.clear()
    def host_bytes() -> Tuple[int, int]:
        if not args.worker.startswith("lohan"):
            return 0, 0
        session = engine.status()["session"]
        return (int(session.get("host_update_bytes", 0)),
                int(session.get("host_copied_bytes", 0)))

    host_before = host_bytes()
    disk = device_of(scratch)
    disk_before = read_counters(disk) if disk else None
    io_before, start = io_bytes(io_pid), time.perf_counter()
    for ids in data[args.warmup:]:
        step(ids)
    if args.worker.startswith("lohan"):
        # The model's weights up to date, as torch's are after its step
        # (with overlap_step=True the last step's updates may still run).
        engine.sync_weights()
    seconds = time.perf_counter() - start
    io_after = io_bytes(io_pid)
    busy = (busy_between(disk_before, read_counters(disk))
            if disk_before else None)
    host_after = host_bytes()
    finish()
    per = parameters * args.steps
    return {"seconds": seconds / args.steps, "parameters": parameters,
            "host_updated": (host_after[0] - host_before[0]) / per,
            "host_copied": (host_after[1] - host_before[1]) / per,
            "forward": statistics.median(p[0] for p in phases),
            "backward": statistics.median(p[1] for p in phases),
            "update": statistics.median(p[2] for p in phases),
            "disk_busy": busy.busy if busy else -1.0,
            "disk_busy_rate": busy.bytes_per_busy_second if busy else 0.0,
            "read": (io_after[0] - io_before[0]) / per,
            "written": (io_after[1] - io_before[1]) / per}


def measured_ssd(socket: str, bazel_bin: Path) -> Tuple[float, float]:
    """The SSD array's read and write bytes per second as lohand measured
    them ([store] profile_probe; 0, 0 when it measured none)."""
    done = subprocess.run(
        [str(bazel_bin / "client/ctl/lohanctl"), "--socket", socket,
         "status", "--json"], capture_output=True, text=True, check=True)
    profile = json.loads(done.stdout).get("profile", {})
    return (float(profile.get("array_read_bytes_per_second", 0)),
            float(profile.get("array_write_bytes_per_second", 0)))


def disk_speeds(directory: Path, size: str,
                bazel_bin: Path) -> Dict[str, Tuple[float, float, float]]:
    """Read, write and mixed (reads beside writes) bytes per second of
    lohan's engine ("lohan") and of fio ("fio") on `directory`, from one
    store_bench round (its files removed after)."""
    done = subprocess.run(
        [str(bazel_bin / "bench/store/store_bench"), f"--paths={directory}",
         f"--file_size={size}", "--rounds=1"],
        capture_output=True, text=True, check=True)
    speeds: Dict[str, List[float]] = {"lohan": [0.0, 0.0, 0.0],
                                      "fio": [0.0, 0.0, 0.0]}
    for line in done.stdout.splitlines():
        words = line.split()
        # "  READ  ours 2.117 GB/s fio 1.311 GB/s ratio of means ...", and
        # WRITE and MIXED (reads beside writes, both counted) alike.
        if words and words[0] in ("READ", "WRITE", "MIXED"):
            at = ("READ", "WRITE", "MIXED").index(words[0])
            speeds["lohan"][at] = float(words[2]) * 1e9
            speeds["fio"][at] = float(words[5]) * 1e9
    # What store_bench leaves: its data file, the store's identity and its
    # state directory (lohand's own are in subdirectories).
    (directory / "lohan.data").unlink(missing_ok=True)
    (directory / "lohan.store").unlink(missing_ok=True)
    shutil.rmtree(directory / "bench_state_1", ignore_errors=True)
    if not all(all(v) for v in speeds.values()):
        raise RuntimeError(f"store_bench printed no speeds:\n{done.stdout}")
    return {k: (v[0], v[1], v[2]) for k, v in speeds.items()}


def disk_text(row: Dict[str, float]) -> str:
    """The scratch disk's busy time in the timed steps, for a report."""
    if row["disk_busy"] < 0:
        return ""
    return (f"; disk busy {100 * row['disk_busy']:.0f}% of the steps, at "
            f"{row['disk_busy_rate'] / 1e9:.2f} GB/s while busy")


def with_pool_key(config: str, line: str) -> str:
    """`config` (lohand.toml text) with `line` in its [pool] table."""
    if "[pool]" in config:
        return config.replace("[pool]", f"[pool]\n{line}", 1)
    return f"{config}\n[pool]\n{line}\n"


def run_worker(config: str, args: argparse.Namespace, scratch: Path,
               socket: str, daemon_pid: int) -> Dict[str, float]:
    command = [sys.executable, __file__, "--worker", config,
               "--scratch", str(scratch), "--socket", socket,
               "--daemon-pid", str(daemon_pid)]
    for name in ("steps", "warmup", "layers", "width", "seq", "batch",
                 "vocab", "threads", "stream_buffers", "commit_interval",
                 "lohan_options"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{config} failed:\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: Dict[str, List[Dict[str, float]]],
           args: argparse.Namespace) -> None:
    median = {c: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
              for c, rows in results.items()}
    parameters = int(next(iter(median.values()))["parameters"])
    print(f"\nGPT-2 {args.layers} blocks, width {args.width}, vocab "
          f"{args.vocab}, {parameters:,} parameters, batch {args.batch}x"
          f"{args.seq}, fp32, AdamW, clip 1.0, torch threads {args.threads};"
          f" median of {args.rounds} rounds of {args.steps} timed steps")
    print(f"{'configuration':19s} {'s/step':>7s} {'vs torch':>8s} "
          f"{'vs ds-opt':>9s} {'vs ds-all':>9s} {'vs ds-cpu':>9s} "
          f"{'read B/p':>8s} {'wrt B/p':>8s} {'RAM upd':>7s} "
          f"{'RAM cp':>6s}  forward / backward / step (s, medians)")
    for config, row in median.items():
        # A reference not in this run: "-".
        ratios = [f"{row['seconds'] / median[ref]['seconds']:.2f}x"
                  if ref in median else "-"
                  for ref in ("torch", "ds-nvme-opt", "ds-nvme-all",
                              "ds-cpu")]
        print(f"{config:19s} {row['seconds']:7.3f} {ratios[0]:>8s} "
              f"{ratios[1]:>9s} {ratios[2]:>9s} {ratios[3]:>9s} "
              f"{row['read']:8.2f} {row['written']:8.2f} "
              f"{row['host_updated']:7.2f} {row['host_copied']:6.2f}  "
              f"{row['forward']:.3f} / {row['backward']:.3f} / "
              f"{row['update']:.3f}")
    for config, row in median.items():
        if row["disk_busy"] >= 0:
            each = ", ".join(f"{100 * r['disk_busy']:.0f}%"
                             for r in results[config])
            print(f"{config}: the scratch disk busy {100 * row['disk_busy']:.0f}%"
                  f" of the timed steps (rounds: {each}), moving "
                  f"{row['disk_busy_rate'] / 1e9:.2f} GB/s while busy")
        for key, speed in (
                ("ssd_seconds", "lohand's measured speed (at its start)"),
                ("lohan_seconds", "lohan's engine's speed in its round"),
                ("lohan_mixed_seconds",
                 "lohan's engine's speed reading beside writing in its round"),
                ("fio_seconds", "fio's speed in its round")):
            if row.get(key, 0) <= 0:
                continue
            each = ", ".join(f"{r['seconds'] / r[key]:.2f}x"
                             for r in results[config])
            print(f"{config}: its SSD bytes take {row[key]:.3f} s a step at "
                  f"{speed}: s/step {row['seconds'] / row[key]:.2f}x that "
                  f"(rounds: {each})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stream-buffers", type=int, default=4,
                        help="lohan-streamed: shared buffers of each kind "
                        "(4: what buffers='auto' takes when the pool allows)")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--pool", default="1GiB",
                        help="lohand's host pool (streamed: whatever fits)")
    parser.add_argument("--ssd-capacity", default="8GiB",
                        help="lohand's SSD file (twice the states and more)")
    parser.add_argument("--daemon-config", default="",
                        help="a lohand.toml for the bench's daemon")
    parser.add_argument("--commit-interval", type=int, default=0,
                        help="lohan.init's commit_interval for the lohan "
                        "configurations with a state tier (1: every step "
                        "durable; 0, the default: lohan's default, lohand's "
                        "durable_every \"auto\")")
    parser.add_argument("--state-tier", default="auto",
                        help="lohand's [pool] state_tier for the lohan "
                        "configurations but lohan-resident-ssd (a size, 0 "
                        "or auto)")
    parser.add_argument("--lohan-options", default="{}",
                        help="more lohan.init options for the lohan "
                        "configurations, as JSON (e.g. '{\"activations\": "
                        "\"keep\", \"overlap_step\": true}')")
    parser.add_argument("--ssd-probe", default="0",
                        help="lohand's [store] profile_probe: with a size, "
                        "lohand measures its SSDs at start and each lohan "
                        "configuration's s/step is also given against what "
                        "its SSD bytes take at that speed")
    parser.add_argument("--disk", default="",
                        help="a size (2GiB): each round first measures the "
                        "scratch directory's disk with bench/store/"
                        "store_bench (lohan's engine and fio, sequential "
                        "O_DIRECT write then read of that many bytes, then "
                        "both at once), and "
                        "each lohan configuration's s/step is also given "
                        "against what its SSD bytes take at those speeds")
    parser.add_argument("--worker", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    parser.add_argument("--daemon-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    configs = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configurations {unknown}; use {CONFIGS}")
    results: Dict[str, List[Dict[str, float]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="lohan-peer-bench-",
                                     dir="/var/tmp") as tmp:
        scratch = Path(tmp)
        sys.path.insert(0, str(Path(__file__).parent))
        from train_bench import start_daemon
        bazel_bin = Path(os.environ.get("LOHAN_BAZEL_BIN",
                                        REPO / "bazel-bin"))
        daemon = start_daemon(scratch, bazel_bin, args.pool,
                              args.ssd_capacity, args.daemon_config,
                              ("--profile-probe", args.ssd_probe, "--state-tier",
                               args.state_tier))
        # lohan-resident-ssd: a lohand without a state tier, its own
        # directory on the same disk.
        plain_dir = scratch / "no-tier"
        plain = None
        if "lohan-resident-ssd" in configs:
            plain_dir.mkdir()
            plain = start_daemon(plain_dir, bazel_bin, args.pool,
                                 args.ssd_capacity, args.daemon_config,
                                 ("--profile-probe", args.ssd_probe, "--state-tier",
                                  "0"))
        # lohan-resident-copy: a lohand whose tier copies, its own
        # directory.
        copy_dir = scratch / "tier-copy"
        copying = None
        if "lohan-resident-copy" in configs:
            copy_dir.mkdir()
            copy_config = copy_dir / "lohand.toml"
            copy_config.write_text(with_pool_key(
                Path(args.daemon_config).read_text()
                if args.daemon_config else "",
                'state_tier_updates = "copy"'))
            copying = start_daemon(copy_dir, bazel_bin, args.pool,
                                   args.ssd_capacity, str(copy_config),
                                   ("--profile-probe", args.ssd_probe, "--state-tier",
                                    args.state_tier))
        homes = {"lohan-resident-ssd": (plain, plain_dir),
                 "lohan-resident-copy": (copying, copy_dir)}
        try:
            for round_ in range(args.rounds):
                disk = (disk_speeds(scratch, args.disk, bazel_bin)
                        if args.disk else {})
                for engine, (read, write, mixed) in disk.items():
                    print(f"round {round_ + 1} {engine:5s} {read / 1e9:.2f} "
                          f"GB/s read, {write / 1e9:.2f} GB/s write, "
                          f"{mixed / 1e9:.2f} GB/s mixed", flush=True)
                order = configs if round_ % 2 == 0 else configs[::-1]
                for config in order:
                    on, where = homes.get(config, (daemon, scratch))
                    row = run_worker(config, args, scratch,
                                     str(where / "lohand.sock"), on.pid)
                    if config.startswith("lohan"):
                        # The SSD bytes of a step at lohand's measured speed.
                        speed = measured_ssd(str(where / "lohand.sock"),
                                             bazel_bin)
                        bytes_ = (row["read"] * row["parameters"],
                                  row["written"] * row["parameters"])
                        row["ssd_seconds"] = sum(
                            b / v for b, v in zip(bytes_, speed) if v > 0)
                        for engine, (read, write, mixed) in disk.items():
                            row[f"{engine}_seconds"] = (bytes_[0] / read +
                                                        bytes_[1] / write)
                            row[f"{engine}_mixed_seconds"] = sum(
                                bytes_) / mixed
                    results[config].append(row)
                    print(f"round {round_ + 1} {config:19s} "
                          f"{row['seconds']:7.3f} s/step, SSD "
                          f"{row['read']:6.2f} read {row['written']:6.2f} "
                          f"written, RAM {row['host_updated']:6.2f} updated "
                          f"{row['host_copied']:6.2f} copied B/param"
                          f"{disk_text(row)}", flush=True)
        finally:
            for process in (daemon, plain, copying):
                if process is not None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=60)
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
