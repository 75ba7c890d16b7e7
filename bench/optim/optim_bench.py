"""Optimizer benchmark driver: lohan's AdamW kernels vs torch fused AdamW
and DeepSpeed's CPUAdam.

Times, in one process on the same tensor sizes, the contenders' steps
interleaved round by round:
  * memcpy bandwidth (libc memcpy via ctypes.memmove, 1 and 2 threads,
    counted as bytes read + bytes written),
  * case fp32: fp32 gradient, weight and moments, no copy (28 bytes per
    parameter for all): lohan's AdamW (liblohan_optim.so via ctypes),
    torch.optim.AdamW(fused=True) and DeepSpeed's CPUAdam (JIT-built; left
    out when it cannot be loaded),
  * case bf16, lohan's real one: bf16 gradient in, fp32 weight and moments
    in place, bf16 weight copy out (28 bytes per parameter for lohan, one
    pass); the peers widen the gradient before their step and narrow the
    weight after it (their real equivalent: two more passes),
with 1 and 2 threads (torch.set_num_threads sets DeepSpeed's OpenMP too:
it links torch's), lohan's kernels tuned as lohand's start-up calibration
tunes them on that thread count (path and tuning, --tuning), and prints parameters per
second and the ratios ours/bound (the bound: memcpy bandwidth / 28 B),
ours/torch, ours/ds. Each case runs several trials with fresh tensors for
every contender (where a contender's pages land changes its speed by a few
per cent from one allocation to the next): rates are the median over the
trials, ratios the median and range of the trials' own ratios.

  bazel build //daemon/optim:liblohan_optim.so
  LOHAN_BAZEL_BIN=$(bazel info bazel-bin) \
      .venv/bin/python bench/optim/optim_bench.py [--params N] [--repeats R]
  # every contender's tensors on transparent huge pages, as lohand's are:
  THP_MEM_ALLOC_ENABLE=1 LOHAN_BAZEL_BIN=... .venv/bin/python ...
"""

from __future__ import annotations

import os

# Before torch loads: OpenMP threads that spin after a peer's step would take
# a core from the next contender's threads on a small machine (lohan's own
# run in lohand, apart from the training process's OpenMP pool).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import ctypes
import datetime
import platform
import statistics
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
BYTES_PER_PARAM = 28  # bf16 grad 2 + fp32 w,m,v read+write 24 + bf16 out 2
F32, BF16 = 0, 1


def load_library() -> ctypes.CDLL:
    bazel_bin = Path(os.environ.get("LOHAN_BAZEL_BIN", REPO / "bazel-bin"))
    path = bazel_bin / "daemon/optim/liblohan_optim.so"
    if not path.exists():
        raise SystemExit(f"{path} not found: bazel build "
                         "//daemon/optim:liblohan_optim.so and set "
                         "LOHAN_BAZEL_BIN=$(bazel info bazel-bin)")
    lib = ctypes.CDLL(str(path))
    vp, c_int = ctypes.c_void_p, ctypes.c_int
    c_size, c_float, c_double = ctypes.c_size_t, ctypes.c_float, ctypes.c_double
    lib.lohan_optim_last_error.restype = ctypes.c_char_p
    lib.lohan_optim_create.argtypes = [ctypes.c_char_p, c_int, c_int,
                                       ctypes.POINTER(vp)]
    lib.lohan_optim_destroy.argtypes = [vp]
    lib.lohan_optim_destroy.restype = None
    lib.lohan_optim_kernel_name.argtypes = [vp]
    lib.lohan_optim_kernel_name.restype = ctypes.c_char_p
    lib.lohan_optim_isa.argtypes = [vp]
    lib.lohan_optim_isa.restype = ctypes.c_char_p
    lib.lohan_optim_tuning.argtypes = [vp]
    lib.lohan_optim_tuning.restype = ctypes.c_char_p
    lib.lohan_optim_set_tuning.argtypes = [vp, ctypes.c_char_p]
    lib.lohan_optim_calibrate.argtypes = [vp, c_size, c_int]
    lib.lohan_optim_adam_step.argtypes = [
        vp, c_size, vp, vp, vp, vp, c_int, ctypes.POINTER(ctypes.c_int64), vp,
        c_int, c_float, vp, c_int, c_double, c_double, c_double, c_double,
        c_double, c_int, c_int, ctypes.POINTER(c_double),
        ctypes.POINTER(c_int)]
    return lib


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    secs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        secs.append(time.perf_counter() - start)
    return statistics.median(secs)


def memcpy_bandwidth(threads: int, repeats: int, nbytes: int = 1 << 30) -> float:
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    share = nbytes // threads

    def copy() -> None:
        # ctypes releases the GIL during the call, so the threads overlap.
        workers = [threading.Thread(target=ctypes.memmove, args=(
            dst.data_ptr() + t * share, src.data_ptr() + t * share, share))
            for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    return 2.0 * share * threads / timed(copy, repeats)


class Ours:
    """lohan's AdamW (liblohan_optim.so): `grad` fp32 or bf16 in, fp32
    weight and moments in place, with `copy` the bf16 weight copy out in
    the same pass."""

    def __init__(self, lib: ctypes.CDLL, n: int, threads: int, bf16: bool,
                 isa: str, tuning: str):
        self.lib = lib
        self.handle = ctypes.c_void_p()
        if lib.lohan_optim_create(isa.encode(), threads, 1,
                                  ctypes.byref(self.handle)) != 0:
            raise SystemExit(lib.lohan_optim_last_error().decode())
        if lib.lohan_optim_set_tuning(self.handle, tuning.encode()) != 0:
            raise SystemExit(lib.lohan_optim_last_error().decode())
        self.n = n
        self.w, self.m, self.v = torch.randn(n), torch.zeros(n), torch.zeros(n)
        g = torch.randn(n) * 1e-2
        self.bf16 = bf16
        self.g = g.to(torch.bfloat16) if bf16 else g
        self.out = torch.empty(n, dtype=torch.bfloat16) if bf16 else None
        self.step = ctypes.c_int64(0)
        self.kernel = lib.lohan_optim_kernel_name(self.handle).decode()
        self.tuning = lib.lohan_optim_tuning(self.handle).decode()

    def __call__(self) -> None:
        rc = self.lib.lohan_optim_adam_step(
            self.handle, self.n, self.w.data_ptr(), self.m.data_ptr(),
            self.v.data_ptr(), None, F32, ctypes.byref(self.step),
            self.g.data_ptr(), BF16 if self.bf16 else F32, 1.0,
            self.out.data_ptr() if self.bf16 else None, BF16 if self.bf16
            else F32, 1e-3, 0.9, 0.999, 1e-8, 0.01, 1, 0, None, None)
        if rc != 0:
            raise SystemExit(self.lib.lohan_optim_last_error().decode())

    def close(self) -> None:
        self.lib.lohan_optim_destroy(self.handle)


class Peer:
    """torch's fused AdamW or DeepSpeed's CPUAdam on fp32 tensors; with
    `bf16`, the passes a peer needs for lohan's case around its step: the
    bf16 gradient widened into the fp32 one, and the bf16 weight copy made
    after (what ZeRO-Offload does beside CPUAdam)."""

    def __init__(self, kind: str, n: int, bf16: bool):
        self.p = torch.nn.Parameter(torch.randn(n))
        g = torch.randn(n) * 1e-2
        self.p.grad = g.clone()
        self.bf16 = bf16
        self.g16 = g.to(torch.bfloat16) if bf16 else None
        self.w16 = torch.empty(n, dtype=torch.bfloat16) if bf16 else None
        if kind == "torch":
            self.opt = torch.optim.AdamW([self.p], lr=1e-3,
                                         weight_decay=0.01, fused=True)
        else:
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            self.opt = DeepSpeedCPUAdam([self.p], lr=1e-3, weight_decay=0.01,
                                        adamw_mode=True)

    def __call__(self) -> None:
        if self.bf16:
            self.p.grad.copy_(self.g16)
        self.opt.step()
        if self.bf16:
            self.w16.copy_(self.p.detach())

    def close(self) -> None:
        del self.opt, self.p


def calibrated(lib: ctypes.CDLL, threads: int) -> tuple[str, str]:
    """The path and tuning lohand's start-up calibration picks on `threads`
    threads."""
    handle = ctypes.c_void_p()
    if lib.lohan_optim_create(None, threads, 1, ctypes.byref(handle)) != 0:
        raise SystemExit(lib.lohan_optim_last_error().decode())
    try:
        if lib.lohan_optim_calibrate(handle, 0, 0) != 0:
            raise SystemExit(lib.lohan_optim_last_error().decode())
        return (lib.lohan_optim_isa(handle).decode(),
                lib.lohan_optim_tuning(handle).decode())
    finally:
        lib.lohan_optim_destroy(handle)


def deepspeed_available() -> bool:
    try:
        import deepspeed.ops.adam  # noqa: F401
        from deepspeed.ops.op_builder import CPUAdamBuilder
        CPUAdamBuilder().load(verbose=False)
        return True
    except Exception as error:  # not installed, or its JIT build failed
        print(f"(DeepSpeed CPUAdam not measured: {error})")
        return False


def interleaved(contenders: dict, rounds: int) -> dict:
    """Median seconds per step of each contender, one step each per round
    after a warm-up step, in an order rotated every round (so drift and
    a neighbour's cache state fall on all alike)."""
    names = list(contenders)
    for fn in contenders.values():
        fn()
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def trial(lib: ctypes.CDLL, n: int, threads: int, bf16: bool,
          kernel: tuple, deepspeed: bool, rounds: int) -> tuple:
    """One trial: fresh tensors for every contender (so one unlucky
    placement of one contender's pages does not decide), steps interleaved;
    returns ({name: params per second}, ours' kernel and tuning)."""
    ours = Ours(lib, n, threads, bf16, *kernel)
    contenders = {"ours": ours, "torch": Peer("torch", n, bf16)}
    if deepspeed:
        contenders["ds"] = Peer("ds", n, bf16)
    secs = interleaved(contenders, rounds)
    for fn in contenders.values():
        fn.close()
    return ({name: n / t for name, t in secs.items()},
            f"{ours.kernel}, {ours.tuning}")


def spread(values: list) -> str:
    """"1.04 (1.01-1.06)": the median and the range over the trials."""
    if not values:
        return "nan"
    middle = statistics.median(values)
    if len(values) == 1:
        return f"{middle:.2f}"
    return f"{middle:.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=64 << 20)
    parser.add_argument("--repeats", type=int, default=7,
                        help="interleaved rounds (one step of each a round)")
    parser.add_argument("--trials", type=int, default=3,
                        help="fresh allocations per case; rates are the "
                        "median over trials, ratios the median and range")
    parser.add_argument("--no-deepspeed", action="store_true")
    parser.add_argument("--tuning", default="calibrate",
                        help="lohan's kernel tuning: calibrate (as lohand "
                        "does at its first start), default, or e.g. "
                        "prefetch=256,stream=on,chunks=16")
    args = parser.parse_args()
    lib = load_library()
    n = args.params
    cpu = next((line.split(":", 1)[1].strip()
                for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    now = datetime.datetime.now(datetime.timezone.utc)
    print(f"date {now:%Y-%m-%d %H:%M} UTC, cpu {cpu}, {os.cpu_count()} "
          f"cpus, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}")
    huge = os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"
    print(f"tensors on {'huge' if huge else '4 KiB'} pages for every "
          f"contender (THP_MEM_ALLOC_ENABLE={int(huge)}; lohand advises its "
          "own state buffers huge), OMP_WAIT_POLICY="
          f"{os.environ['OMP_WAIT_POLICY']}")
    deepspeed = not args.no_deepspeed and deepspeed_available()
    print(f"params {n} ({n / 2**20:.0f} M), {args.trials} trials of "
          f"{args.repeats} interleaved rounds (median), {BYTES_PER_PARAM} "
          "B/param for lohan")
    print(f"{'case':>5} {'threads':>7} {'memcpy GB/s':>11} {'ours Mp/s':>10} "
          f"{'torch Mp/s':>10} {'ds Mp/s':>8} {'ours/bound':>10} "
          f"{'ours/torch':>17} {'ours/ds':>17}  kernel, tuning")
    kernels = {}
    for threads in (1, 2):
        if args.tuning == "calibrate":
            kernels[threads] = calibrated(lib, threads)
        else:
            kernels[threads] = ("", "" if args.tuning == "default"
                                else args.tuning)
    for case in ("fp32", "bf16"):
        bf16 = case == "bf16"
        for threads in (1, 2):
            torch.set_num_threads(threads)  # torch's and DeepSpeed's OpenMP
            bw = memcpy_bandwidth(threads, args.repeats)
            rates, kernel = [], ""
            for _ in range(args.trials):
                rate, kernel = trial(lib, n, threads, bf16, kernels[threads],
                                     deepspeed, args.repeats)
                rates.append(rate)
            median = {name: statistics.median(r[name] for r in rates)
                      for name in rates[0]}
            vs_torch = [r["ours"] / r["torch"] for r in rates]
            vs_ds = [r["ours"] / r["ds"] for r in rates if "ds" in r]
            print(f"{case:>5} {threads:>7} {bw / 1e9:>11.2f} "
                  f"{median['ours'] / 1e6:>10.1f} "
                  f"{median['torch'] / 1e6:>10.1f} "
                  f"{median.get('ds', 0) / 1e6:>8.1f} "
                  f"{median['ours'] * BYTES_PER_PARAM / bw:>10.2f} "
                  f"{spread(vs_torch):>17} {spread(vs_ds):>17}  {kernel}",
                  flush=True)


if __name__ == "__main__":
    main()
