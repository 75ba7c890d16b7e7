"""daemon/optim against torch.optim, through liblohan_optim.so (ctypes).

Runs 100 steps of torch.optim.AdamW / Adam (and SGD with momentum) and of
our kernels on the same random tensors and gradients, for each SIMD path the
CPU has, and compares.

Tolerance (stated, not tuned per run): after 100 steps at lr=1e-3,
    max |w_ours - w_torch| <= 1e-6 * max|w| + 1e-4 * lr
for fp32 master weights (torch and we round differently inside a step:
torch's lerp/addcmul/addcdiv vs our fma; both are float, so the differences
are a few ulps per step), and the moments agree to
    max |m_ours - m_torch| <= 1e-5 * max|m|,  same for v.
16-bit weight copies must equal torch's w.to(bfloat16 / float16) bit for
bit (both round to nearest even).

The library is found at $LOHAN_BAZEL_BIN/daemon/optim/liblohan_optim.so
($LOHAN_BAZEL_BIN = `bazel info bazel-bin`, default <repo>/bazel-bin). A
missing library is a test failure, not a skip.
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
LIB_RELATIVE = Path("daemon/optim/liblohan_optim.so")
ISAS = ["scalar", "avx2", "avx512"]
STEPS = 100
LR = 1e-3
SIZES = [1, 7, 17, 1023, 40_000]

F32, BF16, F16 = 0, 1, 2
DTYPE_CODE = {torch.float32: F32, torch.bfloat16: BF16, torch.float16: F16}

W_REL_TOL = 1e-6
W_LR_TOL = 1e-4
MOMENT_REL_TOL = 1e-5


def _library_path() -> Path:
    bazel_bin = Path(os.environ.get("LOHAN_BAZEL_BIN", REPO / "bazel-bin"))
    return bazel_bin / LIB_RELATIVE


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    path = _library_path()
    if not path.exists():
        pytest.fail(
            f"{path} not found. Build it first:\n"
            "  bazel build //daemon/optim:liblohan_optim.so\n"
            "and point LOHAN_BAZEL_BIN at `bazel info bazel-bin`.",
            pytrace=False,
        )
    lib = ctypes.CDLL(str(path))
    vp, f32p, i64p = ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
    c_int, c_size, c_float, c_double = (
        ctypes.c_int, ctypes.c_size_t, ctypes.c_float, ctypes.c_double)
    lib.lohan_optim_last_error.restype = ctypes.c_char_p
    lib.lohan_optim_cpu_supports.argtypes = [ctypes.c_char_p]
    lib.lohan_optim_create.argtypes = [ctypes.c_char_p, c_int, c_int,
                                       ctypes.POINTER(vp)]
    lib.lohan_optim_destroy.argtypes = [vp]
    lib.lohan_optim_destroy.restype = None
    lib.lohan_optim_isa.argtypes = [vp]
    lib.lohan_optim_isa.restype = ctypes.c_char_p
    lib.lohan_optim_tuning.argtypes = [vp]
    lib.lohan_optim_tuning.restype = ctypes.c_char_p
    lib.lohan_optim_set_tuning.argtypes = [vp, ctypes.c_char_p]
    lib.lohan_optim_calibrate.argtypes = [vp, c_size, c_int]
    lib.lohan_optim_adam_step.argtypes = [
        vp, c_size, f32p, vp, vp, vp, c_int, i64p, vp, c_int, c_float, vp,
        c_int, c_double, c_double, c_double, c_double, c_double, c_int, c_int,
        ctypes.POINTER(c_double), ctypes.POINTER(c_int)]
    lib.lohan_optim_sgd_step.argtypes = [
        vp, c_size, f32p, f32p, i64p, vp, c_int, c_float, vp, c_int,
        c_double, c_double, c_double, c_double, c_int,
        ctypes.POINTER(c_double), ctypes.POINTER(c_int)]
    return lib


class Optim:
    """A lohan_optim handle."""

    def __init__(self, lib: ctypes.CDLL, isa: str, threads: int):
        self.lib = lib
        self.handle = ctypes.c_void_p()
        rc = lib.lohan_optim_create(isa.encode(), threads, 1,
                                    ctypes.byref(self.handle))
        assert rc == 0, lib.lohan_optim_last_error().decode()
        assert lib.lohan_optim_isa(self.handle).decode() == isa

    def close(self) -> None:
        self.lib.lohan_optim_destroy(self.handle)

    def check(self, rc: int) -> None:
        assert rc == 0, self.lib.lohan_optim_last_error().decode()


def _require(lib: ctypes.CDLL, isa: str) -> None:
    if lib.lohan_optim_cpu_supports(isa.encode()) != 1:
        pytest.skip(f"this CPU lacks the {isa} path")


def _assert_close(ours: torch.Tensor, theirs: torch.Tensor, tol: float,
                  what: str) -> None:
    diff = (ours.double() - theirs.double()).abs().max().item()
    print(f"{what}: max abs diff {diff:.3g} (tolerance {tol:.3g})")
    assert diff <= tol, f"{what}: max abs diff {diff:.3g} > tolerance {tol:.3g}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16,
                                        torch.float16])
@pytest.mark.parametrize("kind", ["adamw", "adam", "adamw_amsgrad"])
def test_adam_matches_torch(lib, isa, grad_dtype, kind):
    _require(lib, isa)
    torch.manual_seed(1234)
    decoupled = kind != "adam"
    amsgrad = kind == "adamw_amsgrad"
    wd = 0.01
    # fp16 gradients come loss-scaled; we unscale inside the step.
    loss_scale = 1024.0 if grad_dtype == torch.float16 else 1.0
    inv_scale = 1.0 / loss_scale
    params = [torch.nn.Parameter(torch.randn(n) * 0.5) for n in SIZES]
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    ref_opt = cls(params, lr=LR, betas=(0.9, 0.999), eps=1e-8,
                  weight_decay=wd, amsgrad=amsgrad)
    w = [p.detach().clone() for p in params]
    m = [torch.zeros_like(x) for x in w]
    v = [torch.zeros_like(x) for x in w]
    vmax = [torch.zeros_like(x) for x in w]
    steps = [ctypes.c_int64(0) for _ in w]
    out = [torch.empty(x.numel(), dtype=torch.bfloat16) for x in w]
    opt = Optim(lib, isa, threads=2)
    try:
        for _ in range(STEPS):
            for i, p in enumerate(params):
                g = (torch.randn(p.numel()) * 1e-2 * loss_scale).to(grad_dtype)
                # torch sees the same gradient values, unscaled in float.
                p.grad = g.float() * torch.tensor(inv_scale, dtype=torch.float32)
                sq, bad = ctypes.c_double(), ctypes.c_int()
                opt.check(lib.lohan_optim_adam_step(
                    opt.handle, w[i].numel(), w[i].data_ptr(), m[i].data_ptr(),
                    v[i].data_ptr(), vmax[i].data_ptr(), F32,
                    ctypes.byref(steps[i]), g.data_ptr(), DTYPE_CODE[grad_dtype],
                    inv_scale, out[i].data_ptr(), BF16, LR, 0.9, 0.999, 1e-8,
                    wd, int(decoupled), int(amsgrad), ctypes.byref(sq),
                    ctypes.byref(bad)))
                assert bad.value == 0
                want_sq = (p.grad.double() ** 2).sum().item()
                assert sq.value == pytest.approx(want_sq, rel=1e-9, abs=1e-300)
            ref_opt.step()
    finally:
        opt.close()
    for i, p in enumerate(params):
        st = ref_opt.state[p]
        assert steps[i].value == STEPS == int(st["step"])
        scale = p.detach().abs().max().item()
        _assert_close(w[i], p.detach(), W_REL_TOL * scale + W_LR_TOL * LR,
                      f"weights (n={p.numel()})")
        _assert_close(m[i], st["exp_avg"],
                      MOMENT_REL_TOL * st["exp_avg"].abs().max().item(),
                      f"exp_avg (n={p.numel()})")
        _assert_close(v[i], st["exp_avg_sq"],
                      MOMENT_REL_TOL * st["exp_avg_sq"].abs().max().item(),
                      f"exp_avg_sq (n={p.numel()})")
        if amsgrad:
            _assert_close(vmax[i], st["max_exp_avg_sq"],
                          MOMENT_REL_TOL *
                          st["max_exp_avg_sq"].abs().max().item(),
                          f"max_exp_avg_sq (n={p.numel()})")
        # The bf16 copy is exactly our fp32 weights rounded like torch does.
        assert torch.equal(out[i].view(torch.int16),
                           w[i].to(torch.bfloat16).view(torch.int16))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_matches_torch(lib, isa, nesterov):
    _require(lib, isa)
    torch.manual_seed(99)
    params = [torch.nn.Parameter(torch.randn(n) * 0.5) for n in SIZES]
    ref_opt = torch.optim.SGD(params, lr=0.01, momentum=0.9,
                              weight_decay=1e-4, nesterov=nesterov)
    w = [p.detach().clone() for p in params]
    buf = [torch.zeros_like(x) for x in w]
    steps = [ctypes.c_int64(0) for _ in w]
    out = [torch.empty(x.numel(), dtype=torch.float16) for x in w]
    opt = Optim(lib, isa, threads=1)
    try:
        for _ in range(STEPS):
            for i, p in enumerate(params):
                g = (torch.randn(p.numel()) * 1e-2).to(torch.bfloat16)
                p.grad = g.float()
                opt.check(lib.lohan_optim_sgd_step(
                    opt.handle, w[i].numel(), w[i].data_ptr(),
                    buf[i].data_ptr(), ctypes.byref(steps[i]), g.data_ptr(),
                    BF16, 1.0, out[i].data_ptr(), F16, 0.01, 0.9, 0.0, 1e-4,
                    int(nesterov), None, None))
            ref_opt.step()
    finally:
        opt.close()
    for i, p in enumerate(params):
        scale = p.detach().abs().max().item()
        _assert_close(w[i], p.detach(), W_REL_TOL * scale + W_LR_TOL * 0.01,
                      f"sgd weights (n={p.numel()})")
        mb = ref_opt.state[p]["momentum_buffer"]
        _assert_close(buf[i], mb, MOMENT_REL_TOL * mb.abs().max().item(),
                      f"momentum buffer (n={p.numel()})")
        assert torch.equal(out[i].view(torch.int16),
                           w[i].to(torch.float16).view(torch.int16))


def test_errors_come_back_as_status(lib):
    handle = ctypes.c_void_p()
    assert lib.lohan_optim_create(b"sse9", 1, 0, ctypes.byref(handle)) == 3
    assert b"unknown optimizer ISA" in lib.lohan_optim_last_error()
    assert lib.lohan_optim_create(b"scalar", -1, 0, ctypes.byref(handle)) == 3
    opt = Optim(lib, "scalar", threads=0)
    try:
        step = ctypes.c_int64(0)
        w = torch.zeros(4)
        rc = lib.lohan_optim_adam_step(
            opt.handle, 4, w.data_ptr(), None, None, None, F32,
            ctypes.byref(step), w.data_ptr(), F32, 1.0, None, 0, LR, 0.9,
            0.999, 1e-8, 0.0, 1, 0, None, None)
        assert rc == 3
        assert b"null" in lib.lohan_optim_last_error()
        assert step.value == 0
    finally:
        opt.close()


def test_tuning_is_set_calibrated_and_refused_through_the_c_abi(lib):
    opt = Optim(lib, "scalar", threads=2)
    try:
        assert opt.lib.lohan_optim_tuning(opt.handle) == (
            b"prefetch=1024,stream=on,chunks=1")
        opt.check(lib.lohan_optim_set_tuning(opt.handle, b"chunks=8"))
        assert opt.lib.lohan_optim_tuning(opt.handle) == (
            b"prefetch=1024,stream=on,chunks=8")
        assert lib.lohan_optim_set_tuning(None, b"chunks=2") == 3
        assert lib.lohan_optim_set_tuning(opt.handle, None) == 3
        assert lib.lohan_optim_calibrate(None, 0, 0) == 3
        assert lib.lohan_optim_tuning(None) == b""
        assert lib.lohan_optim_set_tuning(opt.handle, b"stream=maybe") == 3
        assert b"stream=maybe" in lib.lohan_optim_last_error()
        # The failed call left the tuning as it was.
        assert opt.lib.lohan_optim_tuning(opt.handle).endswith(b"chunks=8")
        # A small calibration (8 MiB of buffers, one round): the forced
        # path stays, the tuning becomes one of the candidates.
        opt.check(lib.lohan_optim_calibrate(opt.handle, 8 << 20, 1))
        assert lib.lohan_optim_isa(opt.handle) == b"scalar"
        tuning = lib.lohan_optim_tuning(opt.handle).decode()
        assert re.fullmatch(r"prefetch=(0|256|1024|4096),stream=(on|off),"
                            r"chunks=(1|16)", tuning), tuning
        # Buffers that cannot be mapped: an error, the tuning kept.
        assert lib.lohan_optim_calibrate(opt.handle, 1 << 60, 1) == 8
        assert b"calibration" in lib.lohan_optim_last_error()
        assert lib.lohan_optim_tuning(opt.handle).decode() == tuning
    finally:
        opt.close()
