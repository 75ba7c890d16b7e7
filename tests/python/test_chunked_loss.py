"""The chunked loss (lohan/chunked_loss.py, lohan/causal_lm.py) against the
model's own: the same loss and gradients with at most one chunk's logits,
for GPT-2, Llama and OPT shapes from configs, with ignored and padded
labels, Trainer's num_items_in_batch and given shift_labels. lohan
training through it against torch AdamW: test_chunked_loss_spread.py.

Tolerances: one chunk's loss and every gradient are the model's own, bit
for bit (the same products, and the logits' gradient made by torch's own
log-softmax backward kernel, fed nll's gradient); several chunks add the
loss in another order (1e-6 relative) and the head's weight gradient in
fp32 per chunk, rounded once: the head's gradients are within what any
two correct roundings of the same sums can differ by (_rounding_bounds:
how far depends on the CPU's GEMM kernels, not on lohan), and the model's,
after backward through the blocks, by the suite's tolerances
(GRAD_RTOL).
"""

from __future__ import annotations

import copy
import warnings
from typing import Dict, List

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lohan import causal_lm
from lohan.chunked_loss import (chunk_tokens_for, default_chunk_tokens,
                                linear_cross_entropy, working_bytes)
from lohan.options import EngineOptions
from test_engine import engine_for

transformers = pytest.importorskip("transformers")

VOCAB = 100
# A model's parameters' gradients through the chunked loss against the
# model's own, relative to the largest of each (the suite's fp32 weight
# tolerance; bf16's for masters).
GRAD_RTOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _rows(dtype: torch.dtype, bias: bool):
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, dtype=dtype, requires_grad=True)
    head = nn.Linear(16, VOCAB, bias=bias).to(dtype)
    targets = torch.randint(0, VOCAB, (37,))
    targets[::5] = -100
    return hidden, head, targets


def _grads(*tensors: torch.Tensor) -> List[torch.Tensor]:
    grads = [t.grad.clone() for t in tensors]
    for t in tensors:
        t.grad = None
    return grads


def _rounding_bounds(hidden: torch.Tensor, head: nn.Linear,
                     targets: torch.Tensor) -> List[torch.Tensor]:
    """Per gradient (hidden's, the head's weight and bias), elementwise,
    the most two correct computations of it in the dtype can differ by,
    whatever order and blocking their sums take (Higham's bound: a sum of n
    products in fp32 is within gamma_n = n u / (1 - n u) of the sum of
    their magnitudes, u = eps / 2, for each; both within it of the exact
    value): 2 gamma_n |dL/dlogits| @ |operand|, n the sum's length, with
    16-bit operands' roundings of dL/dlogits (a 16-bit ulp) and of the
    result (the dtype's ulp of it) added. Magnitudes in float64."""
    h = hidden.detach().double()
    w = head.weight.detach().double()
    logits = h @ w.T
    if head.bias is not None:
        logits = logits + head.bias.detach().double()
    counted = targets != -100
    dlogits = torch.softmax(logits, -1)
    dlogits[counted, targets[counted]] -= 1
    dlogits = (dlogits * counted[:, None]).abs() / counted.sum()
    u32 = torch.finfo(torch.float32).eps / 2
    u = torch.finfo(hidden.dtype).eps / 2

    def bound(n: int, terms: torch.Tensor) -> torch.Tensor:
        gamma = n * u32 / (1 - n * u32)
        operand = 0.0 if hidden.dtype == torch.float32 else u
        return 2 * (gamma + operand) * terms + 2 * u * terms

    rows = hidden.shape[0]
    bounds = [bound(w.shape[0], dlogits @ w.abs()),
              bound(rows, dlogits.T @ h.abs())]
    if head.bias is not None:
        bounds.append(bound(rows, dlogits.sum(0)))
    return bounds


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_cross_entropy_equals_torch_in_one_chunk_and_in_many(
        dtype, bias):
    hidden, head, targets = _rows(dtype, bias)
    params = [hidden, head.weight] + ([head.bias] if bias else [])
    want = F.cross_entropy(head(hidden).float(), targets)
    want.backward()
    want_grads = _grads(*params)
    bounds = _rounding_bounds(hidden, head, targets)
    for chunk in (1, 6, 37, 1000):
        got = linear_cross_entropy(hidden, head.weight, head.bias, targets,
                                   chunk_tokens=chunk)
        got.backward()
        grads = _grads(*params)
        if chunk >= 37:  # one chunk: the model's arithmetic, bit for bit
            assert torch.equal(got, want)
            assert all(torch.equal(g, w) for g, w in zip(grads, want_grads))
            continue
        assert got.item() == pytest.approx(want.item(), rel=1e-6)
        for g, w, most in zip(grads, want_grads, bounds):
            assert ((g - w).double().abs() <= most).all(), chunk
    # The check can fail: the gradient of the loss without the bias.
    if bias:
        linear_cross_entropy(hidden, head.weight, None, targets).backward()
        weight_grad = _grads(*params[:2])[1]
        assert not ((weight_grad - want_grads[1]).double().abs()
                    <= bounds[1]).all()
        head.bias.grad = None


def test_linear_cross_entropy_sums_over_a_divisor_and_checks_its_input():
    hidden, head, targets = _rows(torch.float32, False)
    want = F.cross_entropy(head(hidden), targets, reduction="sum") / 11
    for divisor in (11, torch.tensor(11)):
        got = linear_cross_entropy(hidden, head.weight, None, targets,
                                   chunk_tokens=4, divisor=divisor)
        assert got.item() == pytest.approx(want.item(), rel=1e-6)
    nothing = torch.full_like(targets, -100)
    assert linear_cross_entropy(hidden, head.weight, None, nothing).isnan()
    with pytest.raises(ValueError, match="37 hidden rows but 36 targets"):
        linear_cross_entropy(hidden, head.weight, None, targets[1:])
    for chunk in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="chunk_tokens="):
            linear_cross_entropy(hidden, head.weight, None, targets,
                                 chunk_tokens=chunk)


def test_the_default_chunk_holds_256_mib_of_fp32_logits():
    """Rounded down to a multiple of 8 tokens (1,335 and 523 before), at
    least 8 (plan/model_counts.h DefaultLossChunkTokens: the same cases in
    model_counts_test.cc)."""
    assert default_chunk_tokens(50257) == 1328
    assert default_chunk_tokens(128256) == 520
    assert default_chunk_tokens(8192) == 8192
    assert default_chunk_tokens(50257) * 50257 * 4 <= 256 << 20
    assert default_chunk_tokens(1 << 40) == 8
    # Every token in one chunk when that holds no more than chunks with
    # the head's fp32 accumulator (LossChunkTokensFor).
    assert chunk_tokens_for(1024, 50257, 5120) == 1024
    assert chunk_tokens_for(65536, 50257, 5120) == 1328
    assert chunk_tokens_for(2048, 128256, 16384) == 2048
    assert chunk_tokens_for(65536, 128256, 16384) == 520


@pytest.mark.skipif(not torch.backends.mkl.is_available(),
                    reason="measured for MKL's GEMM")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunks_of_multiples_of_8_rows_give_the_models_row_gradients(dtype):
    """Every head product over a multiple of 8 rows, the last chunk's
    too (37 tokens: chunks of 8 end in 5 rows, made over 8): each hidden
    state's gradient is the model's bit for bit. (What that avoids depends
    on the CPU's MKL kernels: on an AVX-512 AMD EPYC a row of a 5-row fp32
    product rounded differently from the model's 37-row one; on an Intel
    Xeon with AVX-512 FP16 it did not.)"""
    hidden, head, targets = _rows(dtype, True)
    F.cross_entropy(head(hidden).float(), targets).backward()
    want = _grads(hidden, head.weight, head.bias)[0]
    for chunk in (8, 16, 32):
        linear_cross_entropy(hidden, head.weight, head.bias, targets,
                             chunk_tokens=chunk).backward()
        assert torch.equal(_grads(hidden, head.weight, head.bias)[0], want), (
            chunk)


# ------------------------------------------------- Hugging Face causal LMs


def _model(kind: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    elif kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=32))
    elif kind == "opt":
        model = transformers.OPTForCausalLM(transformers.OPTConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
            ffn_dim=64, num_attention_heads=2, max_position_embeddings=32,
            word_embed_proj_dim=32, dropout=0.0, pad_token_id=1))
    else:  # gemma2: soft-caps its logits after the head
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, max_position_embeddings=32))
    return model.to(dtype)


def _batch() -> Dict[str, torch.Tensor]:
    """Two sequences of 12, the second padded on the right by 4 (label
    -100, attention mask 0) and one more label ignored."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(2, VOCAB, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    labels = ids.clone()
    labels[1, 8:] = -100
    labels[0, 3] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _loss_and_grads(model: nn.Module, **extra: object):
    out = model(**_batch(), **extra)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out, grads


@pytest.mark.parametrize("kind", ["gpt2", "llama", "opt"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("extra", [
    {}, {"num_items_in_batch": torch.tensor(30)}, "shift_labels"])
def test_hugging_face_loss_and_gradients_equal_the_models_own(
        kind, dtype, extra):
    if extra == "shift_labels":  # given pre-shifted, as Trainer may
        labels = _batch()["labels"]
        extra = {"shift_labels": F.pad(labels, (0, 1), value=-100)[:, 1:]
                 .contiguous()}
    reference = _model(kind, dtype)
    model = copy.deepcopy(reference)
    want, want_grads = _loss_and_grads(reference, **extra)
    assert want.logits is not None
    for chunk in (5, 24):  # several chunks; one chunk of every token
        installed = causal_lm.install(model, True, chunk)
        got, got_grads = _loss_and_grads(model, **extra)
        installed.uninstall()
        assert got.logits is None  # none were made
        if chunk == 24:
            assert torch.equal(got.loss, want.loss)
            for name, want_grad in want_grads.items():
                assert torch.equal(got_grads[name], want_grad), name
            continue
        assert got.loss.item() == pytest.approx(want.loss.item(), rel=1e-6)
        rtol = GRAD_RTOL[dtype]
        for name, want_grad in want_grads.items():
            if name.endswith("k_proj.bias"):
                continue  # true gradient 0: rounding noise (test_engine.py)
            error = (got_grads[name] - want_grad).abs().max()
            assert error <= rtol * want_grad.abs().max(), (
                name, chunk, error.item())
    assert "forward" not in vars(model)  # uninstalled


def test_without_labels_or_outside_training_the_forward_is_the_models():
    reference = _model("gpt2")
    model = copy.deepcopy(reference)
    installed = causal_lm.install(model, True, 5)
    batch = _batch()
    no_labels = {k: v for k, v in batch.items() if k != "labels"}
    assert torch.equal(model(**no_labels).logits,
                       reference(**no_labels).logits)
    with torch.no_grad():
        got = model(**batch)
    assert torch.equal(got.logits, reference(**batch).logits)
    model.eval()
    reference.eval()
    got = model(**batch)
    assert torch.equal(got.logits, reference(**batch).logits)
    got = model(**batch, return_dict=False)
    assert torch.equal(got[1], reference(**batch).logits)
    installed.uninstall()


def test_a_model_that_changes_its_logits_keeps_its_loss_and_says_so_once():
    model = _model("gemma2")
    reference = copy.deepcopy(model)
    with pytest.warns(UserWarning, match="Gemma2ForCausalLM .model type "
                      "'gemma2'. is not known to end in a plain linear"):
        installed = causal_lm.install(model, True, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            assert torch.equal(model(**_batch()).loss,
                               reference(**_batch()).loss)
    installed.uninstall()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # chunked_loss=False: nothing said
        causal_lm.install(model, False, None).uninstall()


def test_a_forward_set_over_ours_stays_and_ours_passes_through():
    """A wrapper set on the model after the engine's (accelerate's
    autocast one, say) stays when the engine closes; the chunked loss
    inside it is off from then on."""
    model = _model("gpt2")
    reference = copy.deepcopy(model)
    installed = causal_lm.install(model, True, 5)
    ours = model.forward
    model.forward = lambda *args, **kwargs: ours(*args, **kwargs)
    wrapper = model.forward
    assert model(**_batch()).logits is None  # chunked, through the wrapper
    installed.uninstall()
    assert model.forward is wrapper
    assert torch.equal(model(**_batch()).logits,
                       reference(**_batch()).logits)


def test_a_plain_module_is_left_alone():
    model = nn.Sequential(nn.Linear(4, 4))
    causal_lm.install(model, True, None).uninstall()
    assert "forward" not in vars(model)


@pytest.mark.parametrize("value", [0, -3, 1.5, True, "64"])
def test_bad_chunk_sizes_are_refused_naming_the_option(value):
    with pytest.raises(ValueError, match="loss_chunk_tokens="):
        EngineOptions(loss_chunk_tokens=value)


def test_chunked_loss_must_be_a_bool():
    with pytest.raises(TypeError, match="chunked_loss must be True or False"):
        EngineOptions(chunked_loss="yes")


def test_lohan_init_can_turn_it_off(lohand):
    model = _model("gpt2")
    with engine_for(model, lohand, chunked_loss=False,
                    job_name="chunked-off"):
        assert model(**_batch()).logits is not None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_under_autocast_backward_takes_the_forwards_products(dtype):
    """Trainer's fp16/bf16 (autocast over fp32 weights): backward, outside
    autocast, makes its products in autocast's dtype as the model's own
    backward does, so a scaled gradient overflows where the model's does
    (a skipped step and a halved scale, not a silently kept one)."""
    hidden, head, targets = _rows(torch.float32, True)
    params = [hidden, head.weight, head.bias]
    for scale in (1.0, 1e9):
        with torch.autocast("cpu", dtype=dtype):
            want = F.cross_entropy(head(hidden).float(), targets)
        (want * scale).backward()
        want_grads = _grads(*params)
        with torch.autocast("cpu", dtype=dtype):
            got = linear_cross_entropy(hidden, head.weight, head.bias,
                                       targets, chunk_tokens=6)
        (got * scale).backward()
        got_grads = _grads(*params)
        assert got.item() == pytest.approx(want.item(), rel=1e-6)
        for g, w in zip(got_grads, want_grads):
            assert g.dtype == w.dtype == torch.float32
            assert torch.isfinite(g).all() == torch.isfinite(w).all(), scale
            if scale == 1.0:
                assert (g - w).abs().max() <= (
                    4 * torch.finfo(dtype).eps * w.abs().max())
    assert not torch.isfinite(w).all() or dtype == torch.bfloat16


def test_an_auto_plan_counts_what_the_chunked_loss_holds(lohand,
                                                         monkeypatch):
    """activations="auto": the profile's saved tensors do not show a
    chunk's logits or the accumulator (they never outlive the loss); the
    request to lohand's planner adds them to what the loss holds."""
    from lohan.client import Client
    from test_plan_job import wait_for_profile
    sent = []
    ask = Client.plan_job

    def recorded(self, job_id, request):
        sent.append(request)
        return ask(self, job_id, request)

    monkeypatch.setattr(Client, "plan_job", recorded)
    with Client(lohand.socket) as client:
        wait_for_profile(client)
    model = _model("gpt2")
    with engine_for(model, lohand, activations="auto", loss_chunk_tokens=5,
                    job_name="chunked-auto") as engine:
        for _ in range(3):
            engine.backward(model(**_batch()).loss)
            engine.step()
        # 24 tokens (2 x 12) in chunks of 5, a 100 x 32 head.
        expected = working_bytes(5, 24, VOCAB, 32)
        assert expected == 4 * VOCAB * 32 + 5 * VOCAB * 2 + 2 * VOCAB * 32
        assert engine._loss.working_bytes == expected
    assert sent, "no plan was asked for"
    assert int(sent[0]["profile"]["outsideSavedBytes"]) >= expected
