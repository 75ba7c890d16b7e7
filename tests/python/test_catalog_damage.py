"""A damaged store catalog, end to end with a real lohand and the plugin: a
job trains, lohand restarts (its catalog becomes a snapshot of the trained
states), the snapshot is cut short, as a lost page or a bad copy would
leave it. lohand refuses to start naming the catalog; `lohand --salvage`
rebuilds it and says per job what it holds; the job's resume is then
refused with DATA_LOSS naming the job, never run as a fresh job on top of
its trained states. The job can be deleted and a new one trains."""

from __future__ import annotations

import signal
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import List, Tuple

import pytest

import lohan
from conftest import Daemon, built
from lohan.client import StatusCode
from test_engine import batches, engine_for, tiny_gpt, train_lohan

KIND_CREATE = 2


def records(catalog: bytes) -> List[Tuple[int, bytes]]:
    """The catalog's records: (offset, payload), framed as record_log.h
    says ([u32 length][u32 crc][payload])."""
    out = []
    at = 0
    while at + 8 <= len(catalog):
        (length,) = struct.unpack_from("<I", catalog, at)
        out.append((at, catalog[at + 8:at + 8 + length]))
        at += 8 + length
    return out


def create_of(payload: bytes) -> Tuple[str, str]:
    """(job, name) of a create record's payload."""
    (job_len,) = struct.unpack_from("<I", payload, 1)
    job = payload[5:5 + job_len].decode()
    (name_len,) = struct.unpack_from("<I", payload, 5 + job_len)
    start = 9 + job_len
    return job, payload[start:start + name_len].decode()


def lohand_command(directory: Path, *extra: str) -> List[str]:
    return [str(built("daemon/main/lohand")), "--socket",
            str(directory / "lohand.sock"), "--state-dir",
            str(directory / "state"), "--ssd-path", str(directory / "ssd0"),
            "--ssd-capacity", "64MiB", "--host-pool-size", "64MiB",
            "--profile-probe", "4MiB", "--optimizer-tuning", "default",
            *extra]


def test_a_cut_snapshot_is_refused_salvaged_and_the_job_refused():
    with tempfile.TemporaryDirectory(prefix="lohan-catalog-") as name:
        directory = Path(name)
        daemon = Daemon(directory)
        try:
            model = tiny_gpt()
            with engine_for(model, daemon, job_name="victim") as engine:
                train_lohan(engine, model, batches(3))
            with lohan.Client(daemon.socket) as client:
                [job_id] = [j.id for j in client.jobs() if j.name == "victim"]
        finally:
            assert daemon.stop() == 0
        # A restart compacts the catalog into a snapshot of the trained job.
        Daemon(directory).stop()
        catalog_path = directory / "state" / "store" / "catalog.log"
        catalog = catalog_path.read_bytes()
        meta = [offset for offset, payload in records(catalog)
                if payload[:1] == bytes([KIND_CREATE])
                and create_of(payload) == (job_id, "meta")]
        assert len(meta) == 1, "the snapshot holds the job's meta once"
        # Cut on the record boundary before the meta: every record before
        # it intact, nothing torn, the job's states there but not its step.
        catalog_path.write_bytes(catalog[:meta[0]])

        refused = subprocess.run(lohand_command(directory), text=True,
                                 capture_output=True, timeout=120)
        assert refused.returncode != 0
        assert str(catalog_path) in refused.stderr
        assert "snapshot" in refused.stderr
        assert "lohand --salvage" in refused.stderr

        salvage = subprocess.run(lohand_command(directory, "--salvage"),
                                 text=True, capture_output=True, timeout=120)
        assert salvage.returncode == 0, salvage.stderr
        assert f"job {job_id}:" in salvage.stdout
        assert "catalog.log.damaged-" in salvage.stdout

        daemon = Daemon(directory)
        try:
            fresh = tiny_gpt(seed=5)
            with pytest.raises(lohan.LohanError) as error:
                engine_for(fresh, daemon, job_name="victim", resume=True)
            assert error.value.code == StatusCode.DATA_LOSS
            assert f"job '{job_id}'" in error.value.message
            assert "meta" in error.value.message
            # What `lohanctl jobs` shows of it, and the way out: delete it,
            # then a new job of that name trains.
            with lohan.Client(daemon.socket) as client:
                [job] = [j for j in client.status()["jobs"]
                         if j["id"] == job_id]
                assert "DATA_LOSS" in job["last_failure"], job
                client.delete_job(job_id)
            model = tiny_gpt()
            with engine_for(model, daemon, job_name="victim") as engine:
                train_lohan(engine, model, batches(1))
                assert engine.iteration == 1
        finally:
            daemon.stop(signal.SIGKILL)
