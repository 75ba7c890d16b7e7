"""The wheel users install into their own environments (scripts/wheel):
built by its one command, installed into a fresh venv, it loads the client
library it carries (no LOHAN_BAZEL_BIN, no checkout on the path) and
trains the demo's model against a running lohand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from conftest import built

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_installs_into_a_fresh_venv_and_trains_the_demo(
        lohand, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LOHAN_")}
    # The library the suite built (scripts/wheel builds its own, -c opt,
    # when not given one).
    built_env = {**env, "LOHAN_CLIENT_LIB": str(
        built("client/liblohan_client.so"))}
    subprocess.run([str(REPO / "scripts" / "wheel"), str(tmp_path / "dist")],
                   env=built_env, check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("lohan-*.whl")
    # A library that is not there: said, and no wheel made.
    missing = subprocess.run(
        [str(REPO / "scripts" / "wheel"), str(tmp_path / "none")],
        env={**env, "LOHAN_CLIENT_LIB": str(tmp_path / "nope.so")},
        capture_output=True, text=True, cwd=tmp_path)
    assert missing.returncode == 1
    assert f"wheel: no client library at {tmp_path / 'nope.so'}" in (
        missing.stderr)
    assert not (tmp_path / "none").exists()
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl"), wheel.name

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # torch and transformers from the suite's own environment, as a plain
    # path: not its .pth files, so not its editable lohan (the checkout).
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; "
         "print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    torch_site = Path(torch.__file__).resolve().parents[1]
    (site / "torch_from_suite.pth").write_text(f"{torch_site}\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                    "--no-deps", "--no-index", str(wheel)], check=True,
                   env=env)

    where = subprocess.run(
        [str(python), "-c", "import lohan, lohan._native as n; "
         "print(lohan.__file__); print(n._candidates())"],
        check=True, capture_output=True, text=True, env=env,
        cwd=tmp_path).stdout.splitlines()
    assert where[0].startswith(str(site)), where
    assert str(site / "lohan" / "_lib" / "liblohan_client.so") in where[1]

    demo = subprocess.run(
        [str(python), "-m", "lohan.demo", "--socket", lohand.socket,
         "--steps", "10", "--batch", "16"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "lohand runs the optimizer" in demo.stdout
    assert "expected" in demo.stdout
