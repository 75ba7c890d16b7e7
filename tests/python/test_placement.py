"""The activation policy a model gets when lohan.init is not told one
(placement.activation_policy): by where the model computes, and what the
other options ask for."""

from __future__ import annotations

import pytest
import torch

from lohan.options import EngineOptions
from lohan.placement import activation_policy, place
from test_engine import tiny_gpt

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize("options, device, params, want", [
    # The CPU is its own host: "offload" would only recompute.
    ({}, CPU, "resident", "keep"),
    # An accelerator's memory holds one block's intermediates.
    ({}, GPU, "resident", "offload"),
    # Offloaded weights need their blocks recomputed.
    ({}, CPU, "offload", "offload"),
    # Options that ask for the activation store or a recompute.
    ({"activation_host_bytes": 1 << 20}, CPU, "resident", "offload"),
    ({"frozen_models": True}, CPU, "resident", "offload"),
    ({"recompute_unit": "sublayer"}, CPU, "resident", "offload"),
    # Said: as said.
    ({"activations": "recompute"}, CPU, "resident", "recompute"),
    ({"activations": "offload"}, CPU, "resident", "offload"),
    ({"activations": "keep"}, GPU, "resident", "keep"),
])
def test_the_default_policy_by_device(options, device, params, want):
    assert activation_policy(EngineOptions(**options), device, params) == want


def test_a_cpu_model_keeps_its_activations_unless_told():
    model = tiny_gpt()
    assert place(model, EngineOptions()).activation_modes == ["keep"] * 3
    told = place(model, EngineOptions(activations="offload"))
    assert told.activation_modes == ["offload"] * 3
    auto = place(model, EngineOptions(activations="auto"))
    assert auto.first_activations == "offload"  # profiles, then plans
