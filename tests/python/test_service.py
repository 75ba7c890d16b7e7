"""The daemon's service order through the plugin: service="lanes" (the
default: fetches and activation gets beside the SSD writes of streamed
gradients and activation puts) against "in-order" (every request in
arrival order on one thread). Both must give the same losses and weights
bit for bit with streamed buffers, offloaded parameters and activations
spilled to the SSDs, where the lanes really run side by side."""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest
import torch

from test_engine import batches, engine_for, lm_loss, tiny_gpt

Run = Tuple[List[float], Dict[str, torch.Tensor]]


def run(lohand, service: str, data: torch.Tensor, name: str) -> Run:
    model = tiny_gpt().to(torch.bfloat16)
    with engine_for(model, lohand, max_grad_norm=1.0, params="offload",
                    buffers="streamed", stream_buffers=1,
                    activations="offload", activation_host_bytes=0,
                    activation_buffer_bytes=2 * 4096, service=service,
                    job_name=name) as engine:
        losses = []
        for ids in data[:, 0]:
            loss = lm_loss(model, ids)
            engine.backward(loss)
            losses.append(loss.item())
            engine.step()
        stats = engine.activation_stats
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert stats.ssd_puts > 0  # the activations did go through the daemon
    return losses, weights


def test_lanes_and_in_order_service_give_the_same_bits(lohand):
    data = batches(4, micro=1)
    lanes = run(lohand, "lanes", data, "service-lanes")
    in_order = run(lohand, "in-order", data, "service-in-order")
    assert lanes[0] == in_order[0]
    for name, weight in lanes[1].items():
        assert torch.equal(weight, in_order[1][name]), name


def test_an_unknown_service_is_refused_by_name(lohand):
    with pytest.raises(ValueError, match="service='fifo'"):
        engine_for(tiny_gpt(), lohand, service="fifo")
