"""Where a model computes and how the engine lays it out: the device, the
blocks and the daemon's layers, the training dtype, each block's
activation mode and where the block weights live. `place()` checks the
options that depend on the model; it changes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple, Union

import torch
from torch import nn

from lohan.activations import block_modes, uses_store
from lohan.blocks import Layer, find_blocks, plan_layers, resolve_dtype
from lohan.sublayers import sublayers
from lohan.options import ActivationsArg, EngineOptions
from lohan.params import resolve_mode as resolve_params_mode

# The activation area's unit: its two halves (activations.py) start on
# page boundaries, as the daemon's direct I/O of the area needs.
PAGE_BYTES = 4096

# A block's activation mode: a name, or per-tensor decisions.
BlockMode = Union[str, List[str]]


def normalized(device: torch.device) -> torch.device:
    """"cuda" as the device index it means now, so that two names of one
    device compare equal."""
    if device.type == "cuda" and device.index is None and (
            torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return device


@dataclass(frozen=True)
class Placement:
    """The engine's layout of one model."""

    home_device: torch.device   # where the parameters were given
    device: torch.device        # where the model computes
    blocks: List[nn.Module]
    layers: List[Layer]
    dtype: torch.dtype          # of the working weights and gradients
    # The first iteration's policy (activations="auto" profiles with
    # "offload"; None resolved by activation_policy) and its block modes.
    first_activations: ActivationsArg
    activation_modes: Sequence[BlockMode]
    # Block inputs beyond the host budget go to the daemon's SSDs through
    # the arena's activation area, of area_bytes (0: none).
    spill: bool
    area_bytes: int
    params_mode: str            # "resident" or "offload"
    # Each block's sublayers (by id(block)), found while its parameters
    # have their shapes (offloaded ones are empty between uses).
    sublayers: Dict[int, List[nn.Module]]

    @property
    def moves_to_device(self) -> bool:
        return self.device != normalized(self.home_device)


def place(model: nn.Module, options: EngineOptions) -> Placement:
    """The model's placement under `options`; ValueError (or find_blocks'
    and resolve_dtype's errors) naming what does not fit."""
    home, device = _devices(model, options)
    blocks = find_blocks(model, options.blocks)
    # A model built on the meta device is too large to hold whole: its
    # blocks' weights live with the daemon unless asked otherwise.
    params_mode = resolve_params_mode(
        options.params, device if home.type != "meta" else None)
    if options.param_unit == "sublayer" and params_mode != "offload":
        raise ValueError(
            f"param_unit='sublayer' streams offloaded weights a sublayer at "
            f"a time; it needs params='offload' (here {params_mode!r})")
    parts = {id(block): sublayers(block) for block in blocks}
    layers = plan_layers(model, blocks,
                         (lambda block: parts[id(block)])
                         if options.param_unit == "sublayer"
                         else lambda _: [])
    dtype = resolve_dtype(options.dtype, layers)
    first = ("offload" if options.auto_activations
             else activation_policy(options, device, params_mode))
    modes = block_modes(first, len(blocks))
    if options.frozen_models and not uses_store(modes):
        raise ValueError(
            f"frozen_models=True reaches lohand's SSDs through the "
            f"activation store, which activations={first!r} does not use; "
            "use 'offload'")
    spill = uses_store(modes) and (
        options.activation_host_bytes is not None
        or options.frozen_host_bytes is not None or options.frozen_models)
    # Two buffers of whole pages: one put or get in flight while the
    # other is filled or emptied.
    buffer_bytes = options.activation_buffer_bytes
    if spill and (not isinstance(buffer_bytes, int)
                  or buffer_bytes < 2 * PAGE_BYTES):
        raise ValueError("activation_buffer_bytes must be an int >= "
                         f"{2 * PAGE_BYTES}, got {buffer_bytes!r}")
    area_bytes = -(-buffer_bytes // PAGE_BYTES) * PAGE_BYTES if spill else 0
    frozen_bytes = options.frozen_host_bytes
    if frozen_bytes is not None and (
            not isinstance(frozen_bytes, int) or frozen_bytes < 0
            or params_mode != "offload"):
        raise ValueError(
            f"frozen_host_bytes={frozen_bytes!r}: an int >= 0, with "
            "params='offload' (the frozen block weights beyond it go to "
            "the daemon's SSDs)")
    if params_mode == "offload" and any(mode != "offload" for mode in modes):
        raise ValueError(
            f"params='offload' needs activations='offload', got "
            f"{first!r}: with it autograd would keep "
            "the weights it saved for backward on the device")
    return Placement(home, device, blocks, layers, dtype, first, modes,
                     spill, area_bytes, params_mode, parts)


def activation_policy(options: EngineOptions, device: torch.device,
                      params_mode: str) -> ActivationsArg:
    """`options.activations`, or where it is None the default for the
    model's device: "offload" on an accelerator (device memory holds one
    block's intermediates), and where the blocks' weights are offloaded
    (their backward needs it) or another option asks for what it does
    (a host budget, frozen models, recompute_unit="sublayer"); otherwise
    "keep" on the CPU, as torch does: there the device's memory is the
    host's, so "offload" would move nothing and only recompute each block
    (a forward more)."""
    if options.activations is not None:
        return options.activations
    asks_for_offload = (options.activation_host_bytes is not None
                        or options.frozen_host_bytes is not None
                        or options.frozen_models
                        or options.recompute_unit != "block")
    if (device.type != "cpu" or params_mode == "offload"
            or asks_for_offload):
        return "offload"
    return "keep"


def _devices(model: nn.Module,
             options: EngineOptions) -> Tuple[torch.device, torch.device]:
    """Where the parameters are, and where the model is to compute."""
    devices = sorted({str(p.device) for p in model.parameters()})
    if "meta" in devices and len(devices) == 2 and options.weights is not None:
        # Some parameters with values of their own (a peft model's
        # adapters over a base built on meta): the checkpoint gives the
        # rest, where those are.
        devices.remove("meta")
    if len(devices) > 1:
        # Autograd runs each device's backward on its own thread, and
        # the engine's hooks keep per-step state that is not locked.
        raise ValueError(
            f"lohan: the model's parameters are on {', '.join(devices)}; "
            "one engine trains a model on one device: build it on the "
            "CPU and pass device=... (lohan puts on the device what "
            "stays there and offloads the blocks' weights)")
    home = torch.device(devices[0] if devices else "cpu")
    if home.type == "meta" and options.weights is None:
        raise ValueError(
            "lohan: the model's parameters are on the meta device (no "
            "values yet); pass weights=PATH, the checkpoint they come from "
            "(a Hugging Face directory, a safetensors file or an "
            "engine.save directory)")
    given = torch.device(options.device) if options.device is not None else (
        home if home.type != "meta" else torch.device("cpu"))
    device = normalized(given)
    if device.type == "meta":
        raise ValueError("lohan: device='meta' computes nothing; pass the "
                         "device to train on ('cpu', 'cuda')")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"lohan: device={device} but torch sees no "
                         "CUDA device here")
    if device != normalized(home) and home.type not in ("cpu", "meta"):
        raise ValueError(
            f"lohan: device={device} but the model is on "
            f"{home}: give a model on the CPU (a model "
            "larger than the GPU) or on that device")
    return home, device
