"""The daemon sizes a job's arena from the model's one description
(ModelSpec): at CreateJob (JobSpec.model) within its host pool, and at
RegisterModel (arena_fit) within the arena the job has. The plugin sends
no slot sizes."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, Daemon, built
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


NOBODY = """
import json, sys
from lohan.client import Client, LohanError
from lohan.model_spec import ModelSpec
layers = [256 << 10] * 8
out = []
with Client(sys.argv[1]) as client:
    for name, slots, layer_list in (("fits", 4, layers),
                                    ("too-big", 4, [8 << 20] * 8)):
        try:
            job, sizing = client.create_job_for_model(name, ModelSpec(
                layer_elements=layer_list, dtype="bf16", grad_slots=slots,
                weight_slots=slots, fit_arena=True))
            out.append([sizing.stream_buffers, sizing.arena_bytes])
        except LohanError as error:
            out.append([error.code.name, error.message])
print(json.dumps(out))
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run as nobody")
def test_a_second_users_arena_is_sized_within_their_quota(
        tmp_path: Path) -> None:
    """nobody's [quotas] host_pool is 6 MiB of a 64 MiB pool: the daemon
    streams nobody's model through the buffers that quota holds, refuses
    a larger one naming the quota, and root's jobs are untouched."""
    directory = Path(tempfile.mkdtemp(prefix="lohan-sizing-", dir="/tmp"))
    try:
        directory.chmod(0o755)
        shutil.copy(built("client/liblohan_client.so"), directory)
        config = directory / "lohand.toml"
        config.write_text('[quotas.user.nobody]\nhost_pool = "6MiB"\n')
        daemon = Daemon(directory, host_pool="64MiB", ssd_capacity=SSD,
                        extra_args=["--config", str(config)])
        try:
            with Client(daemon.socket) as client:
                mine, _ = client.create_job_for_model("root-job", spec())
                result = subprocess.run(
                    ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                     "--clear-groups", "/usr/bin/python3", "-c", NOBODY,
                     daemon.socket],
                    capture_output=True, text=True, timeout=120,
                    env={"PYTHONPATH": str(REPO / "plugins" / "pytorch"),
                         "LOHAN_CLIENT_LIB": str(
                             directory / "liblohan_client.so"),
                         "PYTHONDONTWRITEBYTECODE": "1"})
                assert result.returncode == 0, result.stderr
                fits, too_big = json.loads(result.stdout)
                # Four shared buffers of each: 4 + 1 + 1 = 6 MiB.
                assert fits == [4, 6 * MIB]
                assert too_big[0] == "RESOURCE_EXHAUSTED"
                assert "uid 65534's quota ([quotas] host_pool) is 6 MiB" in (
                    too_big[1])
                assert "[quotas] host_pool in lohand.toml" in too_big[1]
                # Root's job is there as created, and root still creates
                # jobs with the whole pool.
                assert mine.id in [j.id for j in client.jobs()]
                _, sizing = client.create_job_for_model("root-2", spec())
                assert sizing.stream_buffers == 0
        finally:
            daemon.stop(signal.SIGKILL)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_the_new_c_calls_refuse_null_and_bad_arguments(lohand) -> None:
    lib = _native.library()
    assert lib.lohan_model_grad_slots(None) == 0
    assert lib.lohan_model_weight_slots(None) == 0
    text = ctypes.c_void_p()
    assert lib.lohan_job_create_json(None, b"{}", ctypes.byref(text)) == (
        StatusCode.INVALID_ARGUMENT)
    assert b"required" in lib.lohan_last_error()
    ticket = ctypes.c_uint64()
    put = lib.lohan_model_submit_act_put_from_device
    assert put(None, 1, 0, 8, 0, 1, None, None) == StatusCode.INVALID_ARGUMENT
    assert b"ticket is NULL" in lib.lohan_last_error()
    assert put(None, 1, 0, 8, 0, 1, None, ctypes.byref(ticket)) != 0
    with Client(lohand.socket) as client:
        job, _ = client.create_job_for_model(
            "act", spec([4096] * 2, activation_bytes=1 << 16))
        client.attach_job(job.id)
        with client.open_data_plane(job.id) as plane:
            model = plane.register_model(
                job.id, spec([4096] * 2, activation_bytes=1 << 16))
            handle = model._handle
            assert put(handle, 1, 0, 8, -1, 1, None, ctypes.byref(ticket)) == (
                StatusCode.INVALID_ARGUMENT)
            assert b"device must be >= 0" in lib.lohan_last_error()
            assert put(handle, 1, 0, 8, 0, None, None, ctypes.byref(ticket)) == (
                StatusCode.INVALID_ARGUMENT)
            assert b"device_source is NULL" in lib.lohan_last_error()
            # Outside the area: refused before any CUDA call.
            assert put(handle, 1, 1 << 16, 8, 0, 1, None,
                       ctypes.byref(ticket)) == StatusCode.INVALID_ARGUMENT
            assert b"outside the model's activation area" in (
                lib.lohan_last_error())
            # The plane still serves: a host put of the same piece.
            model.act_put(1, 0, 4096)
