"""recompute_unit="sublayer" (lohan/sublayers.py): a recomputed block's
backward one attention or MLP at a time. Which children are sublayers in
each family, the same gradients as the whole block's recompute (bit for
bit, dropout on), training through lohan equal to torch AdamW, and the
option's refusal. The memory it saves is test_working_set.py's."""

from __future__ import annotations

import pytest
import torch

import lohan
import lohan.sublayers

from lohan.activation_store import ActivationStore
from lohan.activations import install
from lohan.options import EngineOptions
from lohan.sublayers import sublayers
from test_engine import _hf_matches_torch

transformers = pytest.importorskip("transformers")


def _gpt2(**overrides: object):
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
        **overrides))


def _llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        max_position_embeddings=32))


def test_the_sublayers_of_each_family():
    gpt2 = _gpt2().transformer.h[0]
    assert sublayers(gpt2) == [gpt2.attn, gpt2.mlp]
    llama = _llama().model.layers[0]
    assert sublayers(llama) == [llama.self_attn, llama.mlp]
    opt = transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
        num_attention_heads=2, max_position_embeddings=32,
        word_embed_proj_dim=32)).model.decoder.layers[0]
    # fc1 and fc2 are lone Linears: each saves only its input.
    assert sublayers(opt) == [opt.self_attn]
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1,
        num_heads=2)).encoder.block[0]
    assert sublayers(t5) == []  # one child (a ModuleList) holds it all


@pytest.mark.parametrize("mode", ["recompute", "offload"])
def test_a_sublayer_at_a_time_gives_the_blocks_gradients(mode):
    """Dropout on: each sublayer's recompute draws the same masks."""
    whole, parts = _gpt2(), _gpt2()
    parts.load_state_dict(whole.state_dict())
    store = None
    if mode == "offload":
        store = ActivationStore(None)
    undo = [install(whole, list(whole.transformer.h), mode, store),
            install(parts, list(parts.transformer.h), mode, store,
                    unit="sublayer")]
    ids = torch.randint(0, 100, (2, 24),
                        generator=torch.Generator().manual_seed(1))
    for model in (whole, parts):
        torch.manual_seed(7)
        model(input_ids=ids, labels=ids).loss.backward()
    for (name, p), (_, q) in zip(whole.named_parameters(),
                                 parts.named_parameters()):
        assert torch.equal(p.grad, q.grad), name
    # The check can fail: another dropout draw changes them.
    torch.manual_seed(8)
    parts.zero_grad()
    parts(input_ids=ids, labels=ids).loss.backward()
    assert not torch.equal(parts.transformer.h[0].attn.c_attn.weight.grad,
                           whole.transformer.h[0].attn.c_attn.weight.grad)
    for undo_one in undo:
        undo_one()


@pytest.mark.parametrize("kind,params", [
    ("gpt2", "resident"), ("gpt2", "offload"), ("llama", "offload")])
def test_training_a_sublayer_at_a_time_equals_torch_adamw(lohand, monkeypatch,
                                                         kind, params):
    """Offloaded parameters too, whose placeholders hide the sublayers'
    sizes: the engine finds them before it offloads (counted here)."""
    model = _gpt2() if kind == "gpt2" else _llama()
    noise = ({f"transformer.h.{i}.attn.c_attn.bias": slice(32, 64)
              for i in range(2)} if kind == "gpt2" else None)
    checkpoints = []
    original = lohan.sublayers.checkpoint
    monkeypatch.setattr(lohan.sublayers, "checkpoint",
                        lambda *a, **k: checkpoints.append(1) or original(
                            *a, **k))
    _hf_matches_torch(model, lohand, params=params, noise=noise,
                      recompute_unit="sublayer",
                      job_name=f"sublayer-{kind}-{params}")
    assert len(checkpoints) == 3 * 2 * 2  # steps x blocks x sublayers


@pytest.mark.parametrize("unit", ["layer", "", None, 2])
def test_an_unknown_unit_is_refused_naming_the_option(unit):
    with pytest.raises(ValueError, match="recompute_unit="):
        EngineOptions(recompute_unit=unit)
    with pytest.raises(ValueError, match="param_unit="):
        EngineOptions(param_unit=unit)


@pytest.mark.parametrize("activations,params", [
    ("offload", "resident"), (["offload", "keep"], "resident"),
    ("offload", "offload")])
def test_bf16_training_a_sublayer_at_a_time_is_the_blocks_bit_for_bit(
        lohand, activations, params):
    """bf16, dropout on, with a per-block plan too: the sublayers replay
    the block's operators, so lohan's steps are the whole block's, bit for
    bit (and those equal torch AdamW within the suite's bf16 tolerances,
    test_engine.py)."""
    ids = torch.randint(0, 100, (2, 24),
                        generator=torch.Generator().manual_seed(3))
    runs = []
    for unit in ("block", "sublayer"):
        model = _gpt2()
        losses = []
        with lohan.init(model, socket=lohand.socket, lr=1e-2, dtype="bf16",
                        activations=activations, params=params,
                        recompute_unit=unit,
                        job_name=f"bf16-{unit}-{params}-{len(activations)}"
                        ) as engine:
            torch.manual_seed(5)
            for _ in range(3):
                loss = model(input_ids=ids, labels=ids).loss
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
        runs.append((losses, {n: p.detach().clone()
                              for n, p in model.named_parameters()}))
    (block_losses, block_weights), (unit_losses, unit_weights) = runs
    assert unit_losses == block_losses
    for name, weight in block_weights.items():
        assert torch.equal(unit_weights[name], weight), name
    assert block_losses[-1] < block_losses[0]  # it trained
