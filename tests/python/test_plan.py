"""`lohanctl plan` against the real models: the planner's counts for a
config.json are what transformers builds from it."""
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, OPTConfig, OPTForCausalLM)

from conftest import built
from lohan.blocks import find_blocks, plan_layers

MACHINE = ["--device-memory", "24GiB", "--device-tflops", "165",
           "--h2d-gbps", "25", "--d2h-gbps", "25", "--host-memory", "64GiB",
           "--ssds", "1", "--ssd-read-gbps", "2", "--ssd-write-gbps", "2"]


def plan(config: Path, *args: str) -> Any:
    result = subprocess.run(
        [str(built("client/ctl/lohanctl")), "plan", "--model", str(config),
         "--batch", "2", "--seq", "64", "--json", *MACHINE, *args],
        capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


CONFIGS = {
    "gpt2": (GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=64,
                        vocab_size=500), GPT2LMHeadModel),
    "llama-gqa": (LlamaConfig(hidden_size=256, intermediate_size=688,
                              num_attention_heads=8, num_key_value_heads=2,
                              num_hidden_layers=3, vocab_size=1000),
                  LlamaForCausalLM),
    "llama-tied": (LlamaConfig(hidden_size=256, intermediate_size=688,
                               num_attention_heads=8, num_hidden_layers=2,
                               vocab_size=1000, tie_word_embeddings=True),
                   LlamaForCausalLM),
    "opt": (OPTConfig(hidden_size=128, num_attention_heads=4,
                      num_hidden_layers=2, ffn_dim=512, vocab_size=500,
                      max_position_embeddings=64), OPTForCausalLM),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameters_are_the_models(tmp_path: Path, name: str) -> None:
    config, model_class = CONFIGS[name]
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    config.to_json_file(str(path))
    model = model_class(config)
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}
    out = plan(path)
    assert out["model"] == name
    assert out["parameters"] == sum(unique.values())
    assert out["layers"] == config.num_hidden_layers
    # The daemon's layers, as the plugin cuts the model (what the plan's
    # arena and SSD space are sized for: test_plan_memory.py).
    assert out["layer_elements"] == [
        layer.numel for layer in plan_layers(model, find_blocks(model))]


def test_a_gpt2_block_saves_at_least_what_the_planner_counts(
        tmp_path: Path) -> None:
    """The tensors autograd saves in one GPT-2 block (eager attention, no
    dropout, bf16): the planner's per-class bytes, summed, are a lower
    bound (transformers' gelu_new keeps intermediates the planner does not
    count; a fused GELU keeps only its input)."""
    config = GPT2Config(n_layer=1, n_embd=256, n_head=8, n_positions=128,
                        vocab_size=1000, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, attn_implementation="eager")
    path = tmp_path / "gpt2-block" / "config.json"
    path.parent.mkdir()
    config.to_json_file(str(path))
    model = GPT2LMHeadModel(config).to(torch.bfloat16)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    batch, seq = 2, 64
    x = torch.randn(batch, seq, 256, dtype=torch.bfloat16, requires_grad=True)
    storages: dict = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.transformer.h[0](x)
    out = plan(path, "--eager-attention")
    tensors = out["plans"][0]["tensors"]
    counted = sum(t["bytes"] for t in tensors if t["block"] == 0)
    saved = sum(storages.values())
    assert counted <= saved
    # Everything but the MLP's activation intermediates is counted.
    mlp_extra = 3 * batch * seq * 4 * 256 * 2
    assert saved - counted <= mlp_extra + 4 * batch * seq * 4  # LN stats


@pytest.mark.parametrize("args,says", [
    (["--loss-chunk-tokens", "0"], "--loss-chunk-tokens: Value 0 not in"),
    (["--loss-chunk-tokens", "-5"], "--loss-chunk-tokens"),
    (["--recompute-unit", "layer"], "--recompute-unit layer: use auto"),
    (["--param-unit", "linear"], "--param-unit linear: use auto"),
    (["--param-unit", "sublayer", "--recompute-unit", "block"],
     "need a backward a sublayer at a time"),
    (["--full-logits", "--loss-chunk-tokens", "64"],
     "--loss-chunk-tokens and --full-logits: give one"),
    # lohand's own bound (layout/durability.h), not another.
    (["--commit-interval", "1000001"],
     "--commit-interval must be from 1 (every iteration durable) to "
     "1000000, got 1000001"),
    (["--commit-interval", "0"], "--commit-interval must be from 1"),
])
def test_bad_loss_and_unit_flags_are_refused_by_name(args, says):
    result = subprocess.run(
        [str(built("client/ctl/lohanctl")), "plan", "--model", "gpt-13b",
         "--batch", "8", *MACHINE, *args], capture_output=True, text=True)
    assert result.returncode != 0
    assert result.stdout == ""  # no plan printed
    assert says in result.stderr


def test_the_loss_and_unit_flags_reach_the_plan():
    def planned(*args: str) -> Any:
        result = subprocess.run(
            [str(built("client/ctl/lohanctl")), "plan", "--model",
             "gpt-13b", "--batch", "64", "--json", *MACHINE, *args],
            capture_output=True, text=True)
        return json.loads(result.stdout)
    chunked = planned("--loss-chunk-tokens", "512")["plans"][0]
    assert chunked["loss_chunk_tokens"] == 512
    assert chunked["recompute_unit"] == "block"
    full = planned("--full-logits")
    assert full["plans"] == [] and "chunk the loss" in full["refused"][0][
        "why"]
    forced = planned("--recompute-unit", "sublayer")["plans"][0]
    assert forced["recompute_unit"] == "sublayer"
    assert forced["param_unit"] == "block"
    assert (forced["device_working_bytes"]
            < forced["block_unit_working_bytes"])
    weights = planned("--param-unit", "sublayer")["plans"][0]
    assert (weights["recompute_unit"], weights["param_unit"]) == (
        "sublayer", "sublayer")
    assert (weights["device_working_bytes"]
            < weights["block_weights_working_bytes"]
            == forced["device_working_bytes"])
