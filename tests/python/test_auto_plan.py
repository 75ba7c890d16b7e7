"""activations="auto" through a real lohand: the first iteration profiles,
lohand plans per saved tensor (PlanJob), the plan applies from the second
iteration, the results stay the bits of "keep", and lohand shows the plan
with the predicted and the measured iteration time."""
from typing import Any, Dict, List

import pytest
import torch

import lohan
import lohan.activations
from test_engine import batches, engine_for, tiny_gpt, train_lohan
from test_plan_job import wait_for_profile

_runs = iter(range(1 << 30))


@pytest.fixture(autouse=True)
def plan_small_tensors(monkeypatch):
    """The test model's tensors are a few KiB: plan everything over 1 KiB."""
    monkeypatch.setattr(lohan.activations, "_MIN_SWAP_BYTES", 1024)


def _train(lohand, steps: int = 4, **options) -> Dict[str, Any]:
    # The plan is asked for after the first step; while lohand still
    # measures its machine (just started) it comes a step later.
    with lohan.Client(lohand.socket) as client:
        wait_for_profile(client)
    model = tiny_gpt()
    name = f"auto-{next(_runs)}"
    engine = engine_for(model, lohand, job_name=name, **options)
    losses = train_lohan(engine, model, batches(steps))
    with lohan.Client(lohand.socket) as client:
        sessions = [s for s in client.status().get("sessions", [])
                    if s["job_id"] == engine._job.id]
        kept = (client.kept_plan(engine._job.id)
                if "plan" in sessions[0] else None)
    result = {"losses": losses, "plan": engine.activation_plan,
              "weights": [p.detach().clone() for p in model.parameters()],
              "stats": engine.activation_stats, "session": sessions[0],
              "kept_plan": kept}
    engine.close()
    return result


def _assert_same(a: Dict[str, Any], b: Dict[str, Any]) -> None:
    assert a["losses"] == b["losses"]
    for x, y in zip(a["weights"], b["weights"]):
        assert torch.equal(x, y)


def _decisions(plan: Dict[str, Any]) -> List[List[str]]:
    return [block.get("decisions", []) for block in plan["blocks"]]


def test_auto_profiles_plans_and_stays_exact(lohand):
    keep = _train(lohand, activations="keep")
    auto = _train(lohand, activations="auto")
    _assert_same(keep, auto)
    plan = auto["plan"]
    assert plan is not None and len(plan["blocks"]) == 3
    # One decision per storage the profile measured in a block.
    assert all(len(d) == 8 for d in _decisions(plan))
    assert float(plan["predictedIterationSeconds"]) > 0
    assert plan["forwardBinding"] and plan["backwardBinding"]
    # lohand keeps the plan with the session and times what follows it.
    # GetStatus carries its summary (blocks per mode), GetJobPlan all of it.
    session = auto["session"]
    assert not session["plan"].get("block_modes")
    assert not session["plan"].get("blocks")
    counts: Dict[str, int] = {}
    for mode in plan["blockModes"]:
        counts[mode] = counts.get(mode, 0) + 1
    assert session["plan"]["block_mode_counts"] == counts
    assert auto["kept_plan"] == plan
    assert int(session["planned_iterations"]) == 3
    assert float(session["planned_mean_iteration_seconds"]) > 0


def test_a_small_device_sends_saved_tensors_to_the_ssds(lohand):
    """The model's working set is about 300 KB (weights, gradients,
    logits) and its blocks save about 400 KB: with 450 KB of device memory
    and no host room, the first blocks' tensors (backward needs them last)
    go to the SSDs; still exact."""
    keep = _train(lohand, activations="keep")
    auto = _train(lohand, activations="auto", activation_host_bytes=0,
                  device_memory_bytes=450_000)
    _assert_same(keep, auto)
    decisions = _decisions(auto["plan"])
    decided = [d for block in decisions for d in block]
    assert "host" not in decided  # no host room
    assert decisions[0].count("ssd") >= decisions[-1].count("ssd")
    assert "ssd" in decided and auto["stats"].ssd_puts > 0
    assert int(auto["plan"]["ssdBytes"]) > 0


def test_a_plan_lohand_cannot_make_leaves_offload_with_a_warning(lohand):
    keep = _train(lohand, activations="keep")
    with pytest.warns(UserWarning, match="could not get a plan"):
        auto = _train(lohand, activations="auto", device_memory_bytes=1)
    _assert_same(keep, auto)
    assert auto["plan"] is None
    assert "plan" not in auto["session"]


def test_device_memory_bytes_needs_auto_and_a_positive_int(lohand):
    for activations, value in (("offload", 1 << 30), ("auto", 0),
                               ("auto", -1), ("auto", "24GB"),
                               ("auto", 1.5e9)):
        with pytest.raises(ValueError, match="device_memory_bytes"):
            engine_for(tiny_gpt(), lohand, activations=activations,
                       device_memory_bytes=value, job_name="auto-bad")
    # Refused before any job was made: nothing left on the daemon.
    with lohan.Client(lohand.socket) as client:
        assert all(j.name != "auto-bad" for j in client.jobs())
