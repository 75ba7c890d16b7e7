"""The data-parallel ranks' committed steps, kept together.

Each rank's daemon commits a step on its own, so a daemon (or rank) that
stops between the ranks' commits leaves their jobs one step apart. A
rank's job therefore keeps the states its last commit replaced until its
next step begins (the daemon's kept commit), and a step begins only once
every rank has said it committed the last one (`agree_committed`). At a
resume, ranks one step ahead go back that step (`rejoin_point`), so every
rank continues from the last step all of them committed. A run that closes
cleanly frees what its jobs kept (`release_kept`).
"""

from __future__ import annotations

from typing import List, Tuple

from lohan.client import LohanError, Model, StatusCode
from lohan.sharding import RankFailure, Sharding

# What a rank reports when its own daemon failed the step.
FAILED = -1


def agree_committed(sharding: Sharding, remote: Model) -> int:
    """Before a step's first gradient reaches this rank's daemon (at the
    same point of every rank's collectives): waits for this rank's last
    commit and checks that every rank made it. Returns the committed
    steps. This rank's own failure is raised after the others have heard
    of it; another rank's as a RankFailure naming it."""
    own = None
    try:
        mine = int(remote.await_committed())
    except LohanError as error:
        own, mine = error, FAILED
        sharding.publish_failure(error)
    every = sharding.gather_int("confirming every rank committed the last "
                                "step", mine)
    short = [rank for rank, steps in enumerate(every) if steps != mine]
    if own is not None or short:
        # Every rank holds the outcome before any stops on it.
        sharding.settle()
    if own is not None:
        raise own
    if short:
        raise RankFailure(
            f"lohan: data-parallel ranks {short} did not commit step {mine} "
            f"(the ranks report {every}; {FAILED}: that rank's daemon "
            "failed the step, its own output says why). Every rank stops; "
            "lohan.init(..., resume=True) on the same ranks continues from "
            "the last step all of them committed")
    return mine


def release_kept(sharding: Sharding, remote: Model) -> None:
    """A run closing cleanly (every rank, between steps): once every rank
    confirms the last commit, its daemon frees the states that commit
    kept, so the idle job holds one version of them, as a lone job
    does."""
    agree_committed(sharding, remote)
    remote.release_previous_commit()


def rejoin_point(sharding: Sharding, remote: Model, job_name: str) -> bool:
    """At a resume (resume=True): whether this rank's job must go back its
    last commit to meet the others (they stopped one step short of it).
    Raises when the ranks' jobs cannot meet."""
    reports: List[Tuple[int, bool]] = sharding.exchange(
        "comparing the ranks' jobs",
        (int(remote.iteration), bool(remote.previous_commit_kept)))
    steps = sorted({step for step, _ in reports})
    if len(steps) == 1:
        return False
    low, high = steps[0], steps[-1]
    ahead = [rank for rank, (step, _) in enumerate(reports) if step == high]
    if len(steps) == 2 and high == low + 1 and all(
            reports[rank][1] for rank in ahead):
        return int(remote.iteration) == high
    raise LohanError(
        StatusCode.FAILED_PRECONDITION,
        f"the ranks' jobs {job_name!r} are at steps "
        f"{[step for step, _ in reports]} (by rank) and cannot continue "
        "from one they all committed (a rank can go back only its last "
        "step, which it keeps until its next step begins); resume from "
        "your last engine.save (resume=<directory>) with another job_name")
