"""The README's demo fine-tune (python -m lohan.demo) runs against a real
daemon: the loss falls and it reports its answers and accuracy."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_demo_fine_tune_runs_and_loss_falls(lohand, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "lohan.demo", "--socket", lohand.socket,
         "--steps", "60", "--then", "echo after-training"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ,
             "PYTHONPATH": str(REPO / "plugins" / "pytorch")})
    assert result.returncode == 0, result.stdout + result.stderr
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", result.stdout)]
    assert len(losses) >= 10
    assert losses[-1] < losses[0] * 0.8, losses
    assert "held-out accuracy:" in result.stdout
    assert "expected" in result.stdout and "after" in result.stdout
    assert "after-training" in result.stdout
