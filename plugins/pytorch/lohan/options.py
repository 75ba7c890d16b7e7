"""lohan.init's keyword options, checked: `EngineOptions(**options)`
raises the ValueError or TypeError naming the first option that is wrong.
Only what can be judged without the model is checked here; placement.py
checks the options that depend on it."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import (Callable, FrozenSet, Iterable, Mapping, Optional,
                    Sequence, Tuple, Union)

import torch
from torch import nn

from lohan.blocks import BlocksArg
from lohan.chunked_loss import check_chunk_tokens
from lohan.spec_settings import check_settings
from lohan.sublayers import check_unit

MIB = 1 << 20

# A per-block plan: one mode per block, a name or per-tensor decisions.
ActivationsArg = Union[str, Sequence[Union[str, Sequence[str]]]]
# None, "1d", a callable(name, param) -> bool, or parameter names.
NoWeightDecayArg = Union[None, str, Callable[[str, nn.Parameter], bool],
                         Iterable[str]]
# torch-style groups: {"params": [...], "lr": x, "weight_decay": y}.
ParamGroupsArg = Optional[Sequence[Mapping[str, object]]]


@dataclass(frozen=True)
class EngineOptions:
    """Every option of lohan.init, with its default (docs/pytorch.md
    explains each). lr, betas, eps and weight_decay are held as floats,
    and max_grad_norm=None (no clipping) as 0.0."""

    lr: float = 1e-3
    betas: Tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: Optional[float] = 0.0
    blocks: BlocksArg = None
    socket: Optional[str] = None
    job_name: Optional[str] = None
    dtype: Union[None, str, torch.dtype] = None
    resume: Union[bool, str, os.PathLike] = False
    # A checkpoint to take the starting weights from (a Hugging Face
    # directory, a safetensors file or an engine.save directory), read a
    # layer at a time; the model may then be built on the meta device.
    weights: Union[None, str, os.PathLike] = None
    grad_accumulation_steps: int = 1
    adamw: bool = True
    amsgrad: bool = False
    # False: Adam without its bias correction (DeepSpeed's
    # bias_correction=False; Hugging Face's legacy AdamW(correct_bias=False)).
    bias_correction: bool = True
    bf16_moments: bool = False
    no_weight_decay: NoWeightDecayArg = None
    param_groups: ParamGroupsArg = None
    device: Union[None, str, torch.device] = None
    frozen_host_bytes: Optional[int] = None
    # The arena's activation area (lohand's SSDs) even when no budget
    # asks for it: where frozen models' weights go (lohan.frozen_model:
    # a DPO reference, say).
    frozen_models: bool = False
    skip_nonfinite: bool = True
    chunk_elements: int = 0
    # None: by where the model computes (placement.activation_policy):
    # "offload" on an accelerator, "keep" on the CPU, where the host's
    # memory is the device's and "offload" would only recompute.
    activations: Optional[ActivationsArg] = None
    activation_host_bytes: Optional[int] = None
    activation_buffer_bytes: int = 16 * MIB
    device_memory_bytes: Optional[int] = None
    params: str = "auto"
    buffers: str = "auto"
    stream_buffers: int = 4
    loss_scale: Union[None, str, float] = None
    loss_scale_growth_interval: int = 2000
    initial_loss_scale: float = 2.0 ** 16
    clip_schedule: str = "deferred"
    # None (with durable_every None): lohand's default durability ([pool]
    # durable_every = "auto": a minute, or longer where the durable writes
    # would take over a tenth of the time); else every how many steps the
    # states lohand holds in RAM are committed durably (1: every step).
    commit_interval: Optional[int] = None
    # Or by time: durable once at least this many seconds passed since the
    # last durable step (what a crash of lohand may lose); not with
    # commit_interval. None: lohand's default.
    durable_every: Optional[float] = None
    # True: step() returns once the norm has decided the step; each block
    # takes its new weights just before it next runs (lazy_weights.py), so
    # the updates overlap the next forward.
    overlap_step: bool = True
    # A Hugging Face causal LM's loss a chunk of tokens at a time, never
    # the full logits (causal_lm.py); loss_chunk_tokens None: chunks of at
    # most 256 MiB of fp32 logits (chunked_loss.default_chunk_tokens).
    chunked_loss: bool = True
    loss_chunk_tokens: Optional[int] = None
    # "sublayer": a recomputed block's backward one attention or MLP at a
    # time (sublayers.py): less device memory, each sublayer's forward once
    # more.
    recompute_unit: str = "block"
    # "sublayer" (with params="offload"): the blocks' weights stream one
    # attention or MLP at a time, each the daemon's layer; the backward
    # then runs a sublayer at a time whatever recompute_unit says.
    param_unit: str = "block"
    service: str = "lanes"
    # torch.distributed: None, the default group when initialized (with
    # more than one rank); False: this process alone; or a ProcessGroup.
    process_group: object = None

    def __post_init__(self) -> None:
        self._check_starting_weights()
        self._check_step_options()
        self._adam_as_floats()
        self._check_memory_options()
        check_settings(self)

    @classmethod
    def names(cls) -> FrozenSet[str]:
        return frozenset(field.name for field in fields(cls))

    @property
    def auto_activations(self) -> bool:
        """activations="auto": lohand plans them after a profiling
        iteration."""
        return (isinstance(self.activations, str)
                and self.activations == "auto")

    @property
    def activation_unit(self) -> str:
        """The unit of a recomputed block's backward (weights streamed a
        sublayer at a time need it to be a sublayer)."""
        return ("sublayer" if self.param_unit == "sublayer"
                else self.recompute_unit)

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # frozen once checked

    def _check_starting_weights(self) -> None:
        weights = self.weights
        if weights is None:
            return
        if not isinstance(weights, (str, os.PathLike)) or not str(weights):
            raise TypeError(f"weights={weights!r}: the path of a checkpoint "
                            "(a Hugging Face directory, a safetensors file "
                            "or an engine.save directory)")
        if self.resume is not False:
            raise ValueError(
                f"weights={str(weights)!r} with resume={self.resume!r}: "
                "both say where the weights come from. weights= starts a "
                "new job from a model's weights (fresh Adam moments); "
                "resume=True continues a job, resume=<directory> an "
                "engine.save checkpoint with its moments")

    def _check_step_options(self) -> None:
        steps = self.grad_accumulation_steps
        if not isinstance(steps, int) or steps < 1:
            raise ValueError("grad_accumulation_steps must be an int >= 1, "
                             f"got {steps!r}")
        scale = self.loss_scale
        if not (scale in (None, "dynamic")
                or (isinstance(scale, (int, float))
                    and math.isfinite(scale) and scale > 0)):
            raise ValueError(f"loss_scale={scale!r}: use None (dynamic "
                             "for fp16, else 1), 'dynamic' or a number > 0")
        initial = self.initial_loss_scale
        if not (isinstance(initial, (int, float)) and math.isfinite(initial)
                and initial >= 1):
            raise ValueError(f"initial_loss_scale={initial!r}: "
                             "a number >= 1 (the dynamic scale's start)")
        for name in ("overlap_step", "chunked_loss", "bias_correction"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got "
                                f"{getattr(self, name)!r}")
        if self.loss_chunk_tokens is not None:
            check_chunk_tokens(self.loss_chunk_tokens, "loss_chunk_tokens")
        check_unit(self.recompute_unit, "recompute_unit")
        check_unit(self.param_unit, "param_unit")
        # None is the usual way to say "no clipping" (Trainer, torch). The
        # daemon checks the range, naming it.
        norm = 0.0 if self.max_grad_norm is None else self.max_grad_norm
        if isinstance(norm, bool) or not isinstance(norm, (int, float)):
            raise TypeError(f"max_grad_norm={norm!r}: use None or 0 "
                            "(no clipping) or a number > 0")
        self._set("max_grad_norm", norm)
        if self.clip_schedule not in ("deferred", "redo-all"):
            raise ValueError(f"clip_schedule={self.clip_schedule!r}: use "
                             "'deferred' (the default) or 'redo-all'")
        # None is lohand's default (the spec's 0), so 0 is no value here;
        # the bounds and "not both" are the core's (check_settings).
        interval = self.commit_interval
        if interval is not None and (isinstance(interval, bool)
                                     or not isinstance(interval, int)
                                     or interval < 1):
            raise ValueError(f"commit_interval={interval!r}: use None "
                             "(lohand's default) or an int from 1 "
                             "(1: every step durable)")
        every = self.durable_every
        if every is not None and (isinstance(every, bool)
                                  or not isinstance(every, (int, float))
                                  or not every > 0):
            raise ValueError(f"durable_every={every!r}: use None (lohand's "
                             "default) or seconds, more than 0")
        if self.service not in ("lanes", "in-order"):
            raise ValueError(f"service={self.service!r}: use 'lanes' (the "
                             "default) or 'in-order'")

    def _adam_as_floats(self) -> None:
        """Held as floats; their ranges are liblohan_client's to judge
        (spec_settings.check_settings, after every other check)."""
        for name in ("lr", "eps", "weight_decay"):
            self._set(name, _as_float(getattr(self, name), name))
        betas = self.betas
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas={betas!r}: a pair of numbers")
        self._set("betas", (_as_float(betas[0], "betas[0]"),
                            _as_float(betas[1], "betas[1]")))

    def _check_memory_options(self) -> None:
        device_bytes = self.device_memory_bytes
        if device_bytes is not None and (
                not self.auto_activations
                or not isinstance(device_bytes, int) or device_bytes <= 0):
            raise ValueError(
                f"device_memory_bytes={device_bytes!r}: an int > 0, "
                "with activations='auto' (the device memory its plan may "
                "use)")
        host_bytes = self.activation_host_bytes
        if host_bytes is not None and (not isinstance(host_bytes, int)
                                       or host_bytes < 0):
            raise ValueError("activation_host_bytes must be None (no limit) "
                             f"or an int >= 0, got {host_bytes!r}")
        if self.buffers not in ("auto", "resident", "streamed"):
            raise ValueError(f"buffers={self.buffers!r}: use 'auto', "
                             "'resident' or 'streamed'")
        if not isinstance(self.stream_buffers, int) or (
                self.stream_buffers < 1):
            raise ValueError("stream_buffers must be an int >= 1, got "
                             f"{self.stream_buffers!r}")


def _as_float(value: object, name: str) -> float:
    """`value` as a float (numpy's and torch's scalars included)."""
    try:
        if not isinstance(value, bool):
            return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        pass
    raise TypeError(f"{name}={value!r}: a number")
