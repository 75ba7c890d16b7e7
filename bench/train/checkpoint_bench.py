"""Real checkpoints in and out (bench/README.md): a GPT-2 checkpoint in
bf16 safetensors shards, loaded and saved four ways, each in a fresh
process, interleaved round by round, the files' page cache dropped
before each load (posix_fadvise DONTNEED):

- raw: every byte of the shards read (`cat`), and as many bytes written
  and fsynced to a new file (`dd`);
- transformers: from_pretrained (bf16), save_pretrained (bf16);
- today's path: from_pretrained, then lohan.init(model, params="offload")
  (no save: the model is in the process);
- lohan: the model built on the meta device, lohan.init(model,
  weights=dir, params="offload"), engine.save_pretrained.

Prints the median seconds and GB/s (checkpoint bytes per second) of each
load and save against raw's, the training process's peak RSS (VmHWM)
against the checkpoint's bytes, and lohan's bytes: what the training
process read from the files and what lohand wrote to its SSDs per
parameter (/proc/<pid>/io) at load.

    .venv/bin/python bench/train/checkpoint_bench.py [--layers 24]
        [--width 1024] [--rounds 3]
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
from typing import Dict, List

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "train"))

from train_bench import daemon_io, start_daemon  # noqa: E402

# One way of loading and saving, run as its own process: prints a JSON
# line with its seconds and its peak RSS.
CHILD = r"""
import json, os, sys, time
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoConfig
way, directory, out, socket = sys.argv[1:5]
directory, out = Path(directory), Path(out)

def io():
    fields = dict(line.split(": ") for line in
                  Path("/proc/self/io").read_text().splitlines())
    return int(fields["read_bytes"])

result = {}
start = time.monotonic()
if way == "transformers":
    model = AutoModelForCausalLM.from_pretrained(directory,
                                                 dtype=torch.bfloat16)
    result["load_s"] = time.monotonic() - start
    start = time.monotonic()
    model.save_pretrained(out, max_shard_size="200MB")
    result["save_s"] = time.monotonic() - start
elif way == "today":
    import lohan
    model = AutoModelForCausalLM.from_pretrained(directory,
                                                 dtype=torch.bfloat16)
    engine = lohan.init(model, params="offload", socket=socket)
    result["load_s"] = time.monotonic() - start
    engine.close(delete_job=True)
else:
    import lohan
    config = AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    engine = lohan.init(model, weights=directory, params="offload",
                        dtype=torch.bfloat16, socket=socket)
    result["load_s"] = time.monotonic() - start
    result["read_bytes"] = io()
    start = time.monotonic()
    engine.save_pretrained(out, max_shard_size="200MB")
    result["save_s"] = time.monotonic() - start
    engine.close(delete_job=True)
# VmHWM: this process's own peak (ru_maxrss would count the bench's,
# which the child was forked from, up to its exec).
result["peak_rss"] = next(int(line.split()[1]) * 1024 for line in
                          open("/proc/self/status")
                          if line.startswith("VmHWM:"))
print(json.dumps(result))
"""


def drop_cache(files: List[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def raw(files: List[Path], total: int, out: Path) -> Dict[str, float]:
    start = time.monotonic()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL,
                   check=True)
    load = time.monotonic() - start
    start = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={out}", "bs=4M",
                    f"count={-(-total // (4 << 20))}", "conv=fsync",
                    "status=none"], check=True)
    save = time.monotonic() - start
    out.unlink()
    return {"load_s": load, "save_s": save}


def child(way: str, directory: Path, out: Path, socket: str,
          daemon_pid: int) -> Dict[str, float]:
    before = daemon_io(daemon_pid)
    done = subprocess.run([sys.executable, "-c", CHILD, way, str(directory),
                           str(out), socket], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(
                              REPO / "plugins" / "pytorch")))
    if done.returncode != 0:
        raise RuntimeError(f"{way}: {done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    after = daemon_io(daemon_pid)
    result["daemon_read"] = after[0] - before[0]
    result["daemon_written"] = after[1] - before[1]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", default=None,
                        help="directory for the checkpoint and lohand "
                        "(default: a temporary one)")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config

    work = Path(args.work or tempfile.mkdtemp(prefix="lohan-ckpt-bench-"))
    directory = work / "checkpoint"
    config = GPT2Config(n_layer=args.layers, n_embd=args.width,
                        n_head=args.width // 64, vocab_size=args.vocab,
                        n_positions=1024, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16
                                     ).save_pretrained(
        directory, max_shard_size="200MB")
    files = sorted(directory.glob("*.safetensors"))
    total = sum(path.stat().st_size for path in files)
    params = total // 2
    bazel_bin = Path(os.environ.get("LOHAN_BAZEL_BIN", REPO / "bazel-bin"))
    daemon_dir = work / "lohand"
    daemon_dir.mkdir()
    daemon = start_daemon(daemon_dir, bazel_bin, pool="256MiB",
                          ssd_capacity=f"{(params * 40 >> 30) + 2}GiB")
    socket = str(daemon_dir / "lohand.sock")
    runs: Dict[str, List[Dict[str, float]]] = {}
    try:
        for round_ in range(args.rounds):
            for way in ("raw", "transformers", "today", "lohan"):
                drop_cache(files)
                out = work / f"out-{way}"
                result = (raw(files, total, work / "raw.bin") if way == "raw"
                          else child(way, directory, out, socket,
                                     daemon.pid))
                runs.setdefault(way, []).append(result)
                subprocess.run(["rm", "-rf", str(out)], check=True)
                print(f"round {round_ + 1} {way}: {json.dumps(result)}",
                      flush=True)
    finally:
        daemon.terminate()
        daemon.wait()
        if args.work is None:
            subprocess.run(["rm", "-rf", str(work)], check=True)

    def median(way: str, key: str) -> float:
        values = [r[key] for r in runs[way] if key in r]
        return statistics.median(values) if values else float("nan")

    print(f"\nGPT-2 {args.layers} x {args.width}, vocab {args.vocab}: "
          f"{params / 1e6:.0f}M parameters, {total / 1e9:.2f} GB in "
          f"{len(files)} shards (bf16); medians of {args.rounds} rounds")
    print(f"{'way':<13}{'load s':>8}{'GB/s':>7}{'x raw':>7}"
          f"{'save s':>8}{'GB/s':>7}{'x raw':>7}{'peak RSS':>10}"
          f"{'x ckpt':>8}")
    raw_load, raw_save = median("raw", "load_s"), median("raw", "save_s")
    for way in ("raw", "transformers", "today", "lohan"):
        load, save = median(way, "load_s"), median(way, "save_s")
        rss = median(way, "peak_rss")
        print(f"{way:<13}{load:8.2f}{total / load / 1e9:7.2f}"
              f"{load / raw_load:7.2f}{save:8.2f}{total / save / 1e9:7.2f}"
              f"{save / raw_save:7.2f}{rss / 2**30:9.2f}G"
              f"{rss / total:8.2f}")
    read = median("lohan", "read_bytes")
    written = median("lohan", "daemon_written")
    print(f"lohan's load and save: the training process read "
          f"{read / total:.2f}x the checkpoint's bytes; lohand wrote "
          f"{written / params:.1f} B per parameter (the layout's minimum "
          "for a new job: the fp32 master and two moments, 12 B, and the "
          "16-bit weights a streamed arena reads, 2 B) and read "
          f"{median('lohan', 'daemon_read') / params:.1f} B per parameter "
          "(the save's masters: 4 B); at raw's write speed "
          f"({total / raw_save / 1e9:.2f} GB/s) lohand's bytes take "
          f"{written * raw_save / total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
