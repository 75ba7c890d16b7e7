"""TRL's trainers through lohan (lohan.integrations.trl) against TRL's own
with torch's AdamW: the same script, seed and data, one class changed.

TRL's configs turn on bf16 (autocast) and gradient checkpointing by
default; the runs keep those defaults (and are also run in fp32) and
change only `optim` to torch's AdamW. Tolerances are test_trainer.py's:
fp32 losses and grad norms within 1e-5 relative; bf16 autocast 1e-3 and
1e-2 with the first step the same bits. Measured (GPT-2 with dropout and
a tied head, 12 SFT steps; Llama, 8 DPO steps; 2 CPU cores): SFT fp32
losses equal, grad norms within 8.5e-8; bf16 losses within 4.8e-5 (the
first 9 steps the same bits), grad norms 1.6e-4; DPO fp32 within 8.7e-8
and 1.4e-7, bf16 within 1.4e-4 and 2.6e-4.

The reference model of a full fine-tune waits on lohand's SSDs between
uses (test_the_reference_waits_on_lohands_ssds: a 34 MiB reference, none
of its bytes in the process between steps, the process's RSS 34 MiB
larger while it is brought back into host memory).
"""

from __future__ import annotations

import copy
import ctypes
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import torch

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from conftest import Daemon  # noqa: E402
from lohan.integrations.trl import (LohanDPOTrainer,  # noqa: E402
                                    LohanGRPOTrainer, LohanSFTTrainer)

# No usage pings from TRL's trainers (nothing can be reached here).
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

TOLERANCES = {"fp32": (1e-5, 1e-5), "bf16": (1e-3, 1e-2)}  # losses, norms
WORDS = ["<pad>", "</s>", "<unk>"] + [f"w{i}" for i in range(61)]


def tokenizer() -> Any:
    """A word-level tokenizer over WORDS (nothing is downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocabulary = Tokenizer(models.WordLevel(
        {word: i for i, word in enumerate(WORDS)}, unk_token="<unk>"))
    vocabulary.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=vocabulary, pad_token="<pad>", eos_token="</s>",
        unk_token="<unk>")


def gpt2(seed: int = 0) -> torch.nn.Module:
    """Dropout, a tied head."""
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=1, eos_token_id=1, pad_token_id=0))


def llama(seed: int = 0, width: int = 32, layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=width, intermediate_size=2 * width,
        num_hidden_layers=layers, num_attention_heads=max(2, width // 64),
        num_key_value_heads=1 if width < 128 else 2,
        max_position_embeddings=64, pad_token_id=0, eos_token_id=1,
        bos_token_id=1))


def counting(start: int, count: int) -> str:
    return " ".join(f"w{(start + k) % 61}" for k in range(count))


def texts() -> Any:
    generator = torch.Generator().manual_seed(1)
    starts = torch.randint(0, 61, (48,), generator=generator).tolist()
    return datasets.Dataset.from_dict(
        {"text": [counting(s, 12) for s in starts]})


def preferences() -> Any:
    """Counting on is chosen over a random continuation."""
    generator = torch.Generator().manual_seed(1)
    starts = torch.randint(0, 61, (32, 2), generator=generator).tolist()
    return datasets.Dataset.from_dict({
        "prompt": [counting(a, 6) for a, _ in starts],
        "chosen": [" " + counting(a + 6, 4) for a, _ in starts],
        "rejected": [" " + counting(b, 4) for _, b in starts]})


def prompts() -> Any:
    generator = torch.Generator().manual_seed(1)
    starts = torch.randint(0, 61, (16,), generator=generator).tolist()
    return datasets.Dataset.from_dict(
        {"prompt": [counting(s, 5) for s in starts]})


def word_sum(completions: List[str], **_: Any) -> List[float]:
    """A reward that differs between completions."""
    return [sum(int(w[1:]) for w in c.split() if w[1:].isdigit()) / 100
            for c in completions]


def settings(**overrides: Any) -> Dict[str, Any]:
    """TRL's defaults but for the optimizer (torch's AdamW, where TRL and
    lohan can be compared) and what keeps the runs short."""
    values = dict(use_cpu=True, report_to="none", disable_tqdm=True,
                  per_device_train_batch_size=4, learning_rate=5e-3,
                  logging_steps=1, save_strategy="no", optim="adamw_torch")
    values.update(overrides)
    return values


def logged(trainer: Any, key: str) -> List[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


def assert_close(got: Any, want: Any, precision: str) -> None:
    """Per step: losses and grad norms within `precision`'s tolerance."""
    for key, rtol in zip(("loss", "grad_norm"), TOLERANCES[precision]):
        mine, theirs = logged(got, key), logged(want, key)
        assert len(mine) == len(theirs) > 0, key
        assert mine == pytest.approx(theirs, rel=rtol, abs=1e-12), key


def test_lohan_imports_without_trl():
    code = ("import sys, lohan, lohan.engine, lohan.frozen_model, "
            "lohan.integrations; "
            "assert 'trl' not in sys.modules, 'trl imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_sft_matches_sfttrainer(lohand, tmp_path, precision):
    """TRL's defaults (bf16 autocast, gradient checkpointing) or fp32."""
    options = {} if precision == "bf16" else {"bf16": False}
    runs = []
    for trainer_class in (trl.SFTTrainer, LohanSFTTrainer):
        args = trl.SFTConfig(str(tmp_path / trainer_class.__name__),
                             **settings(max_steps=12, **options))
        assert args.gradient_checkpointing
        assert args.bf16 == (precision == "bf16")
        extra = ({"lohan": {"socket": lohand.socket}}
                 if trainer_class is LohanSFTTrainer else {})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = trainer_class(model=gpt2(), args=args,
                                    train_dataset=texts(),
                                    processing_class=tokenizer(), **extra)
        if extra:  # said once: lohan's recompute does the checkpointing
            assert sum("checkpointing is lohan's" in str(w.message)
                       for w in caught) == 1
        trainer.train()
        runs.append(trainer)
    want, got = runs
    assert_close(got, want, precision)
    assert logged(got, "loss")[0] == logged(want, "loss")[0]  # same bits
    assert logged(got, "loss")[-1] < logged(got, "loss")[0]


def dpo(trainer_class: type, tmp_path: Path, policy: torch.nn.Module,
        **kwargs: Any) -> Any:
    options = dict(kwargs.pop("options", {}))
    args = trl.DPOConfig(str(tmp_path / trainer_class.__name__),
                         **settings(max_steps=8, **options))
    trainer = trainer_class(model=policy, args=args,
                            train_dataset=preferences(),
                            processing_class=tokenizer(), **kwargs)
    trainer.train()
    return trainer


class ReferenceWatch(transformers.TrainerCallback):
    """After each step: where the reference's weights wait, and the bytes
    its parameters hold in the process."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.seen: List[Tuple[str, int]] = []

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        reference = self.trainer.reference
        self.seen.append((reference.where, sum(
            p.untyped_storage().nbytes()
            for p in self.trainer.ref_model.parameters())))


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_dpo_matches_dpotrainer(lohand, tmp_path, precision):
    """A full fine-tune, no ref_model: TRL's reference is a copy of the
    policy (TRL would load the policy's checkpoint again), lohan's the
    policy's weights on lohand's SSDs."""
    options = {} if precision == "bf16" else {"bf16": False}
    policy = llama()
    want = dpo(trl.DPOTrainer, tmp_path, policy,
               ref_model=copy.deepcopy(policy), options=options)
    watch = ReferenceWatch()
    policy = llama()
    args = trl.DPOConfig(str(tmp_path / "lohan"),
                         **settings(max_steps=8, **options))
    got = LohanDPOTrainer(model=policy, args=args,
                          train_dataset=preferences(),
                          processing_class=tokenizer(), callbacks=[watch],
                          lohan={"socket": lohand.socket})
    watch.trainer = got
    assert got.reference.where == "host"
    got.train()
    assert_close(got, want, precision)
    assert logged(got, "loss")[0] == logged(want, "loss")[0]
    # Between steps the reference's weights were on lohand's SSDs, none
    # of them in its module; after train() they wait in host memory.
    assert watch.seen == [("ssd", 0)] * 8
    assert got.reference.where == "host"


@pytest.mark.parametrize("way", ["ref_model", "peft_config", "peft_model",
                                 "precompute"])
def test_dpo_references_as_trl_makes_them(lohand, tmp_path, way):
    """A ref_model given (held by lohan); TRL's own ways: a peft policy
    with its adapters disabled (peft_config) or a frozen "ref" copy of
    its adapter (a peft model given), and reference log-probs computed
    before training. fp32."""
    def lora() -> Any:
        return peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                               target_modules=["q_proj", "v_proj"])

    def policy() -> torch.nn.Module:
        model = llama()
        if way == "peft_model":
            torch.manual_seed(1)
            return peft.get_peft_model(model, lora())
        return model

    options = {"bf16": False}
    kwargs: Dict[str, Any] = {}
    if way == "precompute":
        options["precompute_ref_log_probs"] = True
    runs = []
    for trainer_class in (trl.DPOTrainer, LohanDPOTrainer):
        model = policy()
        if way == "ref_model":
            kwargs = {"ref_model": llama()}
        elif way == "peft_config":
            kwargs = {"peft_config": lora()}
        extra = ({"lohan": {"socket": lohand.socket}}
                 if trainer_class is LohanDPOTrainer else {})
        runs.append(dpo(trainer_class, tmp_path, model, options=options,
                        **kwargs, **extra))
    want, got = runs
    assert_close(got, want, "fp32")
    assert (got.reference is not None) == (way == "ref_model")
    if way == "peft_model":  # TRL's frozen copy of the adapter
        assert not any(p.requires_grad for name, p in
                       got.model.named_parameters() if ".ref." in name)


def rss() -> int:
    """This process's resident bytes, the C library's free pages given
    back first."""
    ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def roomy_lohand(tmp_path: Path) -> Iterator[Daemon]:
    """A lohand with room for a 34 MiB model's states and reference."""
    directory = tmp_path / "lohand"
    directory.mkdir()
    daemon = Daemon(directory, host_pool="512MiB", ssd_capacity="1GiB")
    try:
        yield daemon
    finally:
        daemon.stop(signal.SIGKILL)


def test_the_reference_waits_on_lohands_ssds(roomy_lohand, tmp_path):
    """A 34 MiB reference (a Llama of width 512, 4 blocks): before train()
    its weights are the policy's own tensors (no copy); between steps they
    are on lohand's SSDs, every reference parameter an empty placeholder;
    in its forward the process holds the running block's (and the rest:
    embeddings, norm, head); the process's RSS is the reference's size
    larger while it is in host memory, and that much smaller again on
    the SSDs; after train() they are back in host memory, the same bits."""
    policy = llama(width=512, layers=4)
    initial = {name: p.detach().clone()
               for name, p in policy.named_parameters()}
    size = sum(p.numel() * p.element_size() for p in policy.parameters())
    block = sum(p.numel() * p.element_size()
                for p in policy.model.layers[0].parameters())
    rest = size - 4 * block

    rows: List[Dict[str, Any]] = []

    class Watch(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any,
                        **kwargs: Any) -> None:
            reference = trainer.reference
            row = {"where": reference.where,
                   "held": sum(p.untyped_storage().nbytes()
                               for p in trainer.ref_model.parameters()),
                   "ssd": reference.ssd_bytes,
                   "host": reference.host_bytes, "rss": rss()}
            if state.global_step == 2:
                reference.to_host()
                row["rss_in_host"] = rss()
                reference.to_ssd(trainer.engine)
                row["rss_back"] = rss()
            rows.append(row)

    args = trl.DPOConfig(str(tmp_path / "run"),
                         **settings(max_steps=4, learning_rate=1e-4,
                                    bf16=False))
    trainer = LohanDPOTrainer(model=policy, args=args,
                              train_dataset=preferences(),
                              processing_class=tokenizer(),
                              callbacks=[Watch()],
                              lohan={"socket": roomy_lohand.socket})
    reference = trainer.reference
    names = dict(trainer.ref_model.named_parameters())
    assert all(reference.value(names[name]).data_ptr() == p.data_ptr()
               for name, p in policy.named_parameters())
    held_in_forward: List[int] = []

    def holding(module: Any, inputs: Any) -> None:
        held_in_forward.append(sum(p.untyped_storage().nbytes()
                                   for p in trainer.ref_model.parameters()))

    for layer in trainer.ref_model.model.layers:
        layer.register_forward_pre_hook(holding)
    trainer.train()

    assert [row["where"] for row in rows] == ["ssd"] * 4
    for row in rows:
        assert (row["held"], row["ssd"], row["host"]) == (0, size, 0), row
    moved = rows[1]
    assert moved["rss_in_host"] - moved["rss"] > 0.9 * size, rows
    assert moved["rss_in_host"] - moved["rss_back"] > 0.9 * size, rows
    # One block at a time (and the rest), in every reference forward.
    assert held_in_forward and set(held_in_forward) == {rest + block}
    assert reference.where == "host" and reference.host_bytes == size
    for name, param in trainer.ref_model.named_parameters():
        assert torch.equal(reference.value(param), initial[name]), name


@pytest.mark.parametrize("case", ["beta0", "beta0-offload", "beta0.1"])
def test_grpo_generates_and_trains_through_lohan(lohand, tmp_path, case):
    """transformers' generation on the policy as lohan holds it (resident,
    or each block's weights fetched from lohand for every forward with
    params="offload"): the same completions, rewards and losses as
    GRPOTrainer's. beta > 0: TRL's reference (loaded from the policy's
    checkpoint) waits on lohand's SSDs between steps. fp32."""
    checkpoint = tmp_path / "policy"
    llama().save_pretrained(checkpoint)
    beta = 0.1 if case == "beta0.1" else 0.0
    lohan_options = {"socket": lohand.socket}
    if case == "beta0-offload":
        lohan_options["params"] = "offload"
    runs = []
    for trainer_class in (trl.GRPOTrainer, LohanGRPOTrainer):
        args = trl.GRPOConfig(str(tmp_path / trainer_class.__name__),
                              **settings(max_steps=3, num_generations=4,
                                         max_completion_length=8,
                                         beta=beta, bf16=False))
        extra = ({"lohan": lohan_options}
                 if trainer_class is LohanGRPOTrainer else {})
        trainer = trainer_class(model=str(checkpoint), reward_funcs=word_sum,
                                args=args, train_dataset=prompts(),
                                processing_class=tokenizer(), **extra)
        trainer.train()
        runs.append(trainer)
    want, got = runs
    assert logged(got, "reward") == logged(want, "reward")
    assert_close(got, want, "fp32")
    if beta:
        assert got.reference is not None and got.reference.where == "host"
        assert got.reference.host_bytes == sum(
            p.numel() * p.element_size() for p in got.model.parameters())
    else:
        assert got.reference is None


def test_a_resumed_dpo_run_keeps_the_starting_reference(lohand, tmp_path):
    """Resumed from checkpoint-4 in a new trainer over a fresh policy: the
    reference is still the starting weights (copies taken before Trainer
    loads the checkpoint into the policy), so steps 5 to 8 are the
    uninterrupted run's."""
    def run(steps: int, resume: Any = None) -> Any:
        args = trl.DPOConfig(str(tmp_path / "run"), **settings(
            max_steps=steps, bf16=False, save_strategy="steps",
            save_steps=4))
        trainer = LohanDPOTrainer(model=llama(), args=args,
                                  train_dataset=preferences(),
                                  processing_class=tokenizer(),
                                  lohan={"socket": lohand.socket})
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    whole = {h["step"]: h["loss"] for h in run(8).state.log_history
             if "loss" in h}
    resumed = run(8, resume=str(tmp_path / "run" / "checkpoint-4"))
    again = {h["step"]: h["loss"] for h in resumed.state.log_history
             if "loss" in h}
    # Steps 1 to 4 come back from the checkpoint's trainer_state.json.
    assert sorted(again) == sorted(whole) == list(range(1, 9))
    for step, loss in again.items():
        assert loss == pytest.approx(whole[step], rel=1e-6), step


def test_what_the_trl_trainers_refuse(lohand, tmp_path):
    with torch.device("meta"):
        on_meta = llama()
    args = trl.DPOConfig(str(tmp_path / "dpo"), **settings(bf16=False))
    with pytest.raises(ValueError, match="meta device"):
        LohanDPOTrainer(model=on_meta, args=args,
                        train_dataset=preferences(),
                        processing_class=tokenizer())
    synced = trl.DPOConfig(str(tmp_path / "dpo"),
                           **settings(bf16=False, sync_ref_model=True))
    with pytest.raises(ValueError, match="sync_ref_model"):
        LohanDPOTrainer(model=llama(), args=synced,
                        train_dataset=preferences(),
                        processing_class=tokenizer())
    vllm = trl.GRPOConfig(str(tmp_path / "grpo"),
                          **settings(bf16=False, use_vllm=True,
                                     num_generations=4))
    with pytest.raises(ValueError, match="use_vllm"):
        LohanGRPOTrainer(model=llama(), reward_funcs=word_sum, args=vllm,
                         train_dataset=prompts(),
                         processing_class=tokenizer())
