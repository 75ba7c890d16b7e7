"""lohand's Prometheus metrics against a real daemon: the [metrics] textfile
(node_exporter's textfile collector) and `lohanctl metrics`, read with
Prometheus's own text-format parser (prometheus_client) and checked against
`lohanctl status --json`; a second user (nobody, through setpriv) sees only
their own jobs; a textfile directory another user may write is refused at
start; a clean shutdown joins the writer and removes the file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, Daemon, built

# Every family lohand writes (metrics/prometheus_text.h), by the name
# prometheus_client gives it (a counter's without "_total"), and its type.
FAMILIES = {
    "lohan_build_info": "gauge",
    "lohan_start_time_seconds": "gauge",
    "lohan_pool_capacity_bytes": "gauge",
    "lohan_pool_used_bytes": "gauge",
    "lohan_ssd_capacity_bytes": "gauge",
    "lohan_ssd_used_bytes": "gauge",
    "lohan_state_tier_capacity_bytes": "gauge",
    "lohan_jobs": "gauge",
    "lohan_jobs_attached": "gauge",
    "lohan_data_planes": "gauge",
    "lohan_jobs_not_listed": "gauge",
    "lohan_optimizer_seconds": "counter",
    "lohan_job_ssd_held_bytes": "gauge",
    "lohan_job_arena_shrink_asks": "counter",
    "lohan_job_arena_grow_asks": "counter",
    "lohan_job_planes_closed": "counter",
    "lohan_job_steps": "counter",
    "lohan_job_last_step_seconds": "gauge",
    "lohan_job_mean_step_seconds": "gauge",
    "lohan_job_ssd_read_bytes": "counter",
    "lohan_job_ssd_written_bytes": "counter",
    "lohan_job_host_update_bytes": "counter",
    "lohan_job_host_copied_bytes": "counter",
    "lohan_job_arena_bytes": "gauge",
    "lohan_job_wanted_arena_bytes": "gauge",
    "lohan_job_state_tier_bytes": "gauge",
    "lohan_job_optimizer_seconds": "counter",
}
JOB_LABELS = {"job_id", "job_name", "owner_uid", "owner"}

Key = Tuple[str, Tuple[Tuple[str, str], ...]]


def parse(text: str) -> Dict[Key, float]:
    """Every sample by its name and labels, after checking the families
    (each once, with its type) with Prometheus's parser."""
    families = list(text_string_to_metric_families(text))
    names = [family.name for family in families]
    assert sorted(names) == sorted(FAMILIES), names
    samples: Dict[Key, float] = {}
    for family in families:
        assert family.type == FAMILIES[family.name], family.name
        assert family.documentation, family.name
        for sample in family.samples:
            if family.name.startswith("lohan_job_"):
                assert set(sample.labels) == JOB_LABELS, sample
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, key
            samples[key] = sample.value
    return samples


def expected(status: dict) -> Dict[Key, float]:
    """The samples `status` (lohanctl status --json: the proto's field names,
    64-bit integers as strings) should give."""
    out: Dict[Key, float] = {}

    def put(name: str, value, **labels: str) -> None:
        out[(name, tuple(sorted(labels.items())))] = float(value)

    pool, store = status["pool"], status["store"]
    put("lohan_build_info", 1, version=status["daemon_version"])
    put("lohan_start_time_seconds", status["started_unix_seconds"])
    put("lohan_pool_capacity_bytes", pool["capacity_bytes"])
    put("lohan_pool_used_bytes", pool["used_bytes"])
    for ssd in store["ssds"]:
        put("lohan_ssd_capacity_bytes", ssd["capacity_bytes"],
            path=ssd["path"])
        put("lohan_ssd_used_bytes", ssd["used_bytes"], path=ssd["path"])
    put("lohan_state_tier_capacity_bytes", pool["state_tier_bytes"])
    put("lohan_jobs", status["total_jobs"])
    put("lohan_jobs_attached", status["attached_jobs"])
    put("lohan_data_planes", status["data_planes"])
    put("lohan_jobs_not_listed", status["jobs_not_listed"])
    put("lohan_optimizer_seconds_total", status["optimizer"]["busy_seconds"])
    labels = {}
    for job in status["jobs"]:
        labels[job["id"]] = dict(job_id=job["id"], job_name=job["spec"]["name"],
                                 owner_uid=str(job["owner_uid"]),
                                 owner=job["owner_name"])
        put("lohan_job_ssd_held_bytes", job["ssd_bytes"], **labels[job["id"]])
        put("lohan_job_arena_shrink_asks_total", job["arena_shrink_asks"],
            **labels[job["id"]])
        put("lohan_job_arena_grow_asks_total", job["arena_grow_asks"],
            **labels[job["id"]])
        put("lohan_job_planes_closed_total", job["planes_closed"],
            **labels[job["id"]])
    for session in status["sessions"]:
        of = labels[session["job_id"]]
        put("lohan_job_steps_total", session["iteration"], **of)
        put("lohan_job_last_step_seconds", session["last_iteration_seconds"],
            **of)
        put("lohan_job_mean_step_seconds", session["mean_iteration_seconds"],
            **of)
        put("lohan_job_ssd_read_bytes_total", session["ssd_read_bytes"], **of)
        put("lohan_job_ssd_written_bytes_total", session["ssd_written_bytes"],
            **of)
        put("lohan_job_host_update_bytes_total",
            session.get("host_update_bytes", 0), **of)
        put("lohan_job_host_copied_bytes_total",
            session.get("host_copied_bytes", 0), **of)
        put("lohan_job_arena_bytes", session["arena_bytes"], **of)
        put("lohan_job_wanted_arena_bytes", session["wanted_arena_bytes"],
            **of)
        put("lohan_job_state_tier_bytes", session["state_tier_bytes"], **of)
        put("lohan_job_optimizer_seconds_total",
            session["optimizer_seconds"], **of)
    return out


def lohanctl(socket: str, *args: str) -> str:
    result = subprocess.run(
        [str(built("client/ctl/lohanctl")), "--socket", socket, *args],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def status_json(socket: str) -> dict:
    return json.loads(lohanctl(socket, "status", "--json"))


def matches_status(read, socket: str, deadline: float) -> Dict[Key, float]:
    """`read()`'s samples once they equal what `lohanctl status --json` says
    (taken right after; the job is paused, so they settle), else fails
    showing the difference. Returns them."""
    while True:
        samples = parse(read())
        want = expected(status_json(socket))
        if samples == want or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    differing = {key: (samples.get(key), want.get(key))
                 for key in set(samples) | set(want)
                 if samples.get(key) != want.get(key)}
    assert not differing, differing
    return samples


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory under /tmp that nobody may enter (0755), owned by us."""
    directory = Path(tempfile.mkdtemp(prefix="lohan-metrics-", dir="/tmp"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def metrics_config(directory: Path, interval: str) -> Tuple[Path, Path]:
    """lohand.toml with [metrics] writing textfile/lohan.prom; returns the
    config and the file."""
    textfile_dir = directory / "textfile"
    textfile_dir.mkdir(mode=0o755, exist_ok=True)
    textfile = textfile_dir / "lohan.prom"
    config = directory / "lohand.toml"
    # Every step durable: the jobs' states are written each step (the SSD
    # byte counters move).
    config.write_text(f'[metrics]\ntextfile = "{textfile}"\n'
                      f'interval = "{interval}"\n'
                      '[pool]\ncommit_interval = 1\n')
    return config, textfile


def wait_for(path: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def start_training(directory: Path, socket: str,
                   job: str) -> subprocess.Popen:
    """train_client on the synthetic model, paused (its data plane open)
    after 2 of 4 iterations until directory/go exists."""
    process = subprocess.Popen(
        [str(built("tests/train_client")), "--socket", socket, "--job", job,
         "--layers", "1000,5000,333", "--iterations", "4",
         "--pause-after", "2", "--resume-file", str(directory / "go"),
         "--out", str(directory / "weights")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(directory / "go.paused")
    return process


NOBODY_CREATES_A_JOB = """
import sys
from lohan.client import Client
with Client(sys.argv[1]) as client:
    print(client.create_job("nobodys-own").id)
"""


def as_nobody(argv: List[str], env: Dict[str, str]) -> str:
    result = subprocess.run(
        ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
         "--clear-groups", *argv],
        capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_textfile_and_lohanctl_metrics_match_status(
        public_dir: Path) -> None:
    """A job trains 2 steps and pauses: the file lohand rewrites every
    second holds, family by family and number by number, what `lohanctl
    status --json` says, and so does `lohanctl metrics`; once it trains on,
    the file follows."""
    config, textfile = metrics_config(public_dir, "1s")
    daemon = Daemon(public_dir, extra_args=["--config", str(config)])
    try:
        wait_for(textfile)
        # No job yet: every family is there, the per-job ones empty.
        before = parse(textfile.read_text())
        assert before[("lohan_jobs", ())] == 0
        assert not [k for k in before if k[0].startswith("lohan_job_")]

        trainer = start_training(public_dir, daemon.socket, "metrics-job")
        deadline = time.monotonic() + 30
        samples = matches_status(textfile.read_text, daemon.socket, deadline)
        [job_id] = [dict(labels)["job_id"] for name, labels in samples
                    if name == "lohan_job_steps_total"]
        labels = (("job_id", job_id), ("job_name", "metrics-job"),
                  ("owner", "root"), ("owner_uid", "0"))
        assert samples[("lohan_job_steps_total", labels)] == 2
        assert samples[("lohan_job_ssd_written_bytes_total", labels)] > 0
        assert samples[("lohan_job_arena_bytes", labels)] > 0
        assert samples[("lohan_data_planes", ())] == 1
        # Alone, the job had lohand's optimizer to itself: its share is 1.
        optimizer = samples[("lohan_job_optimizer_seconds_total", labels)]
        assert optimizer > 0
        assert samples[("lohan_optimizer_seconds_total", ())] == (
            pytest.approx(optimizer, abs=1e-6))
        # Nobody else wanted the pool: nothing asked, nothing closed.
        for name in ("lohan_job_arena_shrink_asks_total",
                     "lohan_job_arena_grow_asks_total",
                     "lohan_job_planes_closed_total"):
            assert samples[(name, labels)] == 0, name
        # lohanctl metrics: the same text, as root sees it.
        matches_status(lambda: lohanctl(daemon.socket, "metrics"),
                       daemon.socket, time.monotonic() + 30)

        (public_dir / "go").write_text("go\n")
        output, _ = trainer.communicate(timeout=120)
        assert trainer.returncode == 0, output
        # The session closed: its series go, the job's SSD bytes stay.
        deadline = time.monotonic() + 30
        while True:
            samples = parse(textfile.read_text())
            if ("lohan_job_steps_total", labels) not in samples:
                break
            assert time.monotonic() < deadline, samples
            time.sleep(0.2)
        assert samples[("lohan_job_ssd_held_bytes", labels)] > 0
        assert samples[("lohan_data_planes", ())] == 0
        # lohand's optimizer time keeps the closed plane's: a counter.
        assert samples[("lohan_optimizer_seconds_total", ())] >= optimizer
        assert samples[("lohan_job_planes_closed_total", labels)] == 0
        assert daemon.stop() == 0, daemon.log()
    finally:
        daemon.stop(signal.SIGKILL)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run as nobody")
def test_lohanctl_metrics_as_another_user_shows_none_of_roots_jobs(
        public_dir: Path) -> None:
    """Root trains a job; nobody's `lohanctl metrics` names only nobody's
    own job (the daemon's GetStatus decides what a caller sees), though
    it counts root's; root's file names both."""
    config, textfile = metrics_config(public_dir, "1s")
    shutil.copy(built("client/liblohan_client.so"), public_dir)
    shutil.copy(built("client/ctl/lohanctl"), public_dir)
    daemon = Daemon(public_dir, extra_args=["--config", str(config)])
    try:
        trainer = start_training(public_dir, daemon.socket, "roots-secret")
        env = {"PYTHONPATH": str(REPO / "plugins" / "pytorch"),
               "LOHAN_CLIENT_LIB": str(public_dir / "liblohan_client.so"),
               "PYTHONDONTWRITEBYTECODE": "1"}
        nobodys_job = as_nobody(["/usr/bin/python3", "-c",
                                 NOBODY_CREATES_A_JOB, daemon.socket],
                                env).strip()
        text = as_nobody([str(public_dir / "lohanctl"), "--socket",
                          daemon.socket, "metrics"], env)
        samples = parse(text)
        assert "roots-secret" not in text
        roots = status_json(daemon.socket)
        [roots_job] = [j["id"] for j in roots["jobs"]
                       if j["spec"]["name"] == "roots-secret"]
        assert roots_job not in text
        # Nobody's job, with no data plane: the series of every job listed.
        per_job = sorted(((name, dict(labels)) for name, labels in samples
                          if name.startswith("lohan_job_")),
                         key=lambda sample: sample[0])
        nobodys = {"job_id": nobodys_job, "job_name": "nobodys-own",
                   "owner": "nobody", "owner_uid": "65534"}
        assert per_job == [(name, nobodys) for name in sorted((
            "lohan_job_ssd_held_bytes", "lohan_job_arena_shrink_asks_total",
            "lohan_job_arena_grow_asks_total",
            "lohan_job_planes_closed_total"))], per_job
        # Counted over every user, never named.
        assert samples[("lohan_jobs", ())] == 2
        assert samples[("lohan_data_planes", ())] == 1
        # Root's file names both.
        deadline = time.monotonic() + 30
        while True:
            named = {dict(labels)["job_name"]
                     for name, labels in parse(textfile.read_text())
                     if name == "lohan_job_ssd_held_bytes"}
            if named == {"roots-secret", "nobodys-own"}:
                break
            assert time.monotonic() < deadline, named
            time.sleep(0.2)
        (public_dir / "go").write_text("go\n")
        output, _ = trainer.communicate(timeout=120)
        assert trainer.returncode == 0, output
    finally:
        daemon.stop(signal.SIGKILL)


def test_a_textfile_directory_others_can_write_is_refused(
        public_dir: Path) -> None:
    """lohand runs as root and renames its file into that directory: one
    that another user may write is refused at start and by --check-config,
    naming the key and the fix, and nothing is written there."""
    open_dir = public_dir / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    config = public_dir / "lohand.toml"
    config.write_text(f'[metrics]\ntextfile = "{open_dir}/lohan.prom"\n')
    (public_dir / "ssd0").mkdir()
    command = [str(built("daemon/main/lohand")), "--config", str(config),
               "--socket", str(public_dir / "lohand.sock"), "--state-dir",
               str(public_dir / "state"), "--ssd-path",
               str(public_dir / "ssd0"), "--ssd-capacity", "64MiB",
               "--host-pool-size", "64MiB", "--profile-probe", "0",
               "--optimizer-tuning", "default"]
    for extra in ([], ["--check-config"]):
        result = subprocess.run(command + extra, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 1, result.stderr
        assert "key 'metrics.textfile'" in result.stderr
        assert f"{open_dir} is writable by others (mode 0777)" in (
            result.stderr)
        assert f"chmod go-w {open_dir}" in result.stderr
        assert list(open_dir.iterdir()) == []
    # Not a *.prom file: refused by name before anything else.
    config.write_text(f'[metrics]\ntextfile = "{public_dir}/lohan.txt"\n')
    result = subprocess.run(command, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert "key 'metrics.textfile' must be an absolute path to a file " \
        "named *.prom" in result.stderr


def test_a_clean_shutdown_stops_the_writer_and_removes_the_file(
        public_dir: Path) -> None:
    """With an hour between writes, SIGTERM still stops lohand at once: the
    writer's thread is woken and joined, the file removed (a stopped
    lohand exports nothing that looks current), no temporary left."""
    config, textfile = metrics_config(public_dir, "1h")
    daemon = Daemon(public_dir, extra_args=["--config", str(config)])
    try:
        wait_for(textfile)
        assert parse(textfile.read_text())[("lohan_jobs", ())] == 0
        assert oct(textfile.stat().st_mode & 0o777) == oct(0o644)
        started = time.monotonic()
        assert daemon.stop(signal.SIGTERM) == 0, daemon.log()
        assert time.monotonic() - started < 20, daemon.log()
        assert list(textfile.parent.iterdir()) == []
        assert "metrics: stopped" in daemon.log()
        assert "lohand stopped" in daemon.log()
    finally:
        daemon.stop(signal.SIGKILL)
