"""The daemon sizes a job's arena from the model's one description
(ModelSpec): at CreateJob (JobSpec.model) within its host pool, and at
RegisterModel (arena_fit) within the arena the job has. The plugin sends
no slot sizes."""

from __future__ import annotations

import ctypes
import json
import signal
from pathlib import Path

import pytest

from conftest import Daemon
from lohan import _native
from lohan.client import Client, LohanError, StatusCode
from lohan.model_spec import ModelSpec

MIB = 1 << 20
KIB = 1 << 10
# Eight layers of 256 Ki bf16 elements: 512 KiB a buffer, 1 MiB of fp32
# staging.
LAYERS = [256 * KIB] * 8
# Room for the states of LAYERS twice over.
SSD = "256MiB"


def spec(layers=LAYERS, **fields) -> ModelSpec:
    return ModelSpec(layer_elements=layers, dtype="bf16", **fields)


def test_creation_takes_one_buffer_per_layer_when_the_pool_holds_it(
        tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, host_pool="64MiB", ssd_capacity=SSD)
    try:
        with Client(daemon.socket) as client:
            model = spec(grad_slots=4, weight_slots=4, fit_arena=True)
            job, sizing = client.create_job_for_model("roomy", model)
            assert sizing.stream_buffers == 0
            assert sizing.arena_bytes == sizing.resident_arena_bytes
            # 16 buffers of 512 KiB, 1 MiB of staging, 1 MiB of control.
            assert sizing.arena_bytes == 10 * MIB
            client.attach_job(job.id)
            with client.open_data_plane(job.id) as plane:
                assert plane.size == sizing.arena_bytes
                remote = plane.register_model(job.id, model)
                assert remote.grad_slots == remote.weight_slots == 8
    finally:
        daemon.stop(signal.SIGKILL)


def test_a_small_pool_streams_through_the_most_buffers_it_holds(
        tmp_path: Path) -> None:
    # Four shared buffers of each take 4 MiB + 1 + 1 = 6 MiB; three 5.
    daemon = Daemon(tmp_path, host_pool="5MiB", ssd_capacity=SSD)
    try:
        with Client(daemon.socket) as client:
            model = spec(grad_slots=4, weight_slots=4, fit_arena=True)
            job, sizing = client.create_job_for_model("tight", model)
            assert sizing.stream_buffers == 3
            assert sizing.arena_bytes == 5 * MIB
            assert sizing.resident_arena_bytes == 10 * MIB
            client.attach_job(job.id)
            with client.open_data_plane(job.id) as plane:
                remote = plane.register_model(job.id, model)
                # The registration lays the model out in the arena it has.
                assert remote.grad_slots == remote.weight_slots == 3
                status = client.status()
                (session,) = [s for s in status["sessions"]
                              if s["job_id"] == job.id]
                assert session["grad_slots"] == 3
            client.detach_job(job.id)
            # As given, four shared buffers do not fit the pool: the
            # registry refuses the size, naming it.
            with pytest.raises(LohanError) as refused:
                client.create_job_for_model(
                    "four", spec(grad_slots=4, weight_slots=4))
            assert refused.value.code == StatusCode.RESOURCE_EXHAUSTED
            assert "the whole pool" in refused.value.message
            # Nothing fits: how large the pool must be, and what to change.
            with pytest.raises(LohanError) as none:
                client.create_job_for_model(
                    "none", spec(grad_slots=4, weight_slots=4,
                                 fit_arena=True, activation_bytes=4 * MIB))
            assert none.value.code == StatusCode.RESOURCE_EXHAUSTED
            text = none.value.message
            assert "job 'none': this model needs 14 MiB" in text, text
            assert "at least 7 MiB streaming through one shared" in text
            assert "--host-pool-size" in text
            assert "smaller activation area (4 MiB of it)" in text
            assert [j.name for j in client.jobs()] == ["tight"]
    finally:
        daemon.stop(signal.SIGKILL)


def test_a_resumed_job_lays_the_model_out_in_the_arena_it_has(
        tmp_path: Path) -> None:
    """A job created by hand with room for two shared buffers (4 MiB):
    registering with arena_fit takes two, not the four asked for at
    most."""
    daemon = Daemon(tmp_path, host_pool="64MiB", ssd_capacity=SSD)
    try:
        with Client(daemon.socket) as client:
            job = client.create_job("by-hand", host_pool_bytes=4 * MIB)
            client.attach_job(job.id)
            with client.open_data_plane(job.id) as plane:
                remote = plane.register_model(
                    job.id, spec(grad_slots=4, weight_slots=4,
                                 fit_arena=True))
                assert remote.grad_slots == 2
            # A model too large for it even with one shared buffer of each.
            other = client.create_job("too-small", host_pool_bytes=4 * MIB)
            client.attach_job(other.id)
            with client.open_data_plane(other.id) as plane:
                with pytest.raises(LohanError) as small:
                    plane.register_model(other.id, ModelSpec(
                        layer_elements=[8 * MIB, MIB], dtype="bf16",
                        grad_slots=1, weight_slots=1, fit_arena=True))
                assert small.value.code == StatusCode.RESOURCE_EXHAUSTED
                assert "job j-" in small.value.message
                assert "'s arena is 4 MiB" in small.value.message
    finally:
        daemon.stop(signal.SIGKILL)


def test_bad_descriptions_are_refused_and_leave_nothing(lohand) -> None:
    lib = _native.library()
    with Client(lohand.socket) as client:
        def create(request: str) -> int:
            text = ctypes.c_void_p()
            return lib.lohan_job_create_json(client._handle, request.encode(),
                                             ctypes.byref(text))

        assert create("{not json") == StatusCode.INVALID_ARGUMENT
        assert b"request_json is not a CreateJobRequest" in (
            lib.lohan_last_error())
        assert create(json.dumps({"spec": {"name": "x", "bogus": 1}})) == (
            StatusCode.INVALID_ARGUMENT)
        both = {"spec": {"name": "both", "host_pool_bytes": MIB,
                         "model": spec().to_proto()}}
        assert create(json.dumps(both)) == StatusCode.INVALID_ARGUMENT
        assert b"not both" in lib.lohan_last_error()
        empty = {"spec": {"name": "empty", "model": {"dtype": "DTYPE_BF16"}}}
        assert create(json.dumps(empty)) == StatusCode.INVALID_ARGUMENT
        assert b"a model has 1 to 65536 layers" in lib.lohan_last_error()
        unequal = dict(spec().to_proto(), grad_slots=2, weight_slots=3,
                       arena_fit="ARENA_FIT_MOST")
        assert create(json.dumps({"spec": {"name": "u", "model": unequal}})
                      ) == StatusCode.INVALID_ARGUMENT
        named = dict(spec().to_proto(), param_groups=[
            {"name": "x" * 65, "lr_scale": 1.0,
             "ranges": [{"layer": 0, "begin": 0, "end": 1}]}])
        assert create(json.dumps({"spec": {"name": "n", "model": named}})
                      ) == StatusCode.INVALID_ARGUMENT
        assert b"param_groups[0].name" in lib.lohan_last_error()
        assert client.jobs() == []
        # The daemon serves on: a good description creates the job.
        small = spec([4096] * 8)
        job, _ = client.create_job_for_model("good", small)
        client.attach_job(job.id)
        with client.open_data_plane(job.id) as plane:
            handle = ctypes.c_void_p()
            assert lib.lohan_model_register_json(
                client._handle, plane._handle, job.id.encode(), b"[1, 2]",
                ctypes.byref(handle)) == StatusCode.INVALID_ARGUMENT
            assert b"spec_json is not a ModelSpec" in lib.lohan_last_error()
            assert plane.register_model(job.id, small).grad_slots == 8
