"""Hugging Face Trainer through lohan: `LohanTrainer` is `Trainer` with the
optimizer, the gradient clipping and the optimizer's checkpoint handed to
lohand.

A subclass rather than a callback: Trainer builds its optimizer, clips the
gradients and writes the optimizer's states in its own methods
(create_optimizer, _clip_grad_norm, _save_optimizer_and_scheduler), which a
callback cannot replace; a callback could only fight them. Everything else
(the data, the loss, the loop, accumulation, logging, evaluation, the LR
schedule, the checkpoint folders and their rotation) stays Trainer's own.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any, Dict, List, Optional, Union

import torch
from transformers import PreTrainedModel, Trainer
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from lohan.engine import Engine

# Inside each Trainer checkpoint folder: lohan's checkpoint (the fp32
# masters and the Adam moments, written whole or not at all by
# Engine.save).
LOHAN_DIR = "lohan"
_TRAINER_STATE = "trainer_state.json"
_OPTIMIZER = "optimizer.pt"
_SCHEDULER = "scheduler.pt"

# Trainer's names for torch's AdamW; lohand runs the same update.
_ADAMW = {"adamw_torch", "adamw_torch_fused"}
# What LohanTrainer sets from TrainingArguments itself.
_FROM_ARGS = {"lr", "betas", "eps", "weight_decay", "no_weight_decay",
              "param_groups", "max_grad_norm", "grad_accumulation_steps",
              "adamw", "resume"}


def _refusals(args: Any, lohan: Dict[str, Any]) -> List[str]:
    """Each Trainer setting lohan cannot honour, with what to do instead."""
    found = []
    optim = str(getattr(args.optim, "value", args.optim))
    if optim not in _ADAMW:
        found.append(f"optim={optim!r}: lohand runs AdamW; use "
                     "optim='adamw_torch'")
    if args.optim_args:
        found.append(f"optim_args={args.optim_args!r}: AdamW's settings are "
                     "adam_beta1, adam_beta2, adam_epsilon and weight_decay")
    if args.deepspeed:
        found.append("deepspeed=...: lohan replaces DeepSpeed's offload; "
                     "drop the deepspeed config")
    if args.fsdp:
        found.append("fsdp=...: one process per job for now (several GPUs "
                     "are not supported yet); drop fsdp")
    if args.world_size > 1 or args.n_gpu > 1:
        found.append(f"{max(args.world_size, args.n_gpu)} processes or GPUs: "
                     "lohan trains on one device per job for now; run one "
                     "process on one device")
    if args.torch_compile:
        found.append("torch_compile=True: lohan's hooks on every block are "
                     "not traced by torch.compile; drop it")
    clash = sorted(set(lohan) & _FROM_ARGS)
    if clash:
        found.append(f"lohan={{{', '.join(map(repr, clash))}: ...}}: these "
                     "come from TrainingArguments (learning_rate, adam_beta1, "
                     "adam_beta2, adam_epsilon, weight_decay, max_grad_norm, "
                     "gradient_accumulation_steps, resume_from_checkpoint)")
    return found


def _take_over_checkpointing(args: Any, options: Dict[str, Any]) -> None:
    """gradient_checkpointing / activation_checkpointing=True (TRL's
    SFTConfig default) asks for activations recomputed in backward, which
    lohan's activation policy does itself: unless `options` (lohan=...)
    name a policy, "offload" (each block's input kept, its insides
    recomputed), also on a CPU where lohan's default keeps them. Said
    once; Hugging Face's own checkpointing stays off, so the two do not
    nest."""
    if not getattr(args, "activation_checkpointing", False) and not getattr(
            args, "gradient_checkpointing", False):
        return
    policy = options.setdefault("activations", "offload")
    warnings.warn(
        "lohan: activation (gradient) checkpointing is lohan's to do: it "
        f"runs each block as lohan={{'activations': {policy!r}}} says "
        "('offload': a block's input kept, its insides recomputed in "
        "backward); Hugging Face's own checkpointing is left off",
        stacklevel=3)
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        if hasattr(args, name):
            setattr(args, name, False)


def _checkpoint_step(path: str) -> int:
    match = re.search(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)$", path.rstrip("/"))
    return int(match.group(1)) if match else -1


def checkpoint_problem(path: str) -> Optional[str]:
    """Why `path` is not a whole LohanTrainer checkpoint, or None. Trainer
    writes trainer_state.json after everything else, so its absence marks
    a save cut short."""
    if not os.path.isdir(path):
        return f"{path} is not a directory"
    if not os.path.isfile(os.path.join(path, LOHAN_DIR, "lohan.json")):
        return (f"{path} has no lohan optimizer state ({LOHAN_DIR}/): it was "
                "saved with save_only_model=True or by another Trainer")
    if not os.path.isfile(os.path.join(path, _TRAINER_STATE)):
        return f"{path} is incomplete (a save cut short: no {_TRAINER_STATE})"
    return None


def last_whole_checkpoint(output_dir: str) -> Optional[str]:
    """The newest checkpoint folder in `output_dir` that is whole; the ones
    after it that are not are passed over with a warning."""
    if not os.path.isdir(output_dir):
        return None
    folders = sorted((os.path.join(output_dir, name)
                      for name in os.listdir(output_dir)
                      if _checkpoint_step(name) >= 0),
                     key=_checkpoint_step, reverse=True)
    for folder in folders:
        problem = checkpoint_problem(folder)
        if problem is None:
            return folder
        warnings.warn(f"lohan: passing over {problem}", stacklevel=3)
    return None


class EngineScaler:
    """Stands in for accelerate's GradScaler with fp16=True: the loss is
    scaled by the engine's dynamic scale, the daemon unscales the
    gradients and skips a step whose gradients are not finite, and the
    engine halves or grows the scale, as GradScaler would. Trainer sees a
    skipped step as accelerate reports one (its optimizer step not
    called), so the LR schedule does not advance on it."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.engine.scale_loss(loss)

    def step(self, optimizer: Any, closure: Any = None) -> Any:
        result = self.engine.step()
        if result is not None and result.skipped:
            return None
        # The optimizer's (patched) step tells accelerate the step ran;
        # with the gradients handed over it is a no-op.
        return optimizer.step(closure)

    def update(self, new_scale: Any = None) -> None:
        pass  # engine.step() has moved the scale

    def unscale_(self, optimizer: Any) -> None:
        pass  # the daemon unscales

    def get_scale(self) -> float:
        return self.engine.loss_scale

    def is_enabled(self) -> bool:
        return True

    def state_dict(self) -> Dict[str, Any]:
        return {"scale": self.engine.loss_scale,
                "_growth_tracker": self.engine._good_steps}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.engine.loss_scale = float(state["scale"])
        self.engine._good_steps = int(state["_growth_tracker"])

    def _lazy_init_scale_growth_tracker(self, device: Any) -> None:
        pass  # accelerate calls it after load_state_dict

    @staticmethod
    def options_from(scaler: Any) -> Dict[str, Any]:
        """lohan.init's loss-scale options for accelerate's scaler."""
        if (scaler.get_growth_factor() != 2.0
                or scaler.get_backoff_factor() != 0.5):
            raise ValueError(
                "LohanTrainer: fp16 with a GradScaler growth factor "
                f"{scaler.get_growth_factor()} / backoff "
                f"{scaler.get_backoff_factor()}: lohan doubles and halves "
                "the scale (torch's defaults); drop those settings")
        return {"loss_scale": "dynamic",
                "initial_loss_scale": float(scaler.get_scale()),
                "loss_scale_growth_interval": scaler.get_growth_interval()}


class LohanTrainer(Trainer):
    """`Trainer` whose optimizer is lohand's AdamW. Change `Trainer(...)` to
    `LohanTrainer(...)`; `lohan={...}` passes options to lohan.init
    (socket, job_name, activations, buffers, ...: docs/pytorch.md).

    From TrainingArguments: learning_rate and the LR schedule,
    adam_beta1/2, adam_epsilon, weight_decay (not on Trainer's no-decay
    parameters: biases and norms), max_grad_norm (clipped exactly in the
    daemon; the grad_norm logged is the daemon's), and
    gradient_accumulation_steps; bf16 and fp16 (EngineScaler).
    Checkpoints hold lohan's states in
    `checkpoint-N/lohan/`; resume_from_checkpoint=True takes the newest
    whole checkpoint. At the end of train() the engine closes and its
    daemon job is deleted (the checkpoints and the model hold the run),
    but for a model built on the meta device (lohan={"weights": PATH}):
    its engine stays open, so save_model() writes the trained model from
    lohand (save_model always does while the engine is open: a layer at a
    time, as engine.save_pretrained); close_engine() ends it."""

    def __init__(self, *args: Any, lohan: Optional[Dict[str, Any]] = None,
                 **kwargs: Any):
        optimizers = kwargs.get("optimizers", (None, None))
        if any(part is not None for part in optimizers):
            raise ValueError(
                "LohanTrainer: optimizers=(...) given, but lohand runs the "
                "optimizer: drop it and set learning_rate, weight_decay and "
                "lr_scheduler_type in TrainingArguments")
        if kwargs.get("optimizer_cls_and_kwargs") is not None:
            raise ValueError("LohanTrainer: optimizer_cls_and_kwargs given, "
                             "but lohand runs AdamW: drop it")
        self.lohan_options = dict(lohan or {})
        self.engine: Optional[Engine] = None
        self._lohan_resume: Optional[str] = None
        super().__init__(*args, **kwargs)
        refused = _refusals(self.args, self.lohan_options)
        if refused:
            raise ValueError("LohanTrainer cannot honour: " +
                             "; ".join(refused))
        _take_over_checkpointing(self.args, self.lohan_options)

    # ------------------------------------------------------------ optimizer

    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        if self.optimizer is not None:
            return self.optimizer
        model = self.model if model is None else model
        decay = set(self.get_decay_parameter_names(model))
        options = dict(self.lohan_options)
        options.setdefault("device", self.args.device)
        # fp16 where accelerate scales the loss (a GPU; on the CPU it runs
        # fp32): the engine's dynamic scale replaces its GradScaler.
        scaler = getattr(self.accelerator, "scaler", None)
        if self.args.fp16 and scaler is not None:
            options.update(EngineScaler.options_from(scaler))
        self.engine = Engine(
            model, lr=self.args.learning_rate,
            betas=(self.args.adam_beta1, self.args.adam_beta2),
            eps=self.args.adam_epsilon, weight_decay=self.args.weight_decay,
            no_weight_decay=lambda name, param: name not in decay,
            max_grad_norm=self.args.max_grad_norm,
            grad_accumulation_steps=self.args.gradient_accumulation_steps,
            resume=(os.path.join(self._lohan_resume, LOHAN_DIR)
                    if self._lohan_resume else False),
            **options)
        self.optimizer = self.engine.optimizer
        if self.args.fp16 and scaler is not None:
            # Before accelerator.prepare hands the scaler to the optimizer.
            self.accelerator.scaler = EngineScaler(self.engine)
        return self.optimizer

    def _move_model_to_device(self, model: Any, device: Any) -> None:
        # lohan.init places the model: what stays on the device goes there,
        # the blocks' weights come from the daemon one block at a time.
        if torch.device(device).type == "cpu" and not any(
                p.is_meta for p in model.parameters()):
            super()._move_model_to_device(model, device)

    def _clip_grad_norm(self, model: Any) -> None:
        return None  # the daemon clips, exactly, at engine.step()

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> None:
        return None  # known once the daemon has the step: see below

    def _maybe_log_save_evaluate(self, tr_loss: Any, grad_norm: Any,
                                 *args: Any, **kwargs: Any) -> None:
        last = self.engine.last if self.engine is not None else None
        if last is not None:
            grad_norm = last.global_norm
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)

    # ---------------------------------------------------------- checkpoints

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        self.engine.save(os.path.join(output_dir, LOHAN_DIR),
                         optimizer_state=True)
        # The groups' settings (the learning rate of the next step); the
        # moments are in lohan/.
        torch.save(self.optimizer.state_dict(),
                   os.path.join(output_dir, _OPTIMIZER))
        torch.save(self.lr_scheduler.state_dict(),
                   os.path.join(output_dir, _SCHEDULER))

    def _load_optimizer_and_scheduler(self, checkpoint: Optional[str]) -> None:
        if checkpoint is None:
            return
        # The engine took the masters and moments from lohan/ when it was
        # made (create_optimizer).
        self.optimizer.load_state_dict(torch.load(
            os.path.join(checkpoint, _OPTIMIZER), weights_only=True))
        self.lr_scheduler.load_state_dict(torch.load(
            os.path.join(checkpoint, _SCHEDULER), weights_only=True))

    def train(self, resume_from_checkpoint: Union[None, bool, str] = None,
              *args: Any, **kwargs: Any) -> Any:
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_whole_checkpoint(
                self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(
                    "LohanTrainer: resume_from_checkpoint=True but "
                    f"{self.args.output_dir} holds no whole checkpoint")
        elif resume_from_checkpoint:
            problem = checkpoint_problem(str(resume_from_checkpoint))
            if problem is not None:
                raise ValueError(f"LohanTrainer: cannot resume: {problem}")
        if resume_from_checkpoint:
            self._lohan_resume = str(resume_from_checkpoint)
        try:
            return super().train(resume_from_checkpoint or None, *args,
                                 **kwargs)
        finally:
            # A model built on the meta device cannot take the trained
            # weights back: its engine stays open for save_model().
            if self.engine is None or not self.engine.model_on_meta:
                self.close_engine()

    def _save(self, output_dir: Optional[str] = None,
              state_dict: Optional[Dict[str, Any]] = None) -> None:
        """The model (a peft model's adapters) through
        engine.save_pretrained while the engine is open (a layer at a time
        from lohand, never the whole state_dict in memory), then what
        Trainer saves beside it."""
        engine = self.engine
        if (engine is None or state_dict is not None
                or not self.args.should_save
                or not (isinstance(self.model, PreTrainedModel)
                        or hasattr(self.model, "peft_config"))):
            super()._save(output_dir, state_dict)
            return
        output_dir = output_dir or self.args.output_dir
        engine.save_pretrained(output_dir)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))

    def close_engine(self) -> None:
        """Closes the engine (the model keeps the trained weights) and
        deletes its daemon job. train() does this when it ends."""
        if self.engine is not None:
            self.engine.close(delete_job=True)
            self.engine = None
            self.optimizer = None
            self.lr_scheduler = None
            self._lohan_resume = None
