"""The device's working set `lohanctl plan` predicts, measured on the CPU:
the bytes of every tensor the model and the loss make (live_bytes.py),
phase by phase, against the plan's parts (`device_working_set` in its
JSON: a block's backward, the loss), within 10%.

A GPT-2 shape in bf16 with fused attention (sdpa) and a one-op GELU, as
the planner counts a GPT block, and a Llama shape (grouped-query
attention); batch 4 x 512, vocabulary 8192.
- A block's backward as the plugin runs it (activations="offload"): its
  input brought back and the gradient coming in, the forward made again,
  then backward (its weights' gradients, every saved tensor, the
  gradients backward makes); whole, or a sublayer at a time
  (recompute_unit="sublayer"), and a device bound the whole block passes
  and the sublayers keep.
- The loss: the head's input and its gradient, and the logits: every
  token's (the model's own loss) or one chunk's with the head's fp32
  gradient accumulator (lohan's chunked loss), plus the head's gradient
  (the plan's `always` part holds it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest
import torch
import torch.nn.functional as F

from conftest import built
from live_bytes import LiveBytes
from lohan.chunked_loss import linear_cross_entropy
from lohan.sublayers import one_at_a_time, sublayers

transformers = pytest.importorskip("transformers")

BATCH, SEQ, HIDDEN, HEADS, VOCAB = 4, 512, 256, 4, 8192
TOLERANCE = 0.10


def _config() -> Any:
    config = transformers.GPT2Config(
        n_embd=HIDDEN, n_head=HEADS, n_layer=2, vocab_size=VOCAB,
        n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        activation_function="gelu_pytorch_tanh")
    config._attn_implementation = "sdpa"
    return config


def _planned(tmp_path: Path, *args: str, device: str = "4GiB",
             config: Any = None, batch: int = BATCH,
             seq: int = SEQ) -> Dict[str, Any]:
    """lohanctl plan's parts for `config` (default _config()) at batch x
    seq on a device of `device`."""
    path = tmp_path / "config.json"
    path.write_text((config or _config()).to_json_string())
    result = subprocess.run(
        [str(built("client/ctl/lohanctl")), "plan", "--model", str(path),
         "--batch", str(batch), "--seq", str(seq), "--json",
         "--device-memory", device, "--device-tflops", "1", "--h2d-gbps",
         "1", "--d2h-gbps", "1", "--host-memory", "8GiB", "--ssds", "1",
         "--ssd-read-gbps", "1", "--ssd-write-gbps", "1", *args],
        capture_output=True, text=True, check=True)
    plan = json.loads(result.stdout)["plans"][0]
    return {**plan["device_working_set"],
            **{key: plan[key] for key in (
                "loss_chunk_tokens", "recompute_unit",
                "block_unit_working_bytes", "param_unit",
                "block_weights_working_bytes")}}


def _close(measured: int, predicted: int) -> None:
    assert abs(measured - predicted) <= TOLERANCE * predicted, (
        measured, predicted, measured / predicted)


def _llama_config() -> Any:
    config = transformers.LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=688, num_attention_heads=HEADS,
        num_key_value_heads=2, num_hidden_layers=2, vocab_size=VOCAB,
        max_position_embeddings=SEQ)
    config._attn_implementation = "sdpa"
    return config


def _block_backward(unit: str, family: str = "gpt2") -> int:
    """The peak bytes of a block's backward as the plugin runs it with
    `unit` (the forward made again, then backward)."""
    torch.manual_seed(0)
    if family == "gpt2":
        block = transformers.models.gpt2.modeling_gpt2.GPT2Block(_config())
        extra: Dict[str, Any] = {}
    else:
        model = transformers.LlamaForCausalLM(_llama_config())
        block = model.model.layers[0]
        positions = torch.arange(SEQ).expand(BATCH, SEQ)
        extra = {"position_ids": positions, "position_embeddings":
                 model.model.rotary_emb(torch.empty(0, dtype=torch.bfloat16),
                                        positions)}
    block = block.to(torch.bfloat16)
    forward = (one_at_a_time(block.forward, sublayers(block))
               if unit == "sublayer"
               else block.forward)
    with LiveBytes() as live:
        given = torch.randn(BATCH, SEQ, HIDDEN, dtype=torch.bfloat16)
        given.requires_grad_()
        coming_in = torch.randn_like(given)
        output = forward(given, **extra)
        output = output[0] if isinstance(output, tuple) else output
        output.backward(coming_in)
    return live.peak


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("unit", ["block", "sublayer"])
def test_a_blocks_backward_is_what_the_plan_counts(tmp_path, unit, family):
    """Llama's as Hugging Face runs it: RMSNorm in fp32 operators, SwiGLU
    in three (plan/ counts what they keep)."""
    config = _config() if family == "gpt2" else _llama_config()
    planned = _planned(tmp_path, "--recompute-unit", unit, config=config)
    assert planned["recompute_unit"] == unit
    _close(_block_backward(unit, family), planned["block_backward"])


def test_a_block_over_the_bound_fits_it_a_sublayer_at_a_time(tmp_path):
    """A device bound between the two: the whole block's backward passes
    it, measured and planned, and a sublayer at a time stays under it; the
    plan given that device chooses the sublayer."""
    whole = _planned(tmp_path, "--recompute-unit", "block")
    parts = _planned(tmp_path, "--recompute-unit", "sublayer")
    bound = (whole["block_backward"] + parts["block_backward"]) // 2
    assert _block_backward("block") > bound
    assert _block_backward("sublayer") < bound
    device = whole["always"] + bound
    # Small chunks: the loss stays under the bound too.
    chosen = _planned(tmp_path, "--loss-chunk-tokens", "64",
                      device=str(device))
    assert chosen["recompute_unit"] == "sublayer"
    assert chosen["block_unit_working_bytes"] > device


@pytest.mark.parametrize("chunk", [None, 512, 64, "full"])
def test_the_loss_is_what_the_plan_counts(tmp_path, chunk):
    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).to(torch.bfloat16)
    targets = torch.randint(0, VOCAB, (BATCH, SEQ))
    with LiveBytes() as live:
        hidden = torch.randn(BATCH, SEQ, HIDDEN, dtype=torch.bfloat16)
        hidden.requires_grad_()
        if chunk == "full":
            logits = F.linear(hidden, head.weight).float()
            loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
            del logits
        else:
            loss = linear_cross_entropy(hidden, head.weight, None, targets,
                                        chunk_tokens=chunk)
        loss.backward()
    args = (["--full-logits"] if chunk == "full" else
            ["--loss-chunk-tokens", str(chunk)] if chunk else [])
    planned = _planned(tmp_path, *args)
    assert planned["loss_chunk_tokens"] == (
        0 if chunk == "full" else chunk or BATCH * SEQ)  # 8,192 by default
    head_gradient = 2 * VOCAB * HIDDEN
    _close(live.peak, planned["loss"] + head_gradient)


def test_the_measure_sees_what_is_made_and_freed():
    with LiveBytes() as live:
        kept = torch.empty(1 << 20, dtype=torch.uint8)
        torch.empty(3 << 20, dtype=torch.uint8)  # made and dropped
        view = kept[: 1 << 10]
    assert live.peak == 4 << 20
    assert live.now == 1 << 20
    del kept, view
    assert live.now == 0
