"""The chunked loss against the model's own (bench/README.md): a Hugging
Face GPT-2 shape with GPT-2's vocabulary, one forward and backward with
labels, the model's own loss (full logits) and lohan's chunked loss
(lohan/causal_lm.py) at the default chunk and smaller ones, interleaved
round by round. Prints the median seconds and the peak bytes of tensors
made during the step (tests/python/live_bytes.py), each as a ratio to the
model's own.

    .venv/bin/python bench/train/loss_bench.py [--rounds 5] [--batch 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import transformers

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugins" / "pytorch"))
sys.path.insert(0, str(REPO / "tests" / "python"))

from lohan import causal_lm  # noqa: E402
from live_bytes import LiveBytes  # noqa: E402


def model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=256, n_head=4, n_positions=512, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config).to(dtype)


def step(net: torch.nn.Module, ids: torch.Tensor) -> None:
    net(input_ids=ids, labels=ids).loss.backward()
    net.zero_grad(set_to_none=True)


def variant(net: torch.nn.Module, chunk: Optional[int],
            chunked: bool) -> Callable[[torch.Tensor], None]:
    causal_lm.install(net, chunked, chunk)
    return lambda ids: step(net, ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--dtype", default="float32",
                        choices=["float32", "bfloat16"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    ids = torch.randint(0, 50257, (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(1))
    names = {"model's own": (None, False), "chunked (default)": (None, True),
             "chunked, 512 tokens": (512, True),
             "chunked, 128 tokens": (128, True)}
    nets = {name: model(dtype) for name in names}
    runs = {name: variant(nets[name], *names[name]) for name in names}
    peaks: Dict[str, int] = {}
    for name, run in runs.items():
        run(ids)  # warm up
        with LiveBytes() as live:
            run(ids)
        peaks[name] = live.peak
    times: Dict[str, List[float]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run(ids)
            times[name].append(time.perf_counter() - start)
    tokens = args.batch * args.seq
    print(f"GPT-2 2 x 256, vocabulary 50257, {args.batch} x {args.seq} = "
          f"{tokens} tokens, {args.dtype}, CPU ({torch.get_num_threads()} "
          f"threads), median of {args.rounds} rounds")
    own = "model's own"
    base_time = statistics.median(times[own])
    print(f"{'loss':<22} {'s/step':>8} {'vs own':>7} {'peak MB':>9} "
          f"{'vs own':>7}")
    for name in names:
        median = statistics.median(times[name])
        print(f"{name:<22} {median:8.3f} {median / base_time:7.2f} "
              f"{peaks[name] / 1e6:9.1f} {peaks[name] / peaks[own]:7.2f}")


if __name__ == "__main__":
    main()
