"""The model a job trains, as lohand's ModelSpec (proto/lohan.proto): the
one description the plugin sends, to size the job's arena
(Client.create_job_for_model) and to register the model
(DataPlane.register_model). Field by field the proto's, in Python's terms;
`to_proto` is the only translation."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

Range = Tuple[int, int, int]  # layer, begin, end: elements [begin, end)
Group = Tuple[float, float, Sequence[Range]]  # lr_scale, weight_decay, ranges

DTYPES = {"fp32": "DTYPE_FP32", "bf16": "DTYPE_BF16", "fp16": "DTYPE_FP16"}
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
CLIP_SCHEDULES = {"deferred": "CLIP_SCHEDULE_DEFERRED",
                  "redo-all": "CLIP_SCHEDULE_REDO_ALL"}


@dataclass(frozen=True)
class ModelSpec:
    """See ModelSpec in proto/lohan.proto for each field; lohan_client.h's
    lohan_model_spec says the same for C.

    `grad_slots` / `weight_slots` = K in 1..layers-1 stream gradients /
    16-bit weights through the daemon's SSDs with K shared arena buffers
    (layer i's is buffer i % K); 0 keeps one buffer per layer.
    `fit_arena`: one buffer per layer if the arena holds it, else the most
    shared buffers up to grad_slots (= weight_slots) that it holds
    (ARENA_FIT_MOST; at job creation, the arena is sized so).

    `initial_iteration`: for a job without states yet, the iteration it
    starts at (its first update is Adam step initial_iteration + 1), to
    restore a checkpoint with init_weights and init_state; a job with
    states refuses another nonzero value (FAILED_PRECONDITION).
    `revert_last_commit`: the job goes back to the commit before its last
    one, which a data-parallel rank's job keeps until its next step
    begins (Model.previous_commit_kept), before it opens.

    `no_weight_decay`: (layer, begin, end) tuples, in any order; the
    elements [begin, end) of that layer's flat vector are updated with
    weight_decay 0 (biases and norm weights): a param group of lr_scale 1
    and weight_decay 0 named "no_weight_decay". `param_groups`:
    (lr_scale, weight_decay, ranges) per group: those elements are updated
    with lr x lr_scale and that weight decay (torch's param groups); no
    element in two groups (INVALID_ARGUMENT naming the ranges).

    `overlap_updates`: this client fetches every layer (fetch_params,
    also with resident weight buffers, where it only waits) before it
    uses the layer's new weights; iter_end then returns once the norm
    has decided the iteration, and its last updates run in forward
    order during the next forward.

    `clip_schedule`: "deferred" (one pass over the states when the
    iteration clips) or "redo-all" (eager updates redone when it clips,
    for comparison); `in_order_service`: every request served in arrival
    order on one daemon thread (for comparison). The same results either
    way."""

    layer_elements: Sequence[int]
    dtype: str = "fp32"
    lr: float = 1e-3
    betas: Tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    adamw: bool = True
    amsgrad: bool = False
    bf16_moments: bool = False
    bias_correction: bool = True
    max_grad_norm: float = 0.0
    skip_nonfinite: bool = True
    chunk_elements: int = 0
    activation_bytes: int = 0
    grad_slots: int = 0
    weight_slots: int = 0
    fit_arena: bool = False
    initial_iteration: int = 0
    no_weight_decay: Sequence[Range] = ()
    param_groups: Sequence[Group] = ()
    overlap_updates: bool = False
    clip_schedule: str = "deferred"
    in_order_service: bool = False
    revert_last_commit: bool = False
    commit_interval: int = 0
    durable_every_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not supported; use one "
                             f"of {sorted(DTYPES)}")
        if self.clip_schedule not in CLIP_SCHEDULES:
            raise ValueError(f"clip_schedule {self.clip_schedule!r} is not "
                             f"one of {sorted(CLIP_SCHEDULES)}")
        if self.initial_iteration < 0:
            raise ValueError(f"initial_iteration must be >= 0, got "
                             f"{self.initial_iteration}")
        _ranges(self.no_weight_decay, "no_weight_decay")
        for n, (_, _, ranges) in enumerate(self.param_groups):
            _ranges(ranges, f"param_groups[{n}]")

    @property
    def element_bytes(self) -> int:
        """Bytes of a gradient (and a 16-bit weight) element."""
        return ELEMENT_BYTES[self.dtype]

    def to_proto(self) -> Dict[str, Any]:
        """The ModelSpec message as protobuf JSON's object."""
        groups: List[Dict[str, Any]] = []
        if self.no_weight_decay:
            groups.append({"name": "no_weight_decay", "lr_scale": 1.0,
                           "weight_decay": 0.0,
                           "ranges": _ranges(self.no_weight_decay,
                                             "no_weight_decay")})
        for n, (scale, decay, ranges) in enumerate(self.param_groups):
            name = f"param_groups[{n}]"
            groups.append({"name": name, "lr_scale": float(scale),
                           "weight_decay": float(decay),
                           "ranges": _ranges(ranges, name)})
        return {
            "layer_elements": [int(n) for n in self.layer_elements],
            "dtype": DTYPES[self.dtype],
            "adam": {"lr": float(self.lr), "beta1": float(self.betas[0]),
                     "beta2": float(self.betas[1]), "eps": float(self.eps),
                     "weight_decay": float(self.weight_decay),
                     "decoupled_weight_decay": bool(self.adamw),
                     "amsgrad": bool(self.amsgrad),
                     "bf16_moments": bool(self.bf16_moments),
                     "no_bias_correction": not self.bias_correction},
            "max_grad_norm": float(self.max_grad_norm),
            "skip_nonfinite": bool(self.skip_nonfinite),
            "chunk_elements": int(self.chunk_elements),
            "activation_bytes": int(self.activation_bytes),
            "grad_slots": int(self.grad_slots),
            "weight_slots": int(self.weight_slots),
            "arena_fit": ("ARENA_FIT_MOST" if self.fit_arena
                          else "ARENA_FIT_AS_GIVEN"),
            "initial_iteration": int(self.initial_iteration),
            "param_groups": groups,
            "overlap_updates": bool(self.overlap_updates),
            "clip_schedule": CLIP_SCHEDULES[self.clip_schedule],
            "in_order_service": bool(self.in_order_service),
            "revert_last_commit": bool(self.revert_last_commit),
            "commit_interval": int(self.commit_interval),
            "durable_every_seconds": float(self.durable_every_seconds),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_proto())


def _ranges(ranges: Sequence[Range], what: str) -> List[Dict[str, int]]:
    """ElementRange objects; ValueError for a negative value (the daemon
    checks the rest, naming the range)."""
    out: List[Dict[str, int]] = []
    for entry in ranges:
        layer, begin, end = entry
        for value in (layer, begin, end):
            if int(value) < 0:
                raise ValueError(f"{what} range {tuple(entry)} has a "
                                 "negative value")
        out.append({"layer": int(layer), "begin": int(begin),
                    "end": int(end)})
    return out
