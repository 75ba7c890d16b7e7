"""The client's profile (profile.py, recompute.py) without a daemon: what
a block saves, what each saved tensor costs to make again, and the device
and link rates, measured on this machine's CPU."""
from typing import List

import pytest
import torch

import lohan.activations
from lohan.activation_store import ActivationStore
from lohan.profile import (ModelSizes, Profiler, measure_link,
                           profile_message)
from lohan.planned import planned_forward
from test_engine import BATCH, DIM, SEQ, VOCAB, batches, lm_loss, tiny_gpt

MIN_BYTES = 1024


def _profiled(model: torch.nn.Module, loss_of) -> Profiler:
    profiler = Profiler(torch.device("cpu"), lambda: MIN_BYTES)
    store = ActivationStore(None)
    undo = lohan.activations.install(model, list(model.blocks), "offload",
                                     store, observer=lambda: profiler)
    profiler.started()
    with profiler.model_forward(model):
        loss = loss_of(model)
    loss.backward()
    profiler.finish()
    undo()
    return profiler


@pytest.fixture
def profiler() -> Profiler:
    model = tiny_gpt()
    return _profiled(model, lambda m: lm_loss(m, batches(1)[0, 0]))


def test_profile_measures_each_saved_tensor_and_its_cost(profiler):
    tokens = BATCH * SEQ
    names = [t.name for t in profiler.tensors]
    # The first saved tensor is the block's input (layer norm saves it):
    # backward does not have it, so it is never recomputed.
    assert profiler.tensors[0].always_offloaded
    assert profiler.tensors[0].bytes == tokens * DIM * 4
    # q, k and v: views of one product, one storage: one entry, that
    # product's bytes, made again by that product once.
    qkv = [t for t in profiler.tensors if t.name == "aten.transpose"]
    assert len(qkv) == 1
    assert qkv[0].bytes == tokens * 3 * DIM * 4
    product = 2 * tokens * DIM * 3 * DIM
    assert product <= qkv[0].recompute_flops < 2 * product
    assert not qkv[0].always_offloaded
    # The block's forward FLOPs: its four products and attention at least.
    products = 2 * tokens * DIM * (3 * DIM + DIM + 4 * DIM + 4 * DIM)
    assert profiler.block_flops >= products
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in names
    # Outside the blocks: the head's product, and the logits saved.
    assert profiler.outside_flops >= 2 * tokens * DIM * VOCAB
    assert profiler.outside_saved_bytes >= tokens * VOCAB * 4
    assert len(profiler.times.forward) == 3
    assert len(profiler.times.backward) == 2  # the recorded one left out


def test_profile_counts_what_a_planned_block_decides(profiler):
    """The plan's decisions are by position among the candidates'
    storages: a planned block stores tensors over exactly the storages the
    profile listed, in order."""
    model = tiny_gpt()
    packed: List[int] = []
    seen = set()

    class CountingStore(ActivationStore):
        def put(self, tensor, to_ssd=False):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                packed.append(storage.nbytes())
            return super().put(tensor, to_ssd)

    block = model.blocks[0]
    forward = planned_forward(block.forward, CountingStore(None), block,
                              ["host"] * len(profiler.tensors), MIN_BYTES,
                              lambda a, k: (a, k))
    x = torch.randn(BATCH, SEQ, DIM, requires_grad=True)
    forward(x).sum().backward()
    assert packed == [t.bytes for t in profiler.tensors]


def _gpt2_profile(dropout: float) -> Profiler:
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout))
    model.blocks = model.transformer.h
    ids = batches(1)[0, 0]
    return _profiled(model, lambda m: lm_loss(m, ids))


def test_random_operators_are_never_run_again():
    """GPT-2's three dropouts in a block (attention, and after attention
    and the MLP): each saved mask is never recomputed; without dropout
    only the block's input is."""
    without = _gpt2_profile(0.0)
    assert [t.always_offloaded for t in without.tensors].count(True) == 1
    dropped = _gpt2_profile(0.1)
    assert [t.always_offloaded for t in dropped.tensors].count(True) == 4


def test_the_profile_message_carries_the_plan_request(profiler):
    message = profile_message(profiler, ModelSizes(3, 10, 2, 4, 1, 3),
                              torch.device("cpu"))
    assert message["deviceIsHost"] is True
    assert message["deviceFlops"] > 0
    assert message["hostToDeviceBytesPerSecond"] > 0
    assert message["deviceToHostBytesPerSecond"] > 0
    assert len(message["blockTensors"]) == len(profiler.tensors)
    assert message["forwardFlops"] == pytest.approx(
        profiler.outside_flops + 3 * profiler.block_flops)
    assert (message["batch"], message["seq"]) == (str(BATCH), str(SEQ))


def test_link_probe_measures_both_directions():
    rates = measure_link(torch.device("cpu"), nbytes=1 << 20)
    assert rates["h2d"] > 0 and rates["d2h"] > 0
