"""Hugging Face Trainer through lohan (LohanTrainer) against Trainer with
torch's AdamW: the same script, seed and data, one class changed.

Tolerances: Trainer clips with torch's clip_grad_norm_ (an fp32 norm) and
lohand with an fp64 norm, so the clip coefficient differs in the last bits
from the first clipped step on; Adam's updates then differ by a few ulps
(test_engine.py). Measured over 20 steps of a 2-block GPT-2 at lr 5e-3,
clipping every step: logged losses within 1e-7 relative, grad norms within
1e-7, weights within 7e-6 absolute (2e-5 of a tensor's largest element)
but for the attention key bias (see assert_weights_match).
We assert losses and grad norms within 1e-5 relative and every weight
tensor within 1e-4 of its largest element; what a setting changes is far
larger (weight decay on a norm's weights alone moves them by ~1e-2).

bf16 (Trainer's bf16=True: autocast, fp32 weights): the first step is the
same bits; from the second on a one-ulp weight difference flips bf16
roundings in the forward, and the flips grow (the chaos test_engine.py
describes). Measured over 20 steps: losses within 7.4e-5, grad norms
within 2.1e-3, weights within 9.3e-3 of a tensor's largest element. We
assert 1e-3, 1e-2 and 3e-2: bounds on the forward's sensitivity, with the
first step pinned down exactly. fp16 (autocast and loss scaling, as
accelerate runs it on a GPU): the same bounds; measured 7.6e-6, 1.5e-4 and
1.3e-3, and the same loss scale after every step.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from lohan.client import Client  # noqa: E402
from lohan.integrations.transformers import LohanTrainer  # noqa: E402

TOLERANCES = {  # losses, grad norms, weights (see above)
    "fp32": (1e-5, 1e-5, 1e-4),
    "bf16": (1e-3, 1e-2, 3e-2),
    "fp16": (1e-3, 1e-2, 3e-2),
}
STEPS = 20
LR = 5e-3
KEY_BIAS = slice(32, 64)  # GPT-2's c_attn.bias is [q | k | v], n_embd 32


class TokenData(torch.utils.data.Dataset):
    """Random token sequences, the same for a given seed (nothing can be
    downloaded here)."""

    def __init__(self, samples: int, seed: int, length: int = 16):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (samples, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def gpt2(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=0, eos_token_id=0))


def lora(model: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(1)
    return peft.get_peft_model(model, peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"],
        lora_dropout=0.0))


def arguments(output_dir: Path, **overrides: Any) -> Any:
    settings = dict(
        use_cpu=True, report_to="none", disable_tqdm=True, seed=0,
        max_steps=STEPS, per_device_train_batch_size=2,
        gradient_accumulation_steps=2, learning_rate=LR, warmup_steps=4,
        lr_scheduler_type="cosine", weight_decay=0.1, max_grad_norm=0.3,
        optim="adamw_torch", logging_steps=1, save_strategy="steps",
        save_steps=10, eval_strategy="steps", eval_steps=10)
    settings.update(overrides)
    return transformers.TrainingArguments(str(output_dir), **settings)


def train(trainer_class: type, output_dir: Path, model: torch.nn.Module,
          resume: Any = None, **kwargs: Any) -> Tuple[Any, List[Dict]]:
    lohan = kwargs.pop("lohan", None)
    extra = {"lohan": lohan} if trainer_class is LohanTrainer else {}
    extra["callbacks"] = kwargs.pop("callbacks", None)
    trainer = trainer_class(model=model, args=arguments(output_dir, **kwargs),
                            train_dataset=TokenData(48, 1),
                            eval_dataset=TokenData(8, 2), **extra)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, trainer.state.log_history


def by_step(history: List[Dict], key: str) -> Dict[int, float]:
    return {h["step"]: h[key] for h in history if key in h}


def assert_logs_match(got: List[Dict], want: List[Dict],
                      precision: str = "fp32") -> None:
    loss_rtol, norm_rtol, _ = TOLERANCES[precision]
    for key, rtol in (("loss", loss_rtol), ("grad_norm", norm_rtol),
                      ("eval_loss", loss_rtol)):
        mine, theirs = by_step(got, key), by_step(want, key)
        assert mine.keys() == theirs.keys(), key
        for step in theirs:
            assert mine[step] == pytest.approx(theirs[step], rel=rtol), (
                key, step)
    assert by_step(got, "learning_rate") == by_step(want, "learning_rate")


def assert_weights_match(got: torch.nn.Module, want: torch.nn.Module,
                         precision: str = "fp32") -> None:
    weight_rtol = TOLERANCES[precision][2]
    mine, theirs = got.state_dict(), want.state_dict()
    assert mine.keys() == theirs.keys()
    for name, reference in theirs.items():
        if not reference.is_floating_point():
            continue
        scale = reference.abs().max().item() or 1.0
        error = (mine[name].float() - reference.float()).abs()
        if name.endswith("attn.c_attn.bias"):
            # The key bias's true gradient is 0 (softmax ignores a
            # per-query constant): Adam moves it by rounding noise, up to
            # lr per step either way (test_engine.py's header).
            assert error[KEY_BIAS].max().item() <= 2 * LR * STEPS, name
            error[KEY_BIAS] = 0
        assert error.max().item() <= weight_rtol * scale, (
            name, error.max().item(), scale)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_trainer_matches_adamw_trainer(lohand, tmp_path, precision):
    """Warmup + cosine, clipping (every step here), accumulation 2, weight
    decay with Trainer's no-decay parameters, evaluation, logging."""
    options = {"bf16": True} if precision == "bf16" else {}
    reference = gpt2()
    _, want = train(transformers.Trainer, tmp_path / "adamw", reference,
                    **options)
    model = gpt2()
    _, got = train(LohanTrainer, tmp_path / "lohan", model,
                   lohan={"socket": lohand.socket}, **options)
    assert_logs_match(got, want, precision)
    first = [h for h in got if h.get("step") == 1 and "loss" in h][0]
    assert first["loss"] == by_step(want, "loss")[1]  # the same bits in
    assert all(h["grad_norm"] > 0.3 for h in got if "grad_norm" in h)
    assert_weights_match(model, reference, precision)
    # The engine closed at the end of train() and deleted its job.
    with Client(lohand.socket) as client:
        assert client.jobs() == []
    # Each checkpoint holds lohan's states beside Trainer's files.
    for step in (10, 20):
        folder = tmp_path / "lohan" / f"checkpoint-{step}"
        assert (folder / "lohan" / "optimizer.safetensors").is_file()
        assert (folder / "trainer_state.json").is_file()


def test_gradient_checkpointing_is_lohans_recompute(lohand, tmp_path):
    """TRL's default (gradient_checkpointing=True) is accepted, said once,
    and trains as without it, bit for bit: lohan recomputes the blocks
    itself ("offload"), Hugging Face's checkpointing stays off (the
    model's modules are not wrapped)."""
    model = gpt2()
    with pytest.warns(UserWarning, match="checkpointing is lohan's to do"):
        trainer, got = train(LohanTrainer, tmp_path / "checkpointed", model,
                             lohan={"socket": lohand.socket},
                             gradient_checkpointing=True)
    assert not trainer.args.activation_checkpointing
    assert not model.is_activation_checkpointing
    # Asked for recompute: on this CPU, where lohan's default keeps.
    assert trainer.lohan_options["activations"] == "offload"
    plain = gpt2()
    _, want = train(LohanTrainer, tmp_path / "plain", plain,
                    lohan={"socket": lohand.socket})
    assert by_step(got, "loss") == by_step(want, "loss")
    assert_weights_match(model, plain)


class StopAt(transformers.TrainerCallback):
    """Ends training after `step` (its checkpoint saved): an interrupted
    run, on the whole run's schedule."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any,
                    **kwargs: Any) -> Any:
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def test_resume_from_checkpoint_reproduces_the_uninterrupted_run(
        lohand, tmp_path):
    whole = gpt2()
    _, want = train(LohanTrainer, tmp_path / "whole", whole,
                    lohan={"socket": lohand.socket})
    parts = tmp_path / "parts"
    first = LohanTrainer(model=gpt2(), args=arguments(parts),
                         train_dataset=TokenData(48, 1),
                         eval_dataset=TokenData(8, 2), callbacks=[StopAt(10)],
                         lohan={"socket": lohand.socket})
    first.train()
    assert sorted(p.name for p in parts.iterdir()) == ["checkpoint-10"]
    # Another process's view: a model with other initial weights.
    resumed = gpt2(seed=7)
    _, got = train(LohanTrainer, parts, resumed, resume=True,
                   lohan={"socket": lohand.socket})
    assert_logs_match([h for h in got if h.get("step", 0) > 10],
                      [h for h in want if h.get("step", 0) > 10])
    for name, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name


class Steps(transformers.TrainerCallback):
    """The optimizer steps a train() call ran."""

    def __init__(self) -> None:
        self.seen: List[int] = []

    def on_step_end(self, args: Any, state: Any, control: Any,
                    **kwargs: Any) -> Any:
        self.seen.append(state.global_step)
        return control


def test_resume_passes_over_a_checkpoint_cut_short(lohand, tmp_path):
    model = gpt2()
    train(LohanTrainer, tmp_path, model, lohan={"socket": lohand.socket})
    # A save killed before Trainer wrote its state (it writes it last).
    os.unlink(tmp_path / "checkpoint-20" / "trainer_state.json")
    with pytest.raises(ValueError, match="incomplete"):
        train(LohanTrainer, tmp_path, gpt2(), lohan={"socket": lohand.socket},
              resume=str(tmp_path / "checkpoint-20"))
    steps = Steps()
    with pytest.warns(UserWarning, match="checkpoint-20 is incomplete"):
        train(LohanTrainer, tmp_path, gpt2(), lohan={"socket": lohand.socket},
              resume=True, callbacks=[steps])
    assert steps.seen == list(range(11, 21))  # went on from checkpoint-10
    assert (tmp_path / "checkpoint-20" / "trainer_state.json").is_file()
    # One saved without the optimizer's state cannot go on exactly.
    only_model = tmp_path / "only"
    train(LohanTrainer, only_model, gpt2(), lohan={"socket": lohand.socket},
          save_only_model=True, max_steps=10)
    with pytest.raises(ValueError, match="save_only_model"):
        train(LohanTrainer, only_model, gpt2(),
              lohan={"socket": lohand.socket},
              resume=str(only_model / "checkpoint-10"))


@pytest.mark.parametrize("params,unit", [("resident", "block"),
                                         ("offload", "block"),
                                         ("offload", "sublayer")])
def test_peft_lora_matches_peft_with_adamw(lohand, tmp_path, params, unit):
    """Base frozen (kept by this process, block by block with "offload"),
    the adapters trained by lohand (a sublayer's adapters its own layer
    with param_unit="sublayer")."""
    reference = lora(gpt2())
    _, want = train(transformers.Trainer, tmp_path / "adamw", reference)
    model = lora(gpt2())
    trainer, got = train(LohanTrainer, tmp_path / "lohan", model,
                         lohan={"socket": lohand.socket, "params": params,
                                "param_unit": unit})
    assert_logs_match(got, want)
    assert_weights_match(model, reference)
    # Trainer saved the adapters; lohan's states hold only what it trains.
    folder = tmp_path / "lohan" / "checkpoint-20"
    assert (folder / "adapter_model.safetensors").is_file()
    with open(folder / "lohan" / "lohan.json") as f:
        names = [n for layer in json.load(f)["layers"] for n in layer]
    assert names and all("lora_" in n for n in names)


@pytest.mark.parametrize("setting, message", [
    ({"optim": "sgd"}, "optim='sgd'"),
    ({"optim": "adafactor"}, "optim='adafactor'"),
    ({"optim_args": "foo=1"}, "optim_args"),
    ({"torch_compile": True}, "torch_compile"),
])
def test_unsupported_trainer_settings_are_refused(lohand, tmp_path, setting,
                                                  message):
    with pytest.raises(ValueError, match=message):
        LohanTrainer(model=gpt2(), args=arguments(tmp_path, eval_strategy="no",
                                             **setting),
                     train_dataset=TokenData(8, 1),
                     lohan={"socket": lohand.socket})


def test_optimizers_and_lohan_options_from_the_arguments_are_refused(
        lohand, tmp_path):
    model = gpt2()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for kwargs, message in (
            ({"optimizers": (optimizer, None)}, "optimizers="),
            ({"optimizer_cls_and_kwargs": (torch.optim.SGD, {})},
             "optimizer_cls_and_kwargs"),
            ({"lohan": {"lr": 1.0, "max_grad_norm": 2}},
             "'lr', 'max_grad_norm'")):
        with pytest.raises(ValueError, match=message):
            LohanTrainer(model=model,
                         args=arguments(tmp_path, eval_strategy="no"),
                         train_dataset=TokenData(8, 1), **kwargs)
    # Refused before anything reached the daemon.
    with Client(lohand.socket) as client:
        assert client.jobs() == []


class Scales(transformers.TrainerCallback):
    """The loss scale after each step."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.seen: List[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any,
                    **kwargs: Any) -> Any:
        self.seen.append(float(self.trainer.accelerator.scaler.get_scale()))
        return control


def train_fp16(trainer_class: type, output_dir: Path, model: torch.nn.Module,
               init_scale: float, **kwargs: Any) -> Tuple[List[Dict], List]:
    """fp16=True as accelerate runs it on a GPU (autocast to fp16 and a
    GradScaler; on the CPU it makes neither and runs fp32): turned on by
    hand, so that the scaling, skipping and growing path runs here."""
    scales = Scales()
    extra = ({"lohan": kwargs.pop("lohan")}
             if trainer_class is LohanTrainer else {})
    trainer = trainer_class(model=model, args=arguments(output_dir,
                                                        fp16=True, **kwargs),
                            train_dataset=TokenData(48, 1),
                            eval_dataset=TokenData(8, 2), callbacks=[scales],
                            **extra)
    scales.trainer = trainer
    trainer.accelerator.native_amp = True
    trainer.accelerator.scaler = torch.amp.GradScaler(
        "cpu", init_scale=init_scale, growth_interval=3)
    trainer.train()
    return trainer.state.log_history, scales.seen


@pytest.mark.parametrize("init_scale", [2.0 ** 16, 2.0 ** 22])
def test_fp16_loss_scaling_matches_grad_scaler(lohand, tmp_path, init_scale):
    """2^16: grown every 3 good steps. 2^22: fp16 overflows in the first
    steps' backward; both skip them (weights, step count and LR schedule
    unchanged), halve the scale, then grow it and skip again: the same
    scale after every step."""
    reference = gpt2()
    want, want_scales = train_fp16(transformers.Trainer, tmp_path / "adamw",
                                   reference, init_scale)
    model = gpt2()
    got, got_scales = train_fp16(LohanTrainer, tmp_path / "lohan", model,
                                 init_scale, lohan={"socket": lohand.socket})
    assert got_scales == want_scales
    if init_scale > 2.0 ** 16:
        assert want_scales[:3] == [init_scale / 2, init_scale / 4,
                                   init_scale / 8]  # three steps skipped
    assert any(b > a for a, b in zip(want_scales, want_scales[1:]))
    assert_logs_match([h for h in got if "grad_norm" not in h or
                       math.isfinite(h["grad_norm"])],
                      [h for h in want if "grad_norm" not in h or
                       math.isfinite(h["grad_norm"])], "fp16")
    assert_weights_match(model, reference, "fp16")


def test_bfloat16_model_trains_with_fp32_masters(lohand, tmp_path):
    """A model loaded in bfloat16: bf16 weights in the process, fp32
    masters (and moments) in the daemon and in lohan/."""
    from safetensors.torch import load_file
    model = gpt2().to(torch.bfloat16)
    _, history = train(LohanTrainer, tmp_path, model,
                       lohan={"socket": lohand.socket})
    losses = by_step(history, "loss")
    assert losses[STEPS] < losses[1]
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    masters = load_file(tmp_path / f"checkpoint-{STEPS}" / "lohan" /
                        "model.safetensors")
    assert masters and all(t.dtype == torch.float32 for t in masters.values())
    # The model's weights are its masters rounded to bf16.
    weights = dict(model.named_parameters())
    for name, master in masters.items():
        assert torch.equal(weights[name].detach(), master.to(torch.bfloat16))


def test_sharding_and_several_processes_are_refused(lohand, tmp_path):
    """Two real processes (torchrun, gloo on the CPU): each is refused,
    saying to run one. fsdp, which Trainer itself takes only in a
    distributed run, is named among the refusals."""
    from lohan.integrations.transformers import _refusals
    sharded = transformers.TrainingArguments(
        str(tmp_path / "fsdp"), use_cpu=True, fsdp="full_shard",
        report_to="none")
    assert any(r.startswith("fsdp=") for r in _refusals(sharded, {}))
    script = tmp_path / "two.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_trainer import LohanTrainer, TokenData, arguments, gpt2\n"
        "try:\n"
        "    LohanTrainer(model=gpt2(), train_dataset=TokenData(8, 1),\n"
        f"                 args=arguments({str(tmp_path / 'out')!r},\n"
        "                                eval_strategy='no'),\n"
        f"                 lohan={{'socket': {lohand.socket!r}}})\n"
        "except ValueError as error:\n"
        "    print('refused:', error)\n")
    env = dict(os.environ, PYTHONPATH=str(
        Path(__file__).resolve().parents[2] / "plugins" / "pytorch"))
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc_per_node=2", str(script)],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("refused:") == 2, done.stdout + done.stderr
    assert "2 processes or GPUs" in done.stdout
    with Client(lohand.socket) as client:
        assert client.jobs() == []


def test_load_best_model_at_end_leaves_the_best_checkpoints_weights(
        lohand, tmp_path):
    from safetensors.torch import load_file
    model = gpt2()
    trainer, _ = train(LohanTrainer, tmp_path, model,
                       lohan={"socket": lohand.socket},
                       load_best_model_at_end=True,
                       metric_for_best_model="eval_loss",
                       # The higher loss, at step 10: not the last weights.
                       greater_is_better=True)
    best = trainer.state.best_model_checkpoint
    assert best is not None and best.endswith("checkpoint-10"), best
    saved = load_file(os.path.join(best, "model.safetensors"))
    weights = model.state_dict()
    for name, value in saved.items():
        assert torch.equal(weights[name], value), name
