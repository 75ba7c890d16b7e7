"""A job's settings are judged once, by liblohan_client with the rules lohand
runs (spec/model_spec_checks.h): lohan.init refuses a value there, naming its
own option, before it connects; a spec sent through the low-level client is
refused in the process (the error names the ModelSpec field) and never
reaches lohand; values torch takes and the old plugin checks refused (eps=0)
are accepted."""

from __future__ import annotations

import math

import pytest
import torch

from lohan.client import Client, LohanError, StatusCode
from lohan.options import EngineOptions
from test_engine import tiny_gpt


@pytest.mark.parametrize("option, value, field", [
    ("lr", -1.0, "adam.lr"),
    ("lr", math.inf, "adam.lr"),
    ("betas", (0.9, 1.0), "adam.beta2"),
    ("betas", (-0.1, 0.999), "adam.beta1"),
    ("eps", -1e-8, "adam.eps"),
    ("weight_decay", math.nan, "adam.weight_decay"),
    ("max_grad_norm", math.inf, "max_grad_norm"),
    ("commit_interval", 1_000_001, "commit_interval"),
    ("durable_every", 1e9, "durable_every_seconds"),
])
def test_init_refuses_a_value_naming_its_option(option, value, field):
    import lohan
    with pytest.raises(ValueError) as error:
        lohan.init(tiny_gpt(), socket="/nonexistent", **{option: value})
    text = str(error.value)
    assert text.startswith(f"lohan.init: {option}={value!r}: "), text
    assert f"ModelSpec {field}" in text  # the core's words, as lohand's


def test_both_durability_forms_name_the_option():
    with pytest.raises(ValueError, match="durable_every=60: ModelSpec "
                       "durable_every_seconds .* by steps or by time"):
        EngineOptions(durable_every=60, commit_interval=4)


def test_the_json_check_refuses_what_is_not_a_spec():
    """lohan_model_spec_check_settings_json's bad input: NULL, text that
    is not JSON, an unknown field, a value of the wrong type; each
    INVALID_ARGUMENT with the parser's words and no field."""
    from lohan import _native
    lib = _native.library()
    cases = [(None, "spec_json is NULL"),
             (b"{not json", "is not a ModelSpec"),
             (b'{"adam": {"lr": 1e-3, "bogus": 1}}', "is not a ModelSpec"),
             (b'{"commit_interval": "many"}', "is not a ModelSpec")]
    for text, words in cases:
        status = lib.lohan_model_spec_check_settings_json(text)
        assert status == StatusCode.INVALID_ARGUMENT, text
        assert words in lib.lohan_last_error().decode(), text
        assert lib.lohan_last_error_field() == b"", text
    assert lib.lohan_model_spec_check_settings_json(
        b'{"adam": {"lr": 1e-3}, "dtype": "DTYPE_FP32"}') == StatusCode.OK


def test_eps_zero_is_accepted_as_torch_accepts_it():
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)], eps=0.0)
    assert EngineOptions(eps=0.0).eps == 0.0


def test_a_bad_spec_is_refused_in_the_process(lohand):
    """Through the low-level client: the refusal carries the field, which
    only the client's own check sets (lohand's answer over gRPC has none),
    and lohand registered nothing."""
    with Client(lohand.socket) as client:
        job = client.create_job("raw", host_pool_bytes=1 << 20)
        client.attach_job(job.id)
        with client.open_data_plane(job.id) as plane:
            with pytest.raises(LohanError) as error:
                plane.register_model(job.id, [100], eps=-1.0)
            assert error.value.code == StatusCode.INVALID_ARGUMENT
            assert error.value.field == "adam.eps"
            assert "ModelSpec adam.eps must be finite and >= 0" in (
                error.value.message)
            # eps 0 registers (torch's AdamW takes it too).
            plane.register_model(job.id, [100], eps=0.0)
        with pytest.raises(LohanError) as error:
            client.create_job_for_model(
                "sized", {"layer_elements": [100], "dtype": "DTYPE_FP32",
                          "adam": {"beta1": 1.5}})
        assert error.value.field == "adam.beta1"
        assert [j.name for j in client.jobs()] == ["raw"]
