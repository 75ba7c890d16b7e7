"""The Python client (lohan.client over the C ABI) against a real lohand."""

import os
import signal
import time

import pytest

from lohan import Client, LohanError, StatusCode


def test_hello_and_job_lifecycle(lohand):
    with Client(lohand.socket) as client:
        assert client.daemon_version == "0.1.0"
        assert client.protocol == (1, 0)
        assert client.caller_uid == os.getuid()
        assert client.has_capability("jobs")
        assert not client.has_capability("teleportation")

        job = client.create_job("py-job", host_pool_bytes=1 << 20)
        assert job.name == "py-job" and job.owner_uid == os.getuid()
        assert not job.attached
        attached = client.attach_job(job.id)
        assert attached.attached and attached.attached_pid == os.getpid()
        assert [j.id for j in client.jobs()] == [job.id]

        with pytest.raises(LohanError) as refused:
            client.delete_job(job.id)
        assert refused.value.code == StatusCode.FAILED_PRECONDITION
        assert "detach it first" in refused.value.message

        client.detach_job(job.id)
        status = client.status()
        assert status["daemon_version"] == "0.1.0"
        assert status["config"]["socket_path"] == lohand.socket
        assert status["total_jobs"] == 1
        client.delete_job(job.id)
        assert client.jobs() == []


def test_bad_input_is_a_clear_error(lohand):
    with Client(lohand.socket) as client:
        for bad in ["", "has space", "x" * 65]:
            with pytest.raises(LohanError) as error:
                client.create_job(bad)
            assert error.value.code == StatusCode.INVALID_ARGUMENT
        with pytest.raises(LohanError) as error:
            client.attach_job("j-999999")
        assert error.value.code == StatusCode.NOT_FOUND
        client.create_job("twice")
        with pytest.raises(LohanError) as error:
            client.create_job("twice")
        assert error.value.code == StatusCode.ALREADY_EXISTS
        with pytest.raises(LohanError) as error:
            client.create_job("too-big", host_pool_bytes=1 << 40)
        assert error.value.code == StatusCode.RESOURCE_EXHAUSTED
        # Still serving.
        assert len(client.jobs()) == 1


def test_no_daemon_names_the_socket(tmp_path):
    socket = str(tmp_path / "absent.sock")
    with pytest.raises(LohanError) as error:
        Client(socket)
    assert error.value.code == StatusCode.UNAVAILABLE
    assert socket in error.value.message


def test_daemon_killed_under_a_connected_client(lohand):
    client = Client(lohand.socket)
    job = client.create_job("survivor")
    assert lohand.stop(signal.SIGKILL) == -signal.SIGKILL
    with pytest.raises(LohanError) as error:
        client.jobs()
    assert error.value.code == StatusCode.UNAVAILABLE
    client.close()
    assert job.id == "j-000001"


def test_data_plane_arena_is_shared_memory_returned_on_close(lohand):
    with Client(lohand.socket) as client:
        job = client.create_job("arena", host_pool_bytes=4 << 20)
        with pytest.raises(LohanError) as error:
            client.open_data_plane(job.id)
        assert error.value.code == StatusCode.FAILED_PRECONDITION
        client.attach_job(job.id)
        plane = client.open_data_plane(job.id)
        assert plane.size == 4 << 20
        plane.arena[0:4] = b"lohn"
        plane.arena[-1] = 7
        assert bytes(plane.arena[0:4]) == b"lohn" and plane.arena[-1] == 7
        pool = client.status()["pool"]
        assert int(pool["used_bytes"]) == 4 << 20
        assert pool["arenas"][0]["job_id"] == job.id
        plane.close()
        plane.close()  # idempotent
        for _ in range(3000):
            if int(client.status()["pool"]["used_bytes"]) == 0:
                break
            time.sleep(0.01)
        assert int(client.status()["pool"]["used_bytes"]) == 0
