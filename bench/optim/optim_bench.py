"""Optimizer benchmark driver: lohan's AdamW kernels vs torch fused AdamW.

Times, in one process on the same tensor sizes:
  * memcpy bandwidth (libc memcpy via ctypes.memmove, 1 and 2 threads,
    counted as bytes read + bytes written),
  * lohan AdamW (liblohan_optim.so via ctypes): bf16 gradient in, fp32
    weight/moments in place, bf16 weight copy out = 28 bytes per parameter,
  * torch.optim.AdamW(fused=True) on the CPU (fp32 param, grad, moments =
    also 28 bytes per parameter, no 16-bit copy),
with 1 and 2 threads, and prints parameters per second, the bandwidth bound
(memcpy bandwidth / 28 B) and the ratios ours/bound and ours/torch_fused.

  bazel build //daemon/optim:liblohan_optim.so
  LOHAN_BAZEL_BIN=$(bazel info bazel-bin) \
      .venv/bin/python bench/optim/optim_bench.py [--params N] [--repeats R]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
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


def ours(lib: ctypes.CDLL, n: int, threads: int, repeats: int) -> tuple[float, str]:
    handle = ctypes.c_void_p()
    if lib.lohan_optim_create(None, threads, 1, ctypes.byref(handle)) != 0:
        raise SystemExit(lib.lohan_optim_last_error().decode())
    try:
        w = torch.randn(n)
        m = torch.zeros(n)
        v = torch.zeros(n)
        g = (torch.randn(n) * 1e-2).to(torch.bfloat16)
        out = torch.empty(n, dtype=torch.bfloat16)
        step = ctypes.c_int64(0)

        def run() -> None:
            rc = lib.lohan_optim_adam_step(
                handle, n, w.data_ptr(), m.data_ptr(), v.data_ptr(), None, F32,
                ctypes.byref(step), g.data_ptr(), BF16, 1.0, out.data_ptr(),
                BF16, 1e-3, 0.9, 0.999, 1e-8, 0.01, 1, 0, None, None)
            if rc != 0:
                raise SystemExit(lib.lohan_optim_last_error().decode())

        secs = timed(run, repeats)
        return n / secs, lib.lohan_optim_kernel_name(handle).decode()
    finally:
        lib.lohan_optim_destroy(handle)


def torch_fused(n: int, threads: int, repeats: int) -> float:
    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n) * 1e-2
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
    secs = timed(opt.step, repeats)
    del opt, p
    return n / secs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=64 << 20)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    lib = load_library()
    n = args.params
    cpu = next((line.split(":", 1)[1].strip()
                for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}"
          f", cpu {cpu}, {os.cpu_count()} cpus, torch {torch.__version__}")
    print(f"params {n} ({n / 2**20:.0f} M), median of {args.repeats} steps, "
          f"{BYTES_PER_PARAM} B/param")
    print(f"{'threads':>7} {'memcpy GB/s':>11} {'bound Mp/s':>10} "
          f"{'ours Mp/s':>10} {'torch Mp/s':>10} {'ours/bound':>10} "
          f"{'ours/torch':>10}  kernel")
    for threads in (1, 2):
        bw = memcpy_bandwidth(threads, args.repeats)
        bound = bw / BYTES_PER_PARAM
        ours_rate, kernel = ours(lib, n, threads, args.repeats)
        torch_rate = torch_fused(n, threads, args.repeats)
        print(f"{threads:>7} {bw / 1e9:>11.2f} {bound / 1e6:>10.1f} "
              f"{ours_rate / 1e6:>10.1f} {torch_rate / 1e6:>10.1f} "
              f"{ours_rate / bound:>10.2f} {ours_rate / torch_rate:>10.2f}  "
              f"{kernel}", flush=True)


if __name__ == "__main__":
    main()
