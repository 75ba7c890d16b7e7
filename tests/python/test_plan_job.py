"""PlanJob against a real lohand: a training process sends its profile (a
hand-written one here) and gets its activation plan, kept with its session;
hostile profiles are refused by name and the daemon goes on serving."""

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from typing import Dict

import pytest

from conftest import REPO, Daemon, built
from lohan import Client, LohanError, StatusCode
from lohan.model_spec import ModelSpec

MIB = 1 << 20
DECISIONS = {"device", "host", "ssd", "recompute"}
MODES = {"keep", "offload", "swap", "mixed"}


def profile(**overrides):
    """4 blocks of 6 saved tensors (the second always offloaded: backward
    cannot make it again), on a device with room for the working set and
    2 MiB more."""
    tensors = [
        {"name": "aten.native_layer_norm", "bytes": MIB,
         "recomputeFlops": 1e6},
        {"name": "aten.native_dropout", "bytes": MIB,
         "recomputeFlops": 1e12, "alwaysOffloaded": True},
        {"name": "aten.addmm", "bytes": 3 * MIB, "recomputeFlops": 5e9},
        {"name": "aten.bmm", "bytes": MIB, "recomputeFlops": 1e9},
        {"name": "aten.gelu", "bytes": 4 * MIB, "recomputeFlops": 4e6},
        {"name": "aten.addmm", "bytes": 4 * MIB, "recomputeFlops": 6e9},
    ]
    block_params, head_params, logits = 1_000_000, 1_000_000, MIB
    # Always two blocks' weights and the head's weights and gradients, then
    # a block's backward (its gradients, its tensors and the gradient of
    # its largest), larger than the loss (plan/working_set.h WorkingSetOf).
    working = 4 * block_params + 4 * head_params + (
        2 * block_params + 14 * MIB + 4 * MIB)
    out = {
        "deviceBytes": working + 2 * MIB,
        "deviceFlops": 1e12,
        "hostToDeviceBytesPerSecond": 1e12,
        "deviceToHostBytesPerSecond": 1e12,
        "blocks": 4,
        "parameters": 6_000_000,
        "blockParameters": block_params,
        "largestLayerParameters": block_params,
        "headParameters": head_params,
        "firstLayerParameters": head_params,
        "forwardFlops": 4 * 20e9 + 1e9,
        "blockForwardFlops": 20e9,
        "outsideSavedBytes": logits,
        "blockTensors": tensors,
        "iterationSeconds": 0.5,
        "batch": 2,
        "seq": 128,
    }
    out.update(overrides)
    return out


def request(**overrides):
    return {"profile": profile(**overrides), "activationHostBytes": 4 * MIB}


def wait_for_profile(client):
    """lohand measures its machine when it starts; PlanJob needs that."""
    deadline = time.monotonic() + 120  # bounds a hung measurement only
    while "profile" not in client.status():
        assert time.monotonic() < deadline, "lohand never measured its machine"
        time.sleep(0.05)


class Trainer:
    """A process's job: attached, its data plane open, a 6-layer model
    registered with its weights."""

    def __init__(self, client, name="planned", register=True, spec=None):
        self.client = client
        self.job = client.create_job(name, host_pool_bytes=4 * MIB)
        client.attach_job(self.job.id)
        self.plane = client.open_data_plane(self.job.id)
        self.model = None
        if register:
            self.sizes = ([256] * 6 if spec is None
                          else [int(n) for n in spec["layer_elements"]])
            self.model = self.plane.register_model(
                self.job.id, self.sizes if spec is None else spec)
            for layer in range(len(self.sizes)):
                self.model.init_weights(layer)

    def step(self):
        self.model.iter_begin()
        for layer in range(len(self.sizes)):
            self.model.fetch_params(layer)
        for layer in reversed(range(len(self.sizes))):
            self.model.grad_ready(layer)
        self.model.iter_end()

    def session(self):
        sessions = self.client.status()["sessions"]
        return next(s for s in sessions if s["job_id"] == self.job.id)


def check_plan(plan, per_block=False):
    assert len(plan["blocks"]) == 4
    assert len(plan["blockModes"]) == 4
    for block, mode in zip(plan["blocks"], plan["blockModes"]):
        decisions = block["decisions"]
        assert len(decisions) == 6
        assert set(decisions) <= DECISIONS
        assert decisions[1] != "recompute"  # always offloaded
        assert mode in MODES
        if per_block:
            assert mode != "mixed"
    assert int(plan["hostBytes"]) <= 4 * MIB
    assert plan["searchCase"] in (1, 2, 3)
    assert plan["predictedIterationSeconds"] > 0
    assert plan["profiledIterationSeconds"] == 0.5
    assert plan["forwardBinding"] and plan["backwardBinding"]


def test_a_job_gets_its_plan_and_status_follows_it(lohand):
    with Client(lohand.socket) as client:
        wait_for_profile(client)
        trainer = Trainer(client)
        trainer.step()  # the profiling iteration
        plan = client.plan_job(trainer.job.id, request())
        check_plan(plan)
        # What did not fit the host's room went to the SSDs.
        assert int(plan["ssdBytes"]) + int(plan["hostBytes"]) + int(
            plan["deviceBytes"]) + int(plan["recomputedBytes"]) == 4 * 14 * MIB
        session = trainer.session()
        assert session["plan"]["search_case"] == plan["searchCase"]
        # Summarised in the status; whole from kept_plan.
        counts: Dict[str, int] = {}
        for mode in plan["blockModes"]:
            counts[mode] = counts.get(mode, 0) + 1
        assert session["plan"]["block_mode_counts"] == counts
        assert client.kept_plan(trainer.job.id) == plan
        assert int(session["planned_iterations"]) == 0
        for _ in range(3):
            trainer.step()
        session = trainer.session()
        assert int(session["planned_iterations"]) == 3
        assert session["planned_mean_iteration_seconds"] > 0
        assert int(session["session_iterations"]) == 4
        # Per block, a new plan replaces the old one and counts afresh.
        per_block = client.plan_job(trainer.job.id,
                                    dict(request(), perBlock=True))
        check_plan(per_block, per_block=True)
        assert int(trainer.session()["planned_iterations"]) == 0
        trainer.step()
        assert int(trainer.session()["planned_iterations"]) == 1


def test_the_weight_unit_is_the_one_the_job_registered(lohand):
    """The request does not say how the job's weights stream: lohand
    takes it from the model the job registered (ModelSpec.layer_places,
    which the model cut fills). On a device with room for two sublayers'
    weights but not two whole blocks', a job registered a sublayer at a
    time (per block its own layer and two units, a tenth, three tenths
    and six tenths of it) gets its plan; one registered a block at a time,
    or by an older client that says no places, is refused as before."""
    own, attention, mlp = 100, 300, 600  # shares of profile()'s 1M block
    places = [{"block": -1}, {"block": -1}]
    elements = [256, 256]
    for block in range(4):
        for unit, share in enumerate((own, attention, mlp)):
            places.append({"block": block, "unit": unit})
            elements.append(share)

    def spec_of(layer_elements, layer_places=None):
        proto = ModelSpec(layer_elements=layer_elements).to_proto()
        if layer_places is not None:
            proto["layer_places"] = layer_places
        return proto

    sublayers = spec_of(elements, places)
    whole = spec_of([256, 256] + [own + attention + mlp] * 4,
                 [{"block": b} for b in (-1, -1, 0, 1, 2, 3)])
    no_places = spec_of(whole["layer_elements"])
    # Always two units' weights, two blocks' own and the head's weights
    # and gradients; then a unit's gradients and the block's own, its
    # tensors and its largest's gradient (plan/working_set.h).
    block_params, head_params = 1_000_000, 1_000_000
    unit_working = (2 * (2 * 100_000 + 600_000 + 300_000) + 4 * head_params
                    + 2 * (100_000 + 600_000) + 18 * MIB)
    block_working = 4 * block_params + 4 * head_params + (
        2 * block_params + 18 * MIB)
    between = (unit_working + block_working) // 2
    with Client(lohand.socket) as client:
        wait_for_profile(client)
        for name, spec in (("whole", whole), ("no-places", no_places)):
            trainer = Trainer(client, f"unit-{name}", spec=spec)
            with pytest.raises(LohanError) as error:
                client.plan_job(trainer.job.id, request(deviceBytes=between))
            assert error.value.code == StatusCode.FAILED_PRECONDITION, name
            assert "two blocks' weights" in error.value.message, name
            plan = client.plan_job(trainer.job.id, request())
            assert plan["paramUnit"] == "block", name
            assert int(plan["deviceWorkingBytes"]) == block_working, name
        trainer = Trainer(client, "unit-sublayer", spec=sublayers)
        trainer.step()
        plan = client.plan_job(trainer.job.id, request(deviceBytes=between))
        check_plan(plan)
        assert plan["paramUnit"] == "sublayer"
        assert int(plan["deviceWorkingBytes"]) == unit_working
        assert int(plan["blockWeightsWorkingBytes"]) == block_working
        assert trainer.session()["plan"]["param_unit"] == "sublayer"
        trainer.step()
        assert int(trainer.session()["planned_iterations"]) == 1


def test_hostile_requests_are_invalid_argument_and_lohand_serves_on(lohand):
    with Client(lohand.socket) as client:
        wait_for_profile(client)
        trainer = Trainer(client)

        def refused(body):
            with pytest.raises(LohanError) as error:
                client.plan_job(trainer.job.id, body)
            assert error.value.code == StatusCode.INVALID_ARGUMENT, error.value
            return error.value.message

        # JSON that does not parse, straight through the C ABI.
        lib, text = client._lib, ctypes.c_void_p()
        status = lib.lohan_job_plan_json(client._handle,
                                         trainer.job.id.encode(),
                                         b'{"profile": {"blocks": ',
                                         ctypes.byref(text))
        assert status == StatusCode.INVALID_ARGUMENT
        assert b"PlanJobRequest" in lib.lohan_last_error()
        assert "noSuchField" in refused({"noSuchField": 1})
        assert "profile.blocks" in refused(request(blocks=0))
        assert "profile.blocks" in refused(request(blocks=70000))
        bad = profile()
        bad["blockTensors"][2]["recomputeFlops"] = -1.0
        assert "block_tensors[2].recompute_flops" in refused(
            {"profile": bad})
        assert "profile.block_tensors" in refused(request(
            blockTensors=[{"bytes": 1, "recomputeFlops": 1}] * 5000))
        assert "profile.device_flops" in refused(request(deviceFlops=0))
        assert "64 bits" in refused(request(blockTensors=[
            {"bytes": str(2 ** 64 - 1), "recomputeFlops": 1},
            {"bytes": "2", "recomputeFlops": 1}]))
        assert "block_parameters" in refused(request(parameters=10))
        assert "batch" in refused(request(batch=0))
        # A memory too short for any plan says which.
        with pytest.raises(LohanError) as error:
            client.plan_job(trainer.job.id, request(deviceBytes=MIB))
        assert error.value.code == StatusCode.FAILED_PRECONDITION
        assert "device's working set" in error.value.message
        # Still serving, the job's session unharmed.
        assert "plan" not in trainer.session()
        check_plan(client.plan_job(trainer.job.id, request()))
        trainer.step()
        assert int(trainer.session()["planned_iterations"]) == 1


def test_only_a_registered_model_is_planned(lohand):
    with Client(lohand.socket) as client:
        wait_for_profile(client)
        job = client.create_job("no-plane", host_pool_bytes=4 * MIB)
        client.attach_job(job.id)
        with pytest.raises(LohanError) as error:
            client.plan_job(job.id, request())
        assert error.value.code == StatusCode.FAILED_PRECONDITION
        trainer = Trainer(client, "unregistered", register=False)
        with pytest.raises(LohanError) as error:
            client.plan_job(trainer.job.id, request())
        assert error.value.code == StatusCode.FAILED_PRECONDITION
        assert "register the model first" in error.value.message
        # A job of ours that this process has not attached.
        detached = client.create_job("detached", host_pool_bytes=4 * MIB)
        with pytest.raises(LohanError) as error:
            client.plan_job(detached.id, request())
        assert error.value.code == StatusCode.FAILED_PRECONDITION
        with pytest.raises(LohanError) as error:
            client.plan_job("j-999999", request())
        assert error.value.code == StatusCode.NOT_FOUND


NOBODY = """
import sys
from lohan.client import Client, LohanError
client = Client(sys.argv[1])
try:
    client.plan_job(sys.argv[2], {"profile": {"blocks": 1}})
    print("OK")
except LohanError as error:
    print(error.code.name)
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run as nobody")
def test_another_users_job_is_not_found():
    # nobody must reach the socket, the library and the package: a public
    # directory, a copy of the library.
    directory = Path(tempfile.mkdtemp(prefix="lohan-plan-", dir="/tmp"))
    try:
        directory.chmod(0o755)
        shutil.copy(built("client/liblohan_client.so"), directory)
        daemon = Daemon(directory)
        try:
            with Client(daemon.socket) as client:
                wait_for_profile(client)
                trainer = Trainer(client)
                check_plan(client.plan_job(trainer.job.id, request()))
                result = subprocess.run(
                    ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                     "--clear-groups", "/usr/bin/python3", "-c", NOBODY,
                     daemon.socket, trainer.job.id],
                    capture_output=True, text=True, timeout=120,
                    env={"PYTHONPATH": str(REPO / "plugins" / "pytorch"),
                         "LOHAN_CLIENT_LIB": str(
                             directory / "liblohan_client.so"),
                         "PYTHONDONTWRITEBYTECODE": "1"})
                assert result.returncode == 0, result.stderr
                assert result.stdout.strip() == "NOT_FOUND"
                # Root's plan is untouched.
                assert "plan" in trainer.session()
        finally:
            daemon.stop(signal.SIGKILL)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
