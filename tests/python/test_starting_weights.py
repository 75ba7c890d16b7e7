"""Real checkpoints in and out: a model built on the meta device starts
from a Hugging Face checkpoint (lohan.init(model, weights=PATH)), a layer
at a time through lohand, and engine.save_pretrained writes it back as
transformers writes it. Against transformers' own from_pretrained: the
first loss the same, and at lr 0 every tensor saved equal to the one
loaded, bit for bit."""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, GPT2Config, LlamaConfig,
                          PretrainedConfig)

import lohan
from lohan.starting_weights import CheckpointMismatch

BATCH = torch.randint(0, 128, (2, 16),
                      generator=torch.Generator().manual_seed(1))


def gpt2(layers: int = 2, width: int = 64, tied: bool = True) -> GPT2Config:
    return GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=128,
                      n_positions=64, bos_token_id=0, eos_token_id=0,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      tie_word_embeddings=tied)


def llama(layers: int = 2) -> LlamaConfig:
    # Grouped-query attention, RMSNorm, rotary buffers, an untied head.
    return LlamaConfig(num_hidden_layers=layers, hidden_size=64,
                       intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=128,
                       tie_word_embeddings=False, bos_token_id=0,
                       eos_token_id=0)


CONFIGS = {"gpt2-tied": gpt2, "gpt2-untied": lambda: gpt2(tied=False),
           "llama": llama}


def saved(directory: Path, config: PretrainedConfig,
          dtype: torch.dtype = torch.bfloat16,
          shard: str = "20KB") -> Path:
    """A checkpoint as save_pretrained writes it, in shards."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    model.save_pretrained(directory, max_shard_size=shard)
    return directory


def on_meta(config: PretrainedConfig) -> torch.nn.Module:
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config).eval()


def reference(directory: Path, dtype: torch.dtype) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()


def stored(directory: Path) -> Dict[str, torch.Tensor]:
    tensors: Dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def stored_names(directory: Path) -> List[str]:
    names: List[str] = []
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, framework="pt") as file:
            names += list(file.keys())
    return sorted(names)


@pytest.mark.parametrize("params", ["offload", "resident"])
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_meta_model_trains_from_a_checkpoint_and_saves_it_back(
        lohand, tmp_path, kind, params):
    config = CONFIGS[kind]()
    directory = saved(tmp_path / "in", config)
    expected = reference(directory, torch.bfloat16)(BATCH, labels=BATCH).loss
    model = on_meta(config)
    engine = lohan.init(model, weights=directory, params=params,
                        dtype=torch.bfloat16, lr=0.0, socket=lohand.socket)
    loss = model(BATCH, labels=BATCH).loss
    assert torch.equal(loss, expected), (loss, expected)
    engine.backward(loss)
    engine.step()
    out = Path(engine.save_pretrained(tmp_path / "out",
                                      max_shard_size="30KB"))
    engine.close(delete_job=True)
    assert {p.device.type for p in model.parameters()} == {"meta"}

    # At lr 0 the masters are the loaded values: every tensor written
    # equals the one read, in the checkpoint's dtype, under its name.
    before, after = stored(directory), stored(out)
    assert sorted(after) == sorted(before)
    for name, tensor in before.items():
        assert after[name].dtype == torch.bfloat16, name
        assert torch.equal(after[name], tensor), name
    assert json.loads((out / "model.safetensors.index.json").read_text())[
        "weight_map"].keys() == before.keys()
    loaded = reference(out, torch.bfloat16)
    assert torch.equal(loaded(BATCH, labels=BATCH).loss, expected)


def test_trained_weights_saved_are_the_masters_rounded(lohand, tmp_path):
    config = gpt2()
    directory = saved(tmp_path / "in", config, dtype=torch.float32,
                      shard="5GB")
    model = on_meta(config)
    engine = lohan.init(model, weights=directory / "model.safetensors",
                        params="offload", lr=1e-2, socket=lohand.socket)
    for _ in range(2):
        engine.backward(model(BATCH, labels=BATCH).loss)
        engine.step()
    masters = engine.master_weights()
    out = Path(engine.save_pretrained(tmp_path / "out",
                                      dtype=torch.bfloat16))
    engine.close(delete_job=True)
    assert sorted(os.listdir(out)) == ["config.json",
                                       "generation_config.json",
                                       "model.safetensors"]
    written = load_file(out / "model.safetensors")
    assert "lm_head.weight" not in written  # tied: stored once
    changed = 0
    for name, tensor in written.items():
        assert torch.equal(tensor, masters[name].to(torch.bfloat16)), name
        changed += not torch.equal(tensor, stored(directory)[name].to(
            torch.bfloat16))
    assert changed > 0
    assert json.loads((out / "config.json").read_text())["dtype"] == (
        "bfloat16")


def _job_names(socket: str):
    with lohan.Client(socket) as client:
        return [job.name for job in client.jobs()]


DAMAGED = (ValueError, FileNotFoundError, lohan.LohanError, OSError)


def _refused(lohand, model: torch.nn.Module, weights: object,
             *expected: str, kind: object = DAMAGED) -> None:
    """lohan.init refuses `weights` (raising `kind`) naming each of
    `expected`, leaves no job and gives the model back on meta; lohand
    serves on."""
    with pytest.raises(kind) as refused:
        lohan.init(model, weights=weights, params="offload",
                   socket=lohand.socket, job_name="refused")
    for text in expected:
        assert text in str(refused.value), str(refused.value)
    assert "refused" not in _job_names(lohand.socket)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert {b.device.type for b in model.buffers()} <= {"meta"}


def _rewrite(path: Path, change) -> None:
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _index(directory: Path) -> Dict[str, str]:
    return json.loads((directory / "model.safetensors.index.json")
                      .read_text())["weight_map"]


def test_checkpoints_not_of_the_model_are_refused_by_name(lohand, tmp_path):
    config = gpt2()
    directory = saved(tmp_path / "ckpt", config)
    shard = directory / _index(directory)["transformer.h.1.mlp.c_fc.weight"]
    original = shard.read_bytes()

    index_path = directory / "model.safetensors.index.json"
    index = index_path.read_text()

    def mapped(change) -> None:
        contents = json.loads(index)
        change(contents["weight_map"])
        index_path.write_text(json.dumps(contents))

    _rewrite(shard, lambda t: t.pop("transformer.h.1.mlp.c_fc.weight"))
    mapped(lambda names: names.pop("transformer.h.1.mlp.c_fc.weight"))
    _refused(lohand, on_meta(config), directory, "missing",
             "transformer.h.1.mlp.c_fc.weight",
             kind=CheckpointMismatch)
    shard.write_bytes(original)

    _rewrite(shard, lambda t: t.update(
        {"transformer.h.1.mlp.extra": torch.zeros(3, dtype=torch.bfloat16)}))
    mapped(lambda names: names.update(
        {"transformer.h.1.mlp.extra": shard.name}))
    _refused(lohand, on_meta(config), directory, "unexpected",
             "transformer.h.1.mlp.extra",
             kind=CheckpointMismatch)
    shard.write_bytes(original)
    index_path.write_text(index)

    _refused(lohand, on_meta(gpt2(width=32)), directory, "shape",
             "transformer.wte.weight",
             kind=CheckpointMismatch)

    _rewrite(shard, lambda t: t.update({
        "transformer.h.1.mlp.c_fc.weight": torch.zeros(
            t["transformer.h.1.mlp.c_fc.weight"].shape, dtype=torch.int64)}))
    _refused(lohand, on_meta(config), directory,
             "transformer.h.1.mlp.c_fc.weight", "I64",
             kind=CheckpointMismatch)
    shard.write_bytes(original)

    # The checkpoint whole again: it loads (the refusals left nothing).
    engine = lohan.init(on_meta(config), weights=directory,
                        params="offload", socket=lohand.socket,
                        job_name="accepted")
    engine.close(delete_job=True)


def test_damaged_checkpoints_are_refused_naming_the_file(lohand, tmp_path):
    config = gpt2()
    directory = saved(tmp_path / "ckpt", config)
    shard = directory / _index(directory)["transformer.h.0.attn.c_attn.weight"]
    original = shard.read_bytes()

    shard.write_bytes(original[:len(original) - 100])  # cut short
    _refused(lohand, on_meta(config), directory, shard.name)
    shard.write_bytes(struct.pack("<Q", 1 << 40) + original[8:])
    _refused(lohand, on_meta(config), directory, shard.name)
    shard.write_bytes(original[:8] + b"not json" + original[16:])
    _refused(lohand, on_meta(config), directory, shard.name)
    shard.unlink()  # the index names a file that is not there
    _refused(lohand, on_meta(config), directory, shard.name)

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    _refused(lohand, on_meta(config), tmp_path / "empty", "empty")
    _refused(lohand, on_meta(config), tmp_path / "nowhere", "nowhere")


def test_a_meta_model_needs_weights_and_bad_weights_options_are_refused(
        lohand, tmp_path):
    with pytest.raises(ValueError, match="meta device.*weights=PATH"):
        lohan.init(on_meta(gpt2()), socket=lohand.socket)
    with pytest.raises(TypeError, match="weights=3"):
        lohan.init(on_meta(gpt2()), weights=3, socket=lohand.socket)
    with pytest.raises(ValueError, match="both say where the weights"):
        lohan.init(on_meta(gpt2()), weights=tmp_path, resume=True,
                   socket=lohand.socket)
    assert _job_names(lohand.socket) == []


def private_mounts() -> bool:
    """Whether this process may mount a tmpfs in a mount namespace of its
    own (root, as in CI)."""
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private",
                               "true"], capture_output=True,
                              timeout=60).returncode == 0
    except FileNotFoundError:
        return False


# Run in a mount namespace whose `small` is a tmpfs that holds one save
# of the model and not two: the second save runs out of space half-way.
FULL_DISK = """
import json, os, sys
from pathlib import Path
import torch
sys.path.insert(0, sys.argv[4])
import lohan
from test_starting_weights import BATCH, gpt2, on_meta
socket, weights, small = sys.argv[1], sys.argv[2], Path(sys.argv[3])
model = on_meta(gpt2())
engine = lohan.init(model, weights=weights, params="offload",
                    dtype=torch.bfloat16, socket=socket)
out = small / "out"
engine.save_pretrained(out)
(out / "tokenizer.json").write_text("{}")  # the user's own file
files = sorted(os.listdir(out))
before = (out / "model.safetensors").read_bytes()
engine.backward(model(BATCH, labels=BATCH).loss)
engine.step()
try:
    engine.save_pretrained(out)
    failure = None
except OSError as error:
    failure = error.errno
result = {"failure": failure, "kept": sorted(os.listdir(out)) == files,
          "same": (out / "model.safetensors").read_bytes() == before,
          "left": sorted(os.listdir(small))}
# The job goes on: another step, a save elsewhere.
engine.backward(model(BATCH, labels=BATCH).loss)
engine.step()
engine.save_pretrained(Path(weights).parent / "elsewhere")
result["iteration"] = engine.iteration
engine.close(delete_job=True)
print(json.dumps(result))
"""


@pytest.mark.skipif(not private_mounts(),
                    reason="needs unshare -m (a mount namespace)")
def test_a_save_pretrained_that_runs_out_of_space_leaves_all_as_it_was(
        lohand, tmp_path):
    directory = saved(tmp_path / "in", gpt2(), shard="5GB")
    size = (directory / "model.safetensors").stat().st_size
    small = tmp_path / "small"
    small.mkdir()
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK)
    run = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f'mount -t tmpfs -o size={size * 3 // 2} lohan-test "$0" && '
         'exec "$@"', str(small), sys.executable, str(script),
         lohand.socket, str(directory), str(small),
         str(Path(__file__).parent)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"failure": errno.ENOSPC, "kept": True, "same": True,
                      "left": ["out"], "iteration": 2}, result
    assert (tmp_path / "elsewhere" / "model.safetensors").exists()


class Tokens(torch.utils.data.Dataset):
    def __init__(self, samples: int = 12, length: int = 16) -> None:
        generator = torch.Generator().manual_seed(2)
        self.ids = torch.randint(0, 128, (samples, length),
                                 generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_lohan_trainer_trains_a_meta_model_as_the_loaded_one(lohand,
                                                              tmp_path):
    from transformers import TrainingArguments
    from lohan.integrations.transformers import LohanTrainer

    config = gpt2()
    directory = saved(tmp_path / "in", config, dtype=torch.float32)

    def run(model: torch.nn.Module, options: Dict[str, object],
            name: str) -> list:
        args = TrainingArguments(
            output_dir=str(tmp_path / name), max_steps=3,
            per_device_train_batch_size=4, learning_rate=1e-2,
            logging_steps=1, save_strategy="no", report_to=[],
            use_cpu=True, seed=0)
        trainer = LohanTrainer(model=model, args=args,
                               train_dataset=Tokens(),
                               lohan={"socket": lohand.socket,
                                      "params": "offload", **options})
        trainer.train()
        trainer.save_model(str(tmp_path / name / "final"))
        trainer.close_engine()
        return [entry["loss"] for entry in trainer.state.log_history
                if "loss" in entry]

    loaded = run(AutoModelForCausalLM.from_pretrained(directory), {},
                 "loaded")
    meta = run(on_meta(config).train(), {"weights": directory}, "meta")
    assert meta == loaded
    ours, theirs = (stored(tmp_path / "meta" / "final"),
                    stored(tmp_path / "loaded" / "final"))
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name


# One depth of GPT-2 (width 1024, bf16 shards): "save" writes the
# checkpoint; "train" builds the model on meta, loads it, takes a step,
# saves it back and prints its peak RSS.
DEPTH = """
import json, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, GPT2Config
mode, layers, where = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
# The test's own thread count: a bf16 product's rounding can depend on it
# (on CPUs with AVX-512 BF16), and the loss is compared bit for bit.
torch.set_num_threads(int(sys.argv[5]))
IDS = torch.randint(0, 8192, (1, 32),
                    generator=torch.Generator().manual_seed(0))
config = GPT2Config(n_layer=layers, n_embd=1024, n_head=16, vocab_size=8192,
                    n_positions=128, bos_token_id=0, eos_token_id=0)
if mode == "save":
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16
                                     ).save_pretrained(
        where / "in", max_shard_size="200MB")
    sys.exit(0)
import lohan
with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(config).eval()
engine = lohan.init(model, weights=where / "in", params="offload",
                    dtype=torch.bfloat16, lr=0.0, socket=sys.argv[4])
loss = model(IDS, labels=IDS).loss
engine.backward(loss)
engine.step()
engine.save_pretrained(where / "out", max_shard_size="200MB")
engine.close(delete_job=True)
# VmHWM: this process's own peak (ru_maxrss would count the parent's,
# which the child was forked from, up to its exec).
peak = next(int(line.split()[1]) * 1024 for line in
            open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"peak": peak, "loss": loss.item()}))
"""
IDS = torch.randint(0, 8192, (1, 32),
                    generator=torch.Generator().manual_seed(0))


def _same_tensors(a: Path, b: Path) -> None:
    """The two checkpoints hold the same tensors bit for bit (read one at
    a time)."""
    assert stored_names(a) == stored_names(b)
    files = {name: path for path in b.glob("*.safetensors")
             for name in safe_open(path, framework="pt").keys()}
    for path in sorted(a.glob("*.safetensors")):
        with safe_open(path, framework="pt") as mine:
            for name in mine.keys():
                with safe_open(files[name], framework="pt") as theirs:
                    assert torch.equal(mine.get_tensor(name),
                                       theirs.get_tensor(name)), name


def test_the_training_process_holds_a_few_layers_whatever_the_depth(
        tmp_path):
    # GPT-2, width 1024, bf16 shards, built on meta, params="offload", a
    # step at lr 0, save_pretrained. The training process's peak RSS
    # (loading, the step, saving) grows by at most a quarter of the extra
    # checkpoint bytes from 4 to 24 blocks (measured: 1,103 and 1,108 MiB,
    # +5 MiB for 481 MiB more checkpoint); the first loss is the
    # checkpoint's own forward in transformers; what it saves is what it
    # loaded, bit for bit, and transformers loads it.
    from conftest import Daemon
    (tmp_path / "lohand").mkdir()
    daemon = Daemon(tmp_path / "lohand", host_pool="256MiB",
                    ssd_capacity="12GiB")
    script = tmp_path / "depth.py"
    script.write_text(DEPTH)
    env = dict(os.environ, PYTHONPATH=str(Path(lohan.__file__).parents[1]))
    peaks, sizes = {}, {}
    try:
        for layers in (4, 24):
            where = tmp_path / f"depth{layers}"
            where.mkdir()
            for mode in ("save", "train"):
                run = subprocess.run(
                    [sys.executable, str(script), mode, str(layers),
                     str(where), daemon.socket,
                     str(torch.get_num_threads())], capture_output=True,
                    text=True, env=env, timeout=900)
                assert run.returncode == 0, run.stderr[-4000:]
            found = json.loads(run.stdout.strip().splitlines()[-1])
            peaks[layers] = found["peak"]
            sizes[layers] = sum(p.stat().st_size
                                for p in (where / "in").glob("*.safetensors"))
            loaded = reference(where / "in", torch.bfloat16)
            assert found["loss"] == loaded(IDS, labels=IDS).loss.item()
            del loaded
            _same_tensors(where / "out", where / "in")
            AutoModelForCausalLM.from_pretrained(where / "out")
            subprocess.run(["rm", "-rf", str(where)], check=True)
    finally:
        daemon.stop()
    growth, extra = peaks[24] - peaks[4], sizes[24] - sizes[4]
    print(f"peak RSS {peaks[4] / 2**20:.0f} MiB at 4 blocks, "
          f"{peaks[24] / 2**20:.0f} MiB at 24: +{growth / 2**20:.0f} MiB "
          f"for {extra / 2**20:.0f} MiB more checkpoint")
    assert growth <= extra / 4, (peaks, sizes)


def _lora(model: torch.nn.Module, meta: bool) -> torch.nn.Module:
    import peft
    from lohan.integrations.peft import get_peft_model
    torch.manual_seed(3)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"],
                             fan_in_fan_out=True)
    return (get_peft_model if meta else peft.get_peft_model)(model, config)


def _adapters(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {name: param.detach().clone()
            for name, param in model.named_parameters()
            if param.requires_grad}


def test_lora_over_a_meta_base_trains_as_over_the_loaded_base(lohand,
                                                              tmp_path):
    # The base's frozen block weights go to lohand's SSDs one tensor at a
    # time (frozen_host_bytes=0), never all in this process.
    peft = pytest.importorskip("peft")
    config = gpt2()
    directory = saved(tmp_path / "in", config, dtype=torch.float32)
    loaded = _lora(AutoModelForCausalLM.from_pretrained(directory).eval(),
                   meta=False)
    meta = _lora(on_meta(config), meta=True)
    assert {p.device.type for p in meta.parameters() if p.requires_grad} == {
        "cpu"}
    start = _adapters(loaded)
    assert sorted(_adapters(meta)) == sorted(start)
    for name, value in _adapters(meta).items():
        assert torch.equal(value, start[name]), name

    runs = {}
    for kind, model, options in (
            ("loaded", loaded, {}),
            ("meta", meta, {"weights": directory, "frozen_host_bytes": 0})):
        engine = lohan.init(model, params="offload", lr=1e-2,
                            socket=lohand.socket, job_name=kind, **options)
        losses = []
        for _ in range(3):
            loss = model(BATCH, labels=BATCH).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        if kind == "meta":
            assert engine._frozen.ssd_bytes > 0
            assert engine._frozen.host_bytes == 0
        out = Path(engine.save_pretrained(tmp_path / kind))
        runs[kind] = (losses, load_file(out / "adapter_model.safetensors"))
        if kind == "meta":
            merged = Path(engine.save_pretrained(tmp_path / "merged",
                                                 merged=True))
        engine.close(delete_job=True)
    assert runs["meta"][0] == runs["loaded"][0]
    ours, theirs = runs["meta"][1], runs["loaded"][1]
    assert sorted(ours) == sorted(theirs) and len(ours) == 4
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    # The base is back on meta; the adapters, trained, are where they were.
    assert {p.device.type for n, p in meta.named_parameters()
            if "lora_" not in n} == {"meta"}
    trained = _adapters(meta)
    assert any(not torch.equal(trained[n], start[n]) for n in start)
    # peft loads the adapters onto a loaded base as it wrote them.
    base = AutoModelForCausalLM.from_pretrained(directory)
    again = peft.PeftModel.from_pretrained(base, tmp_path / "meta")
    for name, value in _adapters(meta).items():
        assert torch.equal(dict(again.named_parameters())[name], value), name
    # merged=True: the base with the adapters merged, as peft's
    # merge_and_unload merges them on the loaded base; transformers loads
    # it.
    want = again.merge_and_unload().state_dict()
    written = stored(merged)
    assert sorted(written) == sorted(stored(directory))
    for name, tensor in written.items():
        assert torch.equal(tensor, want[name]), name
    assert not torch.equal(written["transformer.h.0.attn.c_attn.weight"],
                           stored(directory)[
                               "transformer.h.0.attn.c_attn.weight"])
    AutoModelForCausalLM.from_pretrained(merged)


def test_save_pretrained_refuses_bad_arguments_and_writes_nothing(lohand,
                                                                  tmp_path):
    config = gpt2()
    directory = saved(tmp_path / "in", config)
    engine = lohan.init(on_meta(config), weights=directory,
                        params="offload", socket=lohand.socket)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="max_shard_size='5 bananas'"):
        engine.save_pretrained(out, max_shard_size="5 bananas")
    with pytest.raises(ValueError, match="max_shard_size=0"):
        engine.save_pretrained(out, max_shard_size=0)
    with pytest.raises(TypeError, match="dtype=torch.int64"):
        engine.save_pretrained(out, dtype=torch.int64)
    with pytest.raises(ValueError, match="merged=True merges a peft"):
        engine.save_pretrained(out, merged=True)
    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(NotADirectoryError, match="a-file"):
        engine.save_pretrained(tmp_path / "a-file")
    assert (tmp_path / "a-file").read_text() == "mine"
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # The engine saves as it should afterwards.
    engine.save_pretrained(out)
    assert stored_names(out) == stored_names(directory)
    engine.close(delete_job=True)
