"""Following lohand when it moves a job's data plane (issue #47, elastic
shares). A job whose arena holds more than its owner's share of the shared
host pool is asked at an iteration's end (CompletionEntry.arena_asked) to
shrink when another user needs that share, and to grow back when the pool
has room again. Between steps, with nothing in flight, the engine lets go
of everything it holds over the old arena, the client library moves the
plane (Client.follow_share: the model registered again, laid out for the
new arena: one buffer of each kind per layer when they fit, else shared
"streamed" ones) and the engine maps the new one. The daemon keeps the
job's states, and both layouts give the same numbers, so a move changes
no weight or loss.

What the move touches: the session's views (job.py, mapped anew in the
same lists the router, the iteration and the parameter residency hold),
the offloaded blocks' memory of which buffer holds what (params.py) and
the activation area (activation_store.py: drained first, so nothing is in
flight through it). What the job swapped to lohand's SSDs through that
area (the frozen block weights kept there) stays: lohand hands it over to
the job's next plane. The client library's training steps go on over the
same model (steps.py)."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from lohan.activation_store import ActivationStore
from lohan.blocks import Layer
from lohan.client import LohanError
from lohan.iteration import Iteration
from lohan.job import JobSession
from lohan.options import MIB
from lohan.weights import Weights

_SHRINK_WHY = "another user's job needs its share of the host pool"
_GROW_WHY = "the host pool has room again"


@dataclass(frozen=True)
class ArenaMove:
    """One move of the job's data plane."""

    at: float            # time.time() once it moved
    from_bytes: int      # the arena before
    to_bytes: int        # the arena lohand granted
    why: str             # lohand's note (SessionStatus.arena_note)
    buffers: str         # the layout after: "resident" or "streamed"
    stream_buffers: int  # shared buffers of each kind after (0: resident)


@dataclass
class ArenaRecord:
    """The engine's arena over its life: what the job asks for and the
    moves lohand asked of it."""

    wanted_bytes: int  # the arena the job was created with
    moves: int = 0
    last_move: Optional[ArenaMove] = None

    def add(self, move: ArenaMove) -> None:
        self.moves += 1
        self.last_move = move


@dataclass
class MovingParts:
    """What of an engine holds views into the arena or depends on its
    layout."""

    session: JobSession
    iteration: Iteration
    weights: Weights
    activations: Optional[ActivationStore]
    layers: List[Layer]
    dtype: torch.dtype
    device: torch.device


def follow_share(parts: MovingParts) -> Optional[ArenaMove]:
    """Between steps (the last ITER_END answered, the new weights pulled,
    nothing of the next step submitted): moves the job's data plane if
    lohand asked at that ITER_END. None when it asked nothing or nothing
    moved. A move the client library refused with nothing done is
    warned about; lohand asks again at the next step's end. LohanError when a failed move left the job without a data plane
    (the error says how to go on)."""
    session = parts.session
    asked = session.remote.arena_asked
    if not asked:
        return None
    before, why = session.arena_bytes, _note(session)
    try:
        if not _move(parts):
            return None
    except _Refused as refused:
        warnings.warn(
            f"lohan: job {session.job_name!r} stays in its "
            f"{_mib(before)} arena: the move to the {_mib(asked)} one "
            f"lohand asks for was refused ({refused.error.message}); "
            "lohand asks again at the next step's end", stacklevel=4)
        return None
    after = session.arena_bytes
    return ArenaMove(time.time(), before, after,
                     why or (_SHRINK_WHY if after < before else _GROW_WHY),
                     session.buffers, session.slots)


def move_message(job_name: str, move: ArenaMove) -> str:
    """The line the engine warns with once the job moved."""
    if move.stream_buffers:
        plural = "s" if move.stream_buffers > 1 else ""
        layout = (f"gradients and weights now streamed through "
                  f"{move.stream_buffers} shared buffer{plural} of each")
    else:
        layout = "gradients and weights now resident, a buffer per layer"
    how = ("moved job {!r} to" if move.to_bytes < move.from_bytes
           else "grew job {!r} back to").format(job_name)
    return (f"lohan: lohand {how} a {_mib(move.to_bytes)} arena (was "
            f"{_mib(move.from_bytes)}; {layout}): {move.why}")


def status_of(record: ArenaRecord, arena_bytes: int,
              session: Dict[str, Any]) -> Dict[str, Any]:
    """engine.status()'s arena fields: the daemon's own `session` status
    for the job where it has them."""
    last = record.last_move
    return {
        "arena_bytes": arena_bytes,
        "wanted_arena_bytes": int(session.get("wanted_arena_bytes",
                                              record.wanted_bytes)),
        "arena_moves": record.moves,
        "last_arena_move": None if last is None else {
            "at": last.at, "from_bytes": last.from_bytes,
            "to_bytes": last.to_bytes, "why": last.why,
            "buffers": last.buffers, "stream_buffers": last.stream_buffers},
    }


class _Refused(Exception):
    """The client library refused the move with nothing done."""

    def __init__(self, error: LohanError) -> None:
        super().__init__(error.message)
        self.error = error


def _move(parts: MovingParts) -> bool:
    """Lets go of the old arena, has the plane moved, takes the new one
    (or the old one again when nothing moved)."""
    if parts.session.cuda:
        # Copies between the GPU and the arena run on torch's streams.
        torch.cuda.synchronize(parts.device)
    residency = parts.weights.residency
    if residency is not None:
        residency.forget_arena()
    store = parts.activations
    if store is not None:
        store.release_area()
    try:
        return _follow(parts)
    finally:
        if store is not None and parts.session.arena_bytes:
            store.rebind(_area(parts.session))


def _follow(parts: MovingParts) -> bool:
    """The client library's move; _Refused when it did nothing, else a
    failure said with what to do."""
    session = parts.session
    try:
        return session.follow_share(parts.layers, parts.dtype)
    except LohanError as error:
        if session.arena_bytes:  # the old plane is there: nothing done
            raise _Refused(error) from None
        raise LohanError(error.code, (
            f"lohan: job {session.job_name!r} could not move to the arena "
            f"lohand asked for ({error.message}); it has no data plane "
            "now: close the engine, and lohan.init(..., resume=True) "
            f"continues it from step {parts.iteration.steps.committed}"
        )) from None


def _area(session: JobSession) -> Optional[torch.Tensor]:
    area = session.remote.activations
    return (torch.frombuffer(area, dtype=torch.uint8)
            if area is not None else None)


def _note(session: JobSession) -> str:
    """lohand's word on why it asked (empty when it has none)."""
    try:
        sessions = session.client.status().get("sessions", [])
    except LohanError:
        return ""
    for status in sessions:
        if status.get("job_id") == session.job.id:
            return str(status.get("arena_note", ""))
    return ""


def _mib(nbytes: int) -> str:
    return (f"{nbytes // MIB} MiB" if nbytes % MIB == 0
            else f"{nbytes / MIB:.1f} MiB")
