"""Sharded data-parallel norms through the Python client and a real lohand:
two jobs each holding half of a model's layers, every iteration ended with
Model.iter_end(global_sum_squares) = the sum over both halves, against one
job of the whole model ending on its own gradients. The clip and skip
flags, the global norm and every new weight agree bit for bit: clipped by
the global norm though neither half's own reaches the limit, unclipped,
and skipped on both when only one half holds a NaN. The gradients are
multiples of 1/64 (bf16, few bits), so every sum of their squares is
exact in any order and the client's sum is the daemon's. Also the ops of
the ranks' agreement on the last commit (ITER_COMMITTED, its release,
revert_last_commit) misused on a job that is no rank's."""

from __future__ import annotations

import math
import time
from contextlib import ExitStack
from typing import List, Optional, Sequence

import pytest
import torch

from lohan import Client, LohanError, StatusCode
from lohan.client import DataPlane

SIZES = [300, 70, 129, 40]
SPLIT = 2
CHUNK = 64  # several chunks per layer: the deferral decides per chunk


def gradients(seed: int, step: float,
              nan_layer: int = -1) -> List[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    grads = [torch.randint(-40, 41, (n,), generator=generator).double() * step
             for n in SIZES]
    if nan_layer >= 0:
        grads[nan_layer][3] = float("nan")
    return grads


def sum_squares(grads: Sequence[torch.Tensor]) -> float:
    return float(sum(float((g * g).sum()) for g in grads))


class Job:
    """One job holding SIZES[first:first + count], registered on its own
    connection (a rank's)."""

    def __init__(self, stack: ExitStack, socket: str, name: str, first: int,
                 count: int, initial: Sequence[torch.Tensor], limit: float,
                 clip_schedule: str, stream_buffers: int):
        self.first, self.count = first, count
        self.client = stack.enter_context(Client(socket))
        job = self.client.create_job(name, host_pool_bytes=4 << 20)
        self.client.attach_job(job.id)
        self.plane = stack.enter_context(self.client.open_data_plane(job.id))
        self.model = self.plane.register_model(
            job.id, SIZES[first:first + count], dtype="bf16", lr=1e-2,
            weight_decay=0.01, max_grad_norm=limit, skip_nonfinite=True,
            chunk_elements=CHUNK, clip_schedule=clip_schedule,
            grad_slots=stream_buffers, weight_slots=stream_buffers)
        self.staging = torch.frombuffer(self.model.staging,
                                        dtype=torch.float32)
        for j in range(count):
            self.staging[: SIZES[first + j]] = initial[first + j]
            self.model.init_weights(j)

    def backward(self, grads: Sequence[torch.Tensor]) -> None:
        self.model.iter_begin()
        for j in reversed(range(self.count)):
            buffer = torch.frombuffer(self.model.grad_buffer(j),
                                      dtype=torch.bfloat16)
            buffer.copy_(grads[self.first + j].to(torch.bfloat16))
            self.model.grad_ready(j)

    def step(self, grads: Sequence[torch.Tensor],
             global_sum_squares: Optional[float]) -> tuple:
        self.backward(grads)
        return self.model.iter_end(global_sum_squares)

    def weights(self) -> List[torch.Tensor]:
        out = []
        for j in range(self.count):
            self.model.read_weights(j)
            out.append(self.staging[: SIZES[self.first + j]].clone())
        return out


def same(a: tuple, b: tuple) -> bool:
    """The same (norm, clipped, skipped), NaN norms counting as equal."""
    norms_equal = (math.isnan(a[0]) and math.isnan(b[0])) or a[0] == b[0]
    return norms_equal and a[1:] == b[1:]


@pytest.mark.parametrize("clip_schedule,stream_buffers", [
    ("deferred", 0), ("redo-all", 0), ("deferred", 1)])
def test_halves_given_the_global_sum_train_as_the_whole_model(
        lohand, clip_schedule, stream_buffers):
    torch.manual_seed(0)
    initial = [torch.randn(n) for n in SIZES]
    first = gradients(1, 1 / 64)
    low, high = sum_squares(first[:SPLIT]), sum_squares(first[SPLIT:])
    # Between the larger half's own sum and the whole's: only the global
    # sum clips the first step.
    limit = math.sqrt(max(low, high) + min(low, high) / 2)
    plan = [
        (first, True, False),
        (gradients(2, 1 / 1024), False, False),  # far under the limit
        (gradients(3, 1 / 64, nan_layer=3), False, True),  # NaN: high half
        (gradients(4, 1 / 4), True, False),
    ]
    tag = f"{clip_schedule}-{stream_buffers}"
    with ExitStack() as stack:
        jobs = [Job(stack, lohand.socket, f"{name}-{tag}", first_layer, count,
                    initial, limit, clip_schedule, stream_buffers)
                for name, first_layer, count in (
                    ("whole", 0, len(SIZES)), ("low", 0, SPLIT),
                    ("high", SPLIT, len(SIZES) - SPLIT))]
        whole, halves = jobs[0], jobs[1:]
        for index, (grads, clips, skips) in enumerate(plan):
            total = sum_squares(grads[:SPLIT]) + sum_squares(grads[SPLIT:])
            own = whole.step(grads, None)
            assert own[1:] == (clips, skips), (index, own)
            if not skips:
                # The whole job's own norm is the halves' sum's root.
                assert own[0] == math.sqrt(total), index
            else:
                assert math.isnan(own[0]) and math.isnan(total)
            for half in halves:
                given = half.step(grads, total)
                assert same(given, own), (index, half.first, given, own)
            reference = whole.weights()
            for half in halves:
                for j, weights in enumerate(half.weights()):
                    assert torch.equal(weights, reference[half.first + j]), (
                        index, half.first + j)
        # Each half's own sum alone would not have clipped the first step.
        assert max(low, high) < limit * limit


def test_a_negative_sum_is_refused_and_the_iteration_goes_on(lohand):
    initial = [torch.zeros(n) for n in SIZES]
    with ExitStack() as stack:
        job = Job(stack, lohand.socket, "negative", 0, SPLIT, initial, 1.0,
                  "deferred", 0)
        grads = gradients(5, 1 / 64)
        job.backward(grads)
        for negative in (-1.0, -0.0, float("-inf")):
            with pytest.raises(LohanError) as error:
                job.model.iter_end(negative)
            assert error.value.code == StatusCode.INVALID_ARGUMENT
            assert "negative" in error.value.message
        norm, clipped, skipped = job.model.iter_end(4.0)
        assert (norm, clipped, skipped) == (2.0, True, False)
        # The next iteration follows: the one refused was not lost.
        assert job.step(grads, 0.25) == (0.5, False, False)


def open_when_returned(client: Client, job_id: str) -> DataPlane:
    """The job's data plane, once the daemon has taken back the arena of
    the one just closed (it does so when it sees the connection close;
    bounded only against a hang)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return client.open_data_plane(job_id)
        except LohanError as error:
            if (error.code != StatusCode.ALREADY_EXISTS
                    or time.monotonic() > deadline):
                raise
        time.sleep(0.01)


def test_the_commit_agreements_ops_refuse_misuse_and_lose_nothing(lohand):
    # ITER_COMMITTED, its release flag and revert_last_commit on a job that
    # is no data-parallel rank's: the misuse refused with a clear error, the
    # job's steps and weights untouched, another job served throughout.
    initial = [torch.zeros(n) for n in SIZES]
    with ExitStack() as stack:
        job = Job(stack, lohand.socket, "plain", 0, SPLIT, initial, 0.0,
                  "deferred", 0)
        other = Job(stack, lohand.socket, "other", SPLIT, 2, initial, 0.0,
                    "deferred", 0)
        grads = gradients(6, 1 / 64)
        job.step(grads, None)
        assert job.model.await_committed() == 1
        job.backward(grads)
        with pytest.raises(LohanError) as inside:
            job.model.await_committed()
        assert inside.value.code == StatusCode.FAILED_PRECONDITION
        assert "an iteration is in progress" in inside.value.message
        with pytest.raises(LohanError):
            job.model.release_previous_commit()
        job.model.iter_end()  # the iteration refused inside goes on
        assert job.model.await_committed() == 2
        job.model.release_previous_commit()  # nothing kept: nothing done
        assert not job.model.previous_commit_kept
        weights = job.weights()
        other.step(grads, None)
    # Its plane closed (the job stays): registered again, asked to go back.
    with ExitStack() as stack:
        client = stack.enter_context(Client(lohand.socket))
        plain = next(j for j in client.jobs() if j.name == "plain")
        client.attach_job(plain.id)
        plane = stack.enter_context(open_when_returned(client, plain.id))
        spec = dict(dtype="bf16", lr=1e-2, weight_decay=0.01,
                    skip_nonfinite=True, chunk_elements=CHUNK)
        with pytest.raises(LohanError) as back:
            plane.register_model(plain.id, SIZES[:SPLIT],
                                 revert_last_commit=True, **spec)
        assert back.value.code == StatusCode.FAILED_PRECONDITION
        assert "keeps no commit before its last one" in back.value.message
        model = plane.register_model(plain.id, SIZES[:SPLIT], **spec)
        assert model.iteration == 2
        staging = torch.frombuffer(model.staging, dtype=torch.float32)
        for j in range(SPLIT):
            model.read_weights(j)
            assert torch.equal(staging[:SIZES[j]], weights[j]), j
