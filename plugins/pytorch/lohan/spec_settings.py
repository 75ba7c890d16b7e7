"""lohan.init's options as the settings of lohand's ModelSpec
(proto/lohan.proto: Adam, clipping, durability, service), and their check
by liblohan_client with the rules lohand runs (spec/model_spec_checks.h),
when the options are given: the plugin maps, the core judges. A refusal
names the option it came from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict

from lohan import _native
from lohan.client import StatusCode, proto_json
from lohan.model_spec import ModelSpec

if TYPE_CHECKING:
    from lohan.options import EngineOptions

# The ModelSpec field (protobuf JSON's path, lohan_last_error_field) each
# option sets.
OPTION_OF_FIELD: Dict[str, str] = {
    "adam.lr": "lr",
    "adam.beta1": "betas",
    "adam.beta2": "betas",
    "adam.eps": "eps",
    "adam.weight_decay": "weight_decay",
    "max_grad_norm": "max_grad_norm",
    "clip_schedule": "clip_schedule",
    "commit_interval": "commit_interval",
    "durable_every_seconds": "durable_every",
}


def settings_spec(options: "EngineOptions") -> Dict[str, Any]:
    """The ModelSpec fields lohan.init's options set, as protobuf JSON's
    object, made by the one composition of a spec in this package
    (model_spec.ModelSpec.to_proto); the model's shape, dtype, buffers
    and iteration are the caller's to put in."""
    return ModelSpec(
        layer_elements=(), lr=options.lr, betas=options.betas,
        eps=options.eps, weight_decay=options.weight_decay,
        adamw=bool(options.adamw), amsgrad=bool(options.amsgrad),
        bf16_moments=bool(options.bf16_moments),
        bias_correction=options.bias_correction,
        max_grad_norm=options.max_grad_norm,
        skip_nonfinite=bool(options.skip_nonfinite),
        chunk_elements=options.chunk_elements,
        clip_schedule=options.clip_schedule,
        in_order_service=options.service == "in-order",
        commit_interval=options.commit_interval or 0,
        durable_every_seconds=float(options.durable_every or 0.0)).to_proto()


def check_settings(options: "EngineOptions") -> None:
    """ValueError naming the option whose value lohand would refuse."""
    # The dataclass's dtype (fp32) stands in for the model's, checked with
    # the model (its cut).
    spec = settings_spec(options)
    lib = _native.library()
    status = lib.lohan_model_spec_check_settings_json(proto_json(spec))
    if status == StatusCode.OK:
        return
    message = lib.lohan_last_error().decode(errors="replace")
    option = OPTION_OF_FIELD.get(lib.lohan_last_error_field().decode())
    if option is None:
        raise ValueError(f"lohan.init: {message}")
    raise ValueError(f"lohan.init: {option}={getattr(options, option)!r}: "
                     f"{message}")
