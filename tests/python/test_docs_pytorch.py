"""docs/pytorch.md's examples marked `<!-- runs in the suite -->` run as
written, each in a fresh process in an empty directory against a real
lohand ($LOHAN_SOCKET)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]


def marked_blocks() -> List[str]:
    text = (REPO / "docs" / "pytorch.md").read_text()
    return re.findall(r"<!-- runs in the suite -->\n```python\n(.*?)```",
                      text, re.DOTALL)


def test_the_checkpoint_example_runs_as_written(lohand, tmp_path):
    (example,) = marked_blocks()
    env = dict(os.environ, LOHAN_SOCKET=lohand.socket,
               PYTHONPATH=str(REPO / "plugins" / "pytorch"))
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path,
                          env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", done.stdout)]
    assert len(losses) == 4 and losses[-1] < losses[0], done.stdout
    assert "loaded torch.bfloat16" in done.stdout, done.stdout
    assert (tmp_path / "tuned" / "config.json").is_file()
    assert len(list((tmp_path / "tuned").glob("*.safetensors"))) > 1
