"""The planner's prediction against a measured run on this machine.

    bazel build //daemon/main:lohand //client:liblohan_client.so \
        //client/ctl:lohanctl
    .venv/bin/python bench/train/plan_bench.py [--layers 8 --width 512
        --seq 128 --batch 4 --steps 8 --rounds 3]

Starts its own lohand (it measures its SSD, memcpy and optimizer at start:
the machine profile) and measures the training device here, the CPU: the
best FLOP/s of a square matrix product in bf16 on the torch threads, and
memcpy as the host-device link. `lohanctl plan --this-machine
--device-is-host` then predicts the iteration time of a GPT-2 shape (bf16)
at each point of Algorithm 1's curve; the plugin today trains at the
curve's first point (each block's input offloaded, everything else
recomputed: `activations="offload"`), which this bench runs through lohan
for --steps steps after 3 warm-up steps, --rounds times. Prints predicted
against measured, the planner's own choice, and the machine it assumed.

--live: activations="auto" instead: the plugin profiles its first
iteration and lohand plans per saved tensor (PlanJob); printed per round:
the live plan's predicted time against the measured one, and auto against
"offload" (rounds interleaved); then lohand's SSD bytes read and written
per parameter per step (its /proc/<pid>/io) for each, against the layout's
minimum (12 and 12: fp32 masters and two moments).

--sweep: the per-block curve instead (`lohanctl plan --per-block`): the
last k blocks swap (every tensor they save kept aside, nothing
recomputed), the others offload and recompute, for k = 0, L/4, L/2, 3L/4
and L, each measured (rounds interleaved, the order reversed every other
round) beside its predicted point; and the predicted best k against the
measured best.
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
from typing import Any, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugins" / "pytorch"))
sys.path.insert(0, str(REPO / "bench" / "train"))

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

import lohan  # noqa: E402
from train_bench import daemon_io, start_daemon  # noqa: E402


def matmul_flops(dtype: torch.dtype, n: int = 1024, rounds: int = 5) -> float:
    """Best FLOP/s of an n x n product on the torch threads."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best


def forward_flops_rate(args, flops_per_forward: float) -> float:
    """The model's own FLOP/s on this device: the planner's forward FLOPs
    over the best time of a plain forward of the same model and batch (the
    paper's profiling iteration, in small)."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config(args)).to(torch.bfloat16)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    best = float("inf")
    for _ in range(4):
        start = time.perf_counter()
        model(input_ids=ids, labels=ids)
        best = min(best, time.perf_counter() - start)
    return flops_per_forward / best


def copy_bandwidth(nbytes: int = 256 << 20, rounds: int = 3) -> float:
    """Best bytes/s of one large tensor copy (the CPU's "link")."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def config(args) -> GPT2Config:
    return GPT2Config(vocab_size=args.vocab, n_positions=args.seq,
                      n_embd=args.width, n_layer=args.layers,
                      n_head=max(1, args.width // 64), resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0)


def wait_for_profile(socket: str) -> Dict[str, Any]:
    deadline = time.monotonic() + 120
    with lohan.Client(socket) as client:
        while time.monotonic() < deadline:
            profile = client.status().get("profile")
            if profile:
                return profile
            time.sleep(0.2)
    raise RuntimeError("lohand measured no machine profile (see its log)")


def predict(args, bazel_bin: Path, socket: str, config_path: Path,
            flops: float, link: float, *extra: str) -> Dict[str, Any]:
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    out = subprocess.run(
        [str(bazel_bin / "client/ctl/lohanctl"), "--socket", socket, "plan",
         "--this-machine", "--device-is-host", "--model", str(config_path),
         "--batch", str(args.batch), "--seq", str(args.seq),
         "--device-memory", str(available), "--device-tflops",
         str(flops / 1e12), "--h2d-gbps", str(link / 1e9), "--d2h-gbps",
         str(link / 1e9), "--json", *extra],
        capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def measure(args, socket: str, data: List[torch.Tensor], name: str,
            activations: Any = "offload", plans: Any = None,
            ssd: Any = None) -> Tuple[float, float, float, float]:
    """Seconds per step through lohan with the plugin's fixed policy, and
    the medians of its forward, backward and step() calls. With
    activations="auto", the live plan goes into `plans`; with `ssd` (and
    args.daemon_pid), lohand's SSD bytes read and written per parameter
    per timed step (its /proc/<pid>/io)."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config(args))
    phases: List[Tuple[float, float, float]] = []
    options = ({"device_memory_bytes": args.device_memory}
               if activations == "auto" and args.device_memory else {})
    with lohan.init(model, lr=1e-3, socket=socket, job_name=name,
                    dtype="bf16", activations=activations,
                    **options) as engine:
        start = 0.0
        io0 = (0, 0)
        for n, ids in enumerate(data):
            if n == 3:
                start = time.perf_counter()
                if ssd is not None:
                    io0 = daemon_io(args.daemon_pid)
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            engine.step()
            phases.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
        engine.master_weights()  # the last updates, done
        seconds = (time.perf_counter() - start) / (len(data) - 3)
        if ssd is not None:
            io1 = daemon_io(args.daemon_pid)
            per_step = sum(p.numel() for p in model.parameters()) * (
                len(data) - 3)
            ssd.append(((io1[0] - io0[0]) / per_step,
                        (io1[1] - io0[1]) / per_step))
        if plans is not None:
            plans.append(engine.activation_plan)
    with lohan.Client(socket) as client:
        for job in client.jobs():
            if job.name == name:
                client.delete_job(job.id)
    timed = phases[3:]
    return (seconds, statistics.median(p[0] for p in timed),
            statistics.median(p[1] for p in timed),
            statistics.median(p[2] for p in timed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sweep", action="store_true",
                        help="the per-block curve, measured point by point")
    parser.add_argument("--live", action="store_true",
                        help="activations='auto': the plugin's own profile "
                        "and lohand's plan, against 'offload'")
    parser.add_argument("--device-memory", type=int, default=0,
                        help="with --live: the device memory auto's plan "
                        "may use (bytes; default: what the host has)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bazel_bin = Path(os.environ.get("LOHAN_BAZEL_BIN", REPO / "bazel-bin"))
    with tempfile.TemporaryDirectory(prefix="lohan-plan-bench-") as scratch:
        directory = Path(scratch)
        daemon = start_daemon(directory, bazel_bin, pool="1GiB",
                              ssd_capacity="8GiB",
                              extra=["--profile-probe", "256MiB"])
        try:
            socket = str(directory / "lohand.sock")
            args.daemon_pid = daemon.pid
            profile = wait_for_profile(socket)
            flops = matmul_flops(torch.bfloat16)
            link = copy_bandwidth()
            config_path = directory / "bench-gpt2" / "config.json"
            config_path.parent.mkdir()
            config(args).to_json_file(str(config_path))
            plan = predict(args, bazel_bin, socket, config_path, flops, link)
            # Again with the device's rate taken from the model's forward.
            model_rate = forward_flops_rate(
                args, plan["plans"][0]["forward_flops"])
            calibrated = predict(args, bazel_bin, socket, config_path,
                                 model_rate, link)
            g = torch.Generator().manual_seed(1)
            data = [torch.randint(0, args.vocab, (args.batch, args.seq),
                                  generator=g)
                    for _ in range(args.steps + 3)]
            if args.live:
                live(args, socket, data)
                return
            if args.sweep:
                per_block = predict(args, bazel_bin, socket, config_path,
                                    model_rate, link, "--per-block")
                sweep(args, socket, data, per_block, profile, model_rate)
                return
            measured = [measure(args, socket, data, f"plan-bench-{r}")
                        for r in range(args.rounds)]
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    report(args, plan, profile, flops, link, measured)
    print(f"\nwith the device's rate from a measured forward of the model "
          f"({model_rate / 1e12:.3f} TFLOPS):")
    report_prediction(calibrated, statistics.median(m[0] for m in measured))


def live(args, socket: str, data: List[torch.Tensor]) -> None:
    """activations="auto" (its first iteration profiles; lohand plans per
    saved tensor) and "offload", rounds interleaved: the live plan's
    prediction against the measured time, and auto's speed against
    offload's."""
    times: Dict[str, List[float]] = {"auto": [], "offload": []}
    ssd: Dict[str, List[Tuple[float, float]]] = {"auto": [], "offload": []}
    plans: List[Any] = []
    for round_ in range(args.rounds):
        order = ["auto", "offload"] if round_ % 2 == 0 else ["offload",
                                                               "auto"]
        for policy in order:
            times[policy].append(measure(
                args, socket, data, f"plan-live-{round_}-{policy}", policy,
                plans if policy == "auto" else None, ssd[policy])[0])
    print(f"GPT-2 {args.layers} blocks x {args.width}, batch {args.batch} x "
          f"{args.seq}, bf16, torch threads {args.threads}; "
          f"{args.rounds} rounds of {args.steps} steps")
    print(f"{'round':>5} {'predicted s':>12} {'auto s':>8} "
          f"{'measured/predicted':>19} {'offload s':>10} {'auto/offload':>13}"
          "  plan")
    for round_, plan in enumerate(plans):
        if plan is None:
            print(f"{round_:>5}  (no plan: see the warning above)")
            continue
        predicted = float(plan["predictedIterationSeconds"])
        auto, offload = times["auto"][round_], times["offload"][round_]
        modes = plan.get("blockModes", [])
        summary = ", ".join(f"{modes.count(m)} {m}"
                            for m in sorted(set(modes)))
        decided = [d for block in plan.get("blocks", [])
                   for d in block.get("decisions", [])]
        summary += " (" + ", ".join(f"{decided.count(d)} {d}" for d in
                                    sorted(set(decided))) + ")"
        print(f"{round_:>5} {predicted:>12.3f} {auto:>8.3f} "
              f"{auto / predicted:>18.2f}x {offload:>10.3f} "
              f"{auto / offload:>12.2f}x  case {plan.get('searchCase')}, "
              f"{summary}; forward binds {plan.get('forwardBinding')}, "
              f"backward {plan.get('backwardBinding')}")
    auto = statistics.median(times["auto"])
    offload = statistics.median(times["offload"])
    print(f"medians: auto {auto:.3f} s/step, offload {offload:.3f} "
          f"({auto / offload:.2f}x)")
    for policy in ("auto", "offload"):
        reads = [r for r, _ in ssd[policy]]
        writes = [w for _, w in ssd[policy]]
        print(f"lohand's SSD bytes per parameter per step, {policy}: read "
              f"{statistics.median(reads):.1f}, written "
              f"{statistics.median(writes):.1f} (the layout's minimum: 12 "
              "and 12, the fp32 masters and two moments; spilled "
              "activations add to both)")


def sweep(args, socket: str, data: List[torch.Tensor], plan: Dict[str, Any],
          profile: Dict[str, Any], rate: float) -> None:
    """Measures the per-block curve at five points beside its prediction."""
    chosen = plan["plans"][0]
    curve = chosen["curve"]
    layers = args.layers
    points = sorted({0, layers // 4, layers // 2, 3 * layers // 4, layers})
    times: Dict[int, List[float]] = {k: [] for k in points}
    for round_ in range(args.rounds):
        for k in points if round_ % 2 == 0 else points[::-1]:
            modes = ["offload"] * (layers - k) + ["swap"] * k
            times[k].append(measure(args, socket, data,
                                    f"plan-sweep-{round_}-{k}", modes)[0])
    print(f"GPT-2 {layers} blocks x {args.width}, batch {args.batch} x "
          f"{args.seq}, bf16: the last k blocks swap, the others recompute")
    print(f"machine: CPU {rate / 1e12:.3f} TFLOPS (the model's forward); "
          f"lohand: SSD "
          f"{profile['array_read_bytes_per_second'] / 1e9:.2f} GB/s read, "
          f"{profile['array_write_bytes_per_second'] / 1e9:.2f} GB/s write")
    print(f"{'k':>3} {'predicted s':>12} {'measured s':>11} "
          f"{'measured/predicted':>19}")
    for k in points:
        predicted = curve[k]["iteration_seconds"]
        measured = statistics.median(times[k])
        print(f"{k:>3} {predicted:>12.3f} {measured:>11.3f} "
              f"{measured / predicted:>18.2f}x")
    best = min(points, key=lambda k: statistics.median(times[k]))
    print(f"predicted best k: {chosen['chosen']} (case {chosen['case']}, "
          f"{chosen['iteration_seconds']:.3f} s); measured best of the "
          f"points: k = {best}")


def report(args, plan: Dict[str, Any], profile: Dict[str, Any], flops: float,
           link: float, runs: List[Tuple[float, float, float, float]]) -> None:
    measured = [run[0] for run in runs]
    median = statistics.median(measured)
    print(f"GPT-2 {args.layers} blocks x {args.width}, vocab {args.vocab}, "
          f"{plan['parameters']:,} parameters, batch {args.batch} x "
          f"{args.seq}, bf16, torch threads {args.threads}")
    print(f"machine: CPU {flops / 1e12:.3f} TFLOPS (bf16 matmul), copy "
          f"{link / 1e9:.1f} GB/s; lohand: SSD "
          f"{profile['array_read_bytes_per_second'] / 1e9:.2f} GB/s read, "
          f"{profile['array_write_bytes_per_second'] / 1e9:.2f} GB/s write, "
          f"optimizer "
          f"{profile['optimizer_parameters_per_second_per_thread'] / 1e6:.0f}"
          f" M parameters/s x {profile['optimizer_threads']} threads")
    print(f"measured (activations='offload'), {args.rounds} rounds of "
          f"{args.steps} steps: " +
          ", ".join(f"{m:.3f}" for m in measured) + f" s/step; median "
          f"{median:.3f}")
    forward, backward, step = (statistics.median(run[i] for run in runs)
                               for i in (1, 2, 3))
    print(f"measured phases (medians): forward {forward:.3f}, backward "
          f"{backward:.3f}, step() {step:.3f} s")
    print("with the device's rate from the peak matmul:")
    report_prediction(plan, median)


def report_prediction(plan: Dict[str, Any], measured: float) -> None:
    chosen = plan["plans"][0]
    first = chosen["curve"][0]["iteration_seconds"]
    f, b = chosen["forward"], chosen["backward"]
    print(f"predicted stages at the planner's choice: forward "
          f"{f['seconds']:.3f} (compute "
          f"{f['compute']:.3f}, link {f['host_to_device']:.3f}, SSDs "
          f"{f['ssd']:.3f}), backward {b['seconds']:.3f} (compute "
          f"{b['compute']:.3f}, SSDs {b['ssd']:.3f}), after "
          f"{chosen['tail_seconds']:.3f}")
    print(f"predicted at the plugin's point {first:.3f} s/step; measured / "
          f"predicted "
          f"{measured / first:.2f}x")
    print(f"planner's choice: case {chosen['case']}, point {chosen['chosen']} "
          f"of {len(chosen['curve']) - 1}, "
          f"{chosen['iteration_seconds']:.3f} s/step "
          f"predicted (forward binds {chosen['forward']['binding']}, "
          f"backward binds {chosen['backward']['binding']})")


if __name__ == "__main__":
    main()
