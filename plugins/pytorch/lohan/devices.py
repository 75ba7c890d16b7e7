"""Side streams for copies between host memory and a GPU, one per device,
shared by the engine's parts (weights in, block inputs out), so copies
overlap the compute stream's kernels."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

_COPY_STREAMS: Dict[int, Any] = {}


def copy_stream(device: torch.device) -> "torch.cuda.Stream":
    """The copy stream of a CUDA `device` (made on first use)."""
    index = device.index if device.index is not None else (
        torch.cuda.current_device())
    stream = _COPY_STREAMS.get(index)
    if stream is None:
        stream = _COPY_STREAMS[index] = torch.cuda.Stream(index)
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
