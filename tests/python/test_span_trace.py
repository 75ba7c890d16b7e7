"""lohand's span trace (LOHAN_TRACE, daemon/common/span_trace.h) read by
bench/train/trace_timeline.py: a real lohand started with it records, for
every iteration of a job trained through the plugin, one update and one
write of each chunk, its gradient stores, EndIteration and the waits of
the next forward; and the timeline tool splits them by iteration."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from conftest import REPO, Daemon
from test_engine import batches, engine_for, lm_loss, tiny_gpt

sys.path.insert(0, str(REPO / "bench" / "train"))
import trace_timeline  # noqa: E402


def test_a_traced_lohand_records_each_iterations_stages(tmp_path,
                                                        monkeypatch):
    monkeypatch.setenv("LOHAN_TRACE", str(tmp_path / "spans"))
    daemon = Daemon(tmp_path)
    try:
        model = tiny_gpt()
        steps = 4
        with engine_for(model, daemon, max_grad_norm=1e-3,
                        buffers="streamed", stream_buffers=1,
                        job_name="traced") as engine:
            for step in batches(steps, micro=1):
                engine.backward(lm_loss(model, step[0]))
                engine.step()
            engine.sync_weights()
    finally:
        assert daemon.stop(signal.SIGTERM) == 0, daemon.log()
    traces = list(tmp_path.glob("spans.*"))
    assert len(traces) == 1, traces
    spans = trace_timeline.read_spans(traces[0])
    its = trace_timeline.iterations(spans)
    # Each begin_iteration starts one; the last has no end. The first may
    # have updated chunks before clipping was certain, and again after.
    assert len(its) == steps - 1
    chunks = None
    for start, end, of_it in its[1:]:
        names = [s.name for s in of_it]
        assert names.count("end_iteration") == 1
        updates = sorted((s.a, s.b) for s in of_it if s.name == "update")
        writes = sorted((s.a, s.b) for s in of_it if s.name == "write")
        # Every chunk once (the settle's run on into the next forward,
        # before the next iteration begins).
        chunks = chunks or updates
        assert updates == chunks and writes == chunks
        assert len(set(updates)) == len(updates) > 0
        assert names.count("grad_store") == len({a for a, _ in chunks})
        assert all(start <= s.start <= s.end for s in of_it)
        row = trace_timeline.summarize(start, end, of_it)
        assert 0 < row["ssd.union"] <= row["length"]
    listing = subprocess.run(
        [sys.executable, str(REPO / "bench" / "train" / "trace_timeline.py"),
         str(traces[0]), "--iteration", "1"],
        check=True, capture_output=True, text=True).stdout
    assert "end_iteration" in listing and "write" in listing
