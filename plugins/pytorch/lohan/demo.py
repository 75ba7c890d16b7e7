"""A fine-tune you can watch: a small GPT-2 (built from a config; nothing is
downloaded) learns multi-digit addition from a data set generated here, with
its optimizer run by lohand. Shows a progress bar (loss, tokens/s, ETA) and
the model's answers before and after.

    python -m lohan.demo --socket /path/to/lohand.sock [--steps 300]

The answer's digits are written least significant first ("123+456=975"),
the order in which a left-to-right model can compute the carries.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from typing import List, Tuple

import torch

import lohan

VOCAB = list("0123456789+=") + ["<eos>", "<pad>"]
TOKEN = {t: i for i, t in enumerate(VOCAB)}
EOS, PAD = TOKEN["<eos>"], TOKEN["<pad>"]


def problem(rng: random.Random, digits: int) -> Tuple[str, str]:
    a = rng.randrange(10 ** digits)
    b = rng.randrange(10 ** digits)
    answer = str(a + b).zfill(digits + 1)[::-1]
    return f"{a:0{digits}d}+{b:0{digits}d}=", answer


def encode(prompt: str, answer: str) -> Tuple[List[int], List[int]]:
    tokens = [TOKEN[c] for c in prompt + answer] + [EOS]
    # Only the answer (and the end) is learned: the prompt is given.
    labels = [-100] * len(prompt) + tokens[len(prompt):]
    return tokens, labels


def batch(rng: random.Random, size: int, digits: int):
    rows = [encode(*problem(rng, digits)) for _ in range(size)]
    return (torch.tensor([r[0] for r in rows]),
            torch.tensor([r[1] for r in rows]))


@torch.no_grad()
def answer(model, prompt: str, length: int) -> str:
    tokens = torch.tensor([[TOKEN[c] for c in prompt]])
    for _ in range(length):
        logits = model(input_ids=tokens).logits[0, -1]
        tokens = torch.cat([tokens, logits.argmax().view(1, 1)], dim=1)
    return "".join(VOCAB[t] if t < 12 else "" for t in
                   tokens[0, len(prompt):].tolist())


def accuracy(model, rng: random.Random, digits: int, n: int) -> float:
    model.eval()
    right = 0
    for _ in range(n):
        prompt, expected = problem(rng, digits)
        right += answer(model, prompt, digits + 1) == expected
    model.train()
    return right / n


def progress(step: int, steps: int, loss: float, tokens_per_s: float,
             elapsed: float) -> None:
    width = 30
    done = int(width * step / steps)
    eta = elapsed / step * (steps - step) if step else 0.0
    sys.stdout.write(
        f"\r[{'#' * done}{'.' * (width - done)}] {step}/{steps} "
        f"loss {loss:.3f}  {tokens_per_s:,.0f} tok/s  ETA {eta:4.0f}s ")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", default=None,
                        help="lohand's socket (default $LOHAN_SOCKET)")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--digits", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--job", default="addition-demo")
    parser.add_argument("--then", default=None, metavar="COMMAND",
                        help="a command to run after training, while the "
                        "job's data plane is still open (e.g. lohanctl "
                        "status)")
    args = parser.parse_args()

    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()

    torch.manual_seed(0)
    torch.set_num_threads(1)  # leave a core to the daemon
    rng = random.Random(0)
    config = GPT2Config(vocab_size=len(VOCAB), n_positions=16, n_embd=96,
                        n_layer=3, n_head=4, bos_token_id=EOS,
                        eos_token_id=EOS, pad_token_id=PAD)
    model = GPT2LMHeadModel(config)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"model: GPT-2, {config.n_layer} blocks, {parameters:,} parameters; "
          f"task: {args.digits}-digit addition")
    samples = [problem(random.Random(i), args.digits) for i in range(3)]
    before = [answer(model, p, args.digits + 1) for p, _ in samples]

    # A fresh job each run (the daemon keeps a job's states: resume=True
    # would continue an earlier run instead).
    with lohan.Client(args.socket) as client:
        for job in client.jobs():
            if job.name == args.job and not job.attached:
                client.delete_job(job.id)
    engine = lohan.init(model, lr=3e-3, betas=(0.9, 0.98),
                        weight_decay=0.01, max_grad_norm=1.0,
                        socket=args.socket, job_name=args.job)
    print(f"lohand runs the optimizer: {len(engine.layers)} layers, "
          f"states on its SSD store")
    start = time.monotonic()
    tokens_seen = 0
    for step in range(1, args.steps + 1):
        inputs, labels = batch(rng, args.batch, args.digits)
        loss = model(input_ids=inputs, labels=labels).loss
        loss.backward()
        engine.step()
        tokens_seen += inputs.numel()
        elapsed = time.monotonic() - start
        if step % 5 == 0 or step == args.steps:
            progress(step, args.steps, loss.item(), tokens_seen / elapsed,
                     elapsed)
    print()
    after = [answer(model, p, args.digits + 1) for p, _ in samples]
    for (prompt, expected), old, new in zip(samples, before, after):
        print(f"  {prompt}  expected {expected}  before {old!r:8}  "
              f"after {new!r}")
    held_out = accuracy(model, random.Random(12345), args.digits, 200)
    print(f"held-out accuracy: {held_out:.0%} of 200 problems")
    if args.then:
        print(f"\n$ {args.then}")
        sys.stdout.flush()
        subprocess.run(args.then, shell=True, check=False)
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
