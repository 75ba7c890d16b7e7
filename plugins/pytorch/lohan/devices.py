"""Side streams for copies between host memory and a GPU, two per device
(host to device: weights in; device to host: gradients and block inputs
out), shared by the engine's parts, so copies overlap the compute stream's
kernels and copies in one direction do not queue behind the other's."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

_COPY_STREAMS: Dict[Tuple[int, bool], Any] = {}


def copy_stream(device: torch.device,
                outbound: bool = False) -> "torch.cuda.Stream":
    """The copy stream of a CUDA `device` into it, or with `outbound` out
    of it (made on first use)."""
    index = device.index if device.index is not None else (
        torch.cuda.current_device())
    stream = _COPY_STREAMS.get((index, outbound))
    if stream is None:
        stream = _COPY_STREAMS[(index, outbound)] = torch.cuda.Stream(index)
    return stream


def to_device(source: torch.Tensor, device: torch.device,
              private: bool) -> Tuple[torch.Tensor, Any]:
    """`source` (host memory) on `device`, with the CUDA event that marks
    the copy done (None off a GPU). On a GPU the copy runs on the copy
    stream, asynchronously from pinned memory; the caller makes the compute
    stream wait for the event. On the CPU `private` says whether the result
    must be a copy (source memory that may change) or may be `source`."""
    if device.type != "cuda":
        return (source.clone() if private else source), None
    stream = copy_stream(device)
    with torch.cuda.stream(stream):
        copy = source.to(device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
    return copy, event
