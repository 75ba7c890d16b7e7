"""The planner's memory model against a real run: for a GPT-2 and a Llama
config, each trained through lohan.init on a real lohand in the layout
`lohanctl plan` picks for a described machine (a buffer per layer,
streamed buffers, and a buffer per layer with activations spilled to the
SSDs), what the daemon allocates is what the plan says, byte for byte:
the arena, the update pipeline's chunk buffers, the SSD space set aside
for the updates, and what the job keeps on the SSDs (sizes and block-
rounded space) once its session has closed."""

import json
import subprocess
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM)

import lohan
from conftest import arena_bytes, built
from lohan.blocks import find_blocks, plan_layers

MIB = 1 << 20
# Links and SSDs; the device and host memory are chosen per layout below.
# --host-memory is lohand's pool alone (no state tier taken from it): the
# layout under test is the pool's.
RATES = ["--h2d-gbps", "25", "--d2h-gbps", "25", "--ssds", "1",
         "--ssd-read-gbps", "2", "--ssd-write-gbps", "2", "--state-tier", "0"]
ROOMY = ["--device-memory", "24GiB", "--device-tflops", "165",
         "--host-memory", "64GiB"]

# Twelve blocks: enough layers that four shared buffers of the largest,
# with the new weights lohand holds for their fetch (eight chunks'), take
# less host memory than one buffer per layer (the planner streams only
# then).
CONFIGS = {
    "gpt2": (GPT2Config(n_layer=12, n_embd=64, n_head=4, n_positions=256,
                        vocab_size=256, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0), GPT2LMHeadModel),
    "llama": (LlamaConfig(hidden_size=64, intermediate_size=172,
                          num_attention_heads=4, num_key_value_heads=2,
                          num_hidden_layers=12, vocab_size=256,
                          max_position_embeddings=256), LlamaForCausalLM),
}


def lohanctl_plan(config: Path, batch: int, seq: int, *machine: str) -> Any:
    result = subprocess.run(
        [str(built("client/ctl/lohanctl")), "plan", "--model", str(config),
         "--batch", str(batch), "--seq", str(seq), "--json", *RATES,
         *machine], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def config_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    CONFIGS[name][0].to_json_file(str(path))
    return path


def machine_for(config: Path, layout: str, batch: int, seq: int) -> list:
    """A described machine on which the planner picks `layout`: roomy
    ("resident"); host memory one byte short of a buffer per layer
    ("streamed"); or ("spilled") a device with no room beside its working
    set, a slow one (offloading beats recomputing), and a host with 64 KiB
    beside a buffer per layer and the activation area: the activations
    spill to the SSDs through the area."""
    roomy = lohanctl_plan(config, batch, seq, *ROOMY)["plans"][0]
    assert roomy["weights_in_host"] == 1
    if layout == "resident":
        return ROOMY
    if layout == "streamed":
        return ["--device-memory", "24GiB", "--device-tflops", "165",
                "--host-memory", str(roomy["host_fixed_bytes"] - 1)]
    host = roomy["host_fixed_bytes"] + 16 * MIB + 64 * 1024
    return ["--device-memory", str(roomy["device_working_bytes"]),
            "--host-memory", str(host), "--device-tflops", "0.001"]


def session_of(client: lohan.Client, job_id: str) -> Dict[str, Any]:
    return next(s for s in client.status()["sessions"]
                if s["job_id"] == job_id)


def train(model: torch.nn.Module, lohand, layout: str, batch: int, seq: int,
          activation_host_bytes: Optional[int]) -> Dict[str, Any]:
    """Two steps in `layout`; what the daemon reported while the session
    was open and after it closed."""
    tokens = torch.randint(0, 256, (batch, seq))
    options = {}
    if activation_host_bytes is not None:
        options["activation_host_bytes"] = activation_host_bytes
    engine = lohan.init(model, lr=1e-3, dtype="bf16", socket=lohand.socket,
                        job_name=f"memory-{layout}",
                        buffers="streamed" if layout == "streamed"
                        else "resident", **options)
    try:
        for _ in range(2):
            engine.backward(model(tokens, labels=tokens).loss)
            engine.step()
        engine.sync_weights()
        job_id = engine._job.id
        with lohan.Client(lohand.socket) as client:
            session = session_of(client, job_id)
    finally:
        engine.close()
    with lohan.Client(lohand.socket) as client:
        status = client.status()
    (job,) = [j for j in status["jobs"] if j["id"] == job_id]
    return {"session": session, "job": job, "quota": status["quota"],
            "layers": [layer.numel for layer in engine.layers]}


@pytest.mark.parametrize("layout", ["resident", "streamed", "spilled"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_plans_memory_is_what_lohand_allocates(lohand, tmp_path: Path,
                                                   name: str,
                                                   layout: str) -> None:
    config = config_file(tmp_path, name)
    batch, seq = (8, 256) if layout == "spilled" else (2, 64)
    out = lohanctl_plan(config, batch, seq,
                        *machine_for(config, layout, batch, seq))
    (plan,) = out["plans"]
    # The layout the planner took.
    assert plan["weights_in_host"] == (layout != "streamed")
    assert plan["stream_buffers"] == (4 if layout == "streamed" else 0)
    spilled = layout == "spilled"
    assert (plan["ssd_activation_bytes"] > 0) == spilled
    assert plan["activation_area_bytes"] == (16 * MIB if spilled else 0)

    torch.manual_seed(0)
    model_class = CONFIGS[name][1]
    model = model_class(CONFIGS[name][0])
    # The planner's layers are the plugin's cut of the model.
    assert out["layer_elements"] == [
        layer.numel for layer in plan_layers(model, find_blocks(model))]
    ran = train(model, lohand, layout, batch, seq,
                plan["host_activation_bytes"] if spilled else None)
    session, job, quota = ran["session"], ran["job"], ran["quota"]
    assert ran["layers"] == out["layer_elements"]

    # Host: the arena the daemon sized for the model (and sizes for the
    # same description again), and its chunk buffers beside it.
    assert int(session["arena_bytes"]) == plan["arena_bytes"]
    assert plan["arena_bytes"] == arena_bytes(
        lohand.socket, out["layer_elements"], "bf16",
        plan["stream_buffers"], plan["activation_area_bytes"])
    assert int(session["update_buffer_bytes"]) == plan["update_buffer_bytes"]
    assert plan["host_fixed_bytes"] == (plan["arena_bytes"]
                                        + plan["update_buffer_bytes"])
    layers = len(out["layer_elements"])
    slots = plan["stream_buffers"] or layers
    assert session["grad_slots"] == session["weight_slots"] == slots
    # SSDs: the space set aside for the updates while the session was open;
    # once it has closed, what the job keeps (the only job here, so its
    # owner's holding is the job's block-rounded space).
    assert int(session["ssd_set_aside_bytes"]) == plan["ssd_set_aside_bytes"]
    assert int(job["ssd_bytes"]) == plan["ssd_state_tensor_bytes"]
    assert int(quota["ssd_held_bytes"]) == plan["ssd_state_bytes"]
    # The set-aside holds the streamed gradients too.
    assert plan["ssd_fixed_bytes"] == plan["ssd_set_aside_bytes"]
    assert (plan["ssd_scratch_bytes"] > 0) == (layout == "streamed")
