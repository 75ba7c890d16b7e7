"""Durability by commit interval (lohan.init(commit_interval=N) with lohand's
state tier holding the states): training matches torch AdamW as with every
step durable, and a lohand SIGKILLed between durable commits resumes the job
at its last durable step, from which it goes on to the weights of an
uninterrupted run."""

from __future__ import annotations

import copy
import signal

import pytest

from torch import nn

from test_engine import (assert_fp32_close, batches, engine_for, tiny_gpt,
                         train_lohan, train_torch)


def uninterrupted(steps: int):
    """The model, `steps` batches, and torch AdamW's losses and model after
    training on all of them."""
    reference = tiny_gpt()
    data = batches(steps)
    ref_model: nn.Module = copy.deepcopy(reference)
    ref_losses = train_torch(ref_model, data)
    return reference, data, ref_losses, ref_model


def test_killed_between_durable_commits_resumes_at_the_last_one(tmp_path):
    from conftest import Daemon
    reference, data, ref_losses, ref_model = uninterrupted(6)
    daemon = Daemon(tmp_path)
    try:
        model = copy.deepcopy(reference)
        engine = engine_for(model, daemon, job_name="interval",
                            commit_interval=4)
        losses = train_lohan(engine, model, data[:6])
        assert engine.iteration == 6
        # Steps 5 and 6 are in lohand's memory only: killed, it loses them.
        daemon.stop(signal.SIGKILL)
        engine.close()
        daemon = Daemon(tmp_path)
        resumed = tiny_gpt(seed=1)  # weights come from the daemon
        with engine_for(resumed, daemon, job_name="interval", resume=True,
                        commit_interval=4) as engine:
            assert engine.iteration == 4
            again = train_lohan(engine, resumed, data[4:])
        assert_fp32_close(resumed, ref_model, losses[:4] + again, ref_losses)
    finally:
        daemon.stop(signal.SIGKILL)


@pytest.mark.parametrize("ending", ["close", "sigterm"])
def test_an_ended_session_makes_its_steps_durable(tmp_path, ending):
    """Closing the engine (and so the session), or SIGTERM to lohand
    (systemd's stop) while the job trains between durable commits, writes
    what only lohand's memory held: a later kill loses nothing, and the
    job resumes where it was."""
    from conftest import Daemon
    reference, data, ref_losses, ref_model = uninterrupted(5)
    daemon = Daemon(tmp_path)
    try:
        model = copy.deepcopy(reference)
        engine = engine_for(model, daemon, job_name="ended",
                            commit_interval=100)
        losses = train_lohan(engine, model, data[:3])
        if ending == "close":
            engine.close()
            daemon.stop(signal.SIGKILL)
        else:
            assert daemon.stop(signal.SIGTERM) == 0
            engine.close()
        daemon = Daemon(tmp_path)
        resumed = tiny_gpt(seed=1)
        with engine_for(resumed, daemon, job_name="ended", resume=True,
                        commit_interval=100) as engine:
            assert engine.iteration == 3
            losses += train_lohan(engine, resumed, data[3:])
        assert_fp32_close(resumed, ref_model, losses, ref_losses)
    finally:
        daemon.stop(signal.SIGKILL)


@pytest.mark.parametrize("bad", [0, -1, 1_000_001, 2.5, True])
def test_a_commit_interval_that_cannot_work_is_refused(bad):
    import lohan
    with pytest.raises((ValueError, TypeError), match="commit_interval"):
        lohan.init(tiny_gpt(), commit_interval=bad, socket="/nonexistent")


def test_redo_all_with_an_interval_is_refused():
    """By liblohan_client's check of the settings, lohand's rule, at init."""
    import lohan
    with pytest.raises(ValueError, match="commit_interval=2: ModelSpec "
                       "commit_interval above 1 needs clip_schedule "
                       "deferred"):
        lohan.init(tiny_gpt(), clip_schedule="redo-all", commit_interval=2,
                   socket="/nonexistent")


def test_durable_by_time_loses_at_most_what_the_time_says(tmp_path):
    """lohand's default durability by time ([pool] durable_every = "1h"):
    the job's steps stay in lohand's memory (status says so, and what a
    crash would lose); SIGKILLed, lohand resumes the job at its last durable
    step (its start here), from which it reaches torch's weights."""
    from conftest import Daemon
    config = tmp_path / "lohand.toml"
    config.write_text('[pool]\ndurable_every = "1h"\n')
    reference, data, ref_losses, ref_model = uninterrupted(4)
    daemon = Daemon(tmp_path, extra_args=("--config", str(config)))
    try:
        model = copy.deepcopy(reference)
        engine = engine_for(model, daemon, job_name="timed")
        train_lohan(engine, model, data[:3])
        session = engine.status()["session"]
        assert int(session.get("commit_interval", 0)) == 0
        assert session["durable_every_seconds"] == 3600
        # (The last step's commit may still be settling: the durable
        # iteration is the start's either way.)
        assert engine.iteration == 3
        assert int(session.get("durable_iteration", 0)) == 0
        assert 0 < session["seconds_since_durable"] < 3600
        daemon.stop(signal.SIGKILL)
        engine.close()
        daemon = Daemon(tmp_path, extra_args=("--config", str(config)))
        resumed = tiny_gpt(seed=1)
        with engine_for(resumed, daemon, job_name="timed",
                        resume=True) as engine:
            assert engine.iteration == 0
            losses = train_lohan(engine, resumed, data)
        assert_fp32_close(resumed, ref_model, losses, ref_losses)
    finally:
        daemon.stop(signal.SIGKILL)


def test_lohands_default_durability_is_a_minute_by_time(tmp_path):
    """lohand without a lohand.toml ([pool] durable_every = "auto"): a job
    that states no durability is durable by time, a minute apart (its
    states write in well under the tenth of it that would stretch that);
    its steps stay in lohand's memory, lohanctl status says what a crash
    would lose and the daemon's default, and a SIGKILLed lohand resumes
    the job at its start, from which it reaches torch's weights."""
    import subprocess
    from conftest import Daemon, built
    reference, data, ref_losses, ref_model = uninterrupted(4)
    daemon = Daemon(tmp_path)
    try:
        model = copy.deepcopy(reference)
        engine = engine_for(model, daemon, job_name="default")
        train_lohan(engine, model, data[:3])
        engine.sync_weights()
        session = engine.status()["session"]
        assert int(session.get("commit_interval", 0)) == 0
        assert session["durable_every_seconds"] == 60
        assert int(session.get("durable_iteration", 0)) == 0
        assert 0 < session["seconds_since_durable"] < 60
        text = subprocess.run(
            [str(built("client/ctl/lohanctl")), "--socket", daemon.socket,
             "status"], capture_output=True, text=True, check=True,
            timeout=60).stdout
        assert ("durable every 1m by default, less often when durable "
                "writes would take over 10% of the time") in text, text
        daemon.stop(signal.SIGKILL)
        engine.close()
        daemon = Daemon(tmp_path)
        resumed = tiny_gpt(seed=1)
        with engine_for(resumed, daemon, job_name="default",
                        resume=True) as engine:
            assert engine.iteration == 0
            losses = train_lohan(engine, resumed, data)
        assert_fp32_close(resumed, ref_model, losses, ref_losses)
    finally:
        daemon.stop(signal.SIGKILL)


def test_a_jobs_own_durable_every_wins_over_lohands(lohand):
    model = tiny_gpt()
    with engine_for(model, lohand, job_name="own",
                    durable_every=120.0) as engine:
        train_lohan(engine, model, batches(1))
        session = engine.status()["session"]
        assert session["durable_every_seconds"] == 120.0


@pytest.mark.parametrize("bad", [0, -1, 1e9, float("nan"), True, "10m"])
def test_a_durable_every_that_cannot_work_is_refused(bad):
    import lohan
    with pytest.raises((ValueError, TypeError), match="durable_every"):
        lohan.init(tiny_gpt(), durable_every=bad, socket="/nonexistent")


def test_both_durability_forms_are_refused():
    import lohan
    with pytest.raises(ValueError, match="by steps or by time"):
        lohan.init(tiny_gpt(), durable_every=60, commit_interval=4,
                   socket="/nonexistent")
