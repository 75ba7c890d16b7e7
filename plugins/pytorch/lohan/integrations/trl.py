"""TRL's trainers through lohan: `LohanSFTTrainer`, `LohanDPOTrainer` and
`LohanGRPOTrainer` are TRL's SFTTrainer, DPOTrainer and GRPOTrainer with
LohanTrainer's optimizer (lohand's AdamW; TRL's gradient checkpointing
is lohan's recompute), as LohanTrainer is Trainer's. Needs trl (imported
by this module only, not by `import lohan`).

The reference model (DPO's; GRPO's with beta > 0). TRL keeps it in the
training process: a second whole model on the device. On a full
fine-tune these trainers give it to lohan as a frozen model
(lohan.frozen_model): while training runs its weights wait on lohand's
SSDs (through the engine's activation area) and each block's come into
the process only for that block's forward, so between uses neither the
device nor the process holds them. DPO's is the `ref_model` given (its
own tensors taken, not copied) or, with none, the policy's weights as the
trainer is made (where TRL would load the policy's checkpoint a second
time: the same weights); GRPO's is the one TRL loads. Before train() and
after it the weights wait in host memory (on the CPU a reference that is
the policy's weights costs nothing until training starts). TRL's other
ways stay TRL's: a PEFT policy's reference is the policy with its
adapters disabled (no copy), and DPO's precompute_ref_log_probs=True
computes the reference's log-probs before training (by the policy itself
when no ref_model is given)."""

from __future__ import annotations

import copy
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch
from accelerate.utils import is_peft_model
from torch import nn
from trl import DPOTrainer, GRPOTrainer, SFTTrainer

from lohan.blocks import find_blocks
from lohan.frozen_model import FrozenModel
from lohan.integrations.transformers import LohanTrainer


class LohanSFTTrainer(LohanTrainer, SFTTrainer):
    """SFTTrainer whose optimizer is lohand's AdamW (see LohanTrainer)."""


def _blocks_by_name(model: nn.Module, blocks: Any = None) -> Tuple[str, ...]:
    """The names of `model`'s repeated blocks (none found: none)."""
    names = {id(module): name for name, module in model.named_modules()}
    try:
        return tuple(names[id(b)] for b in find_blocks(model, blocks))
    except ValueError:
        return ()


def _stand_in(model: nn.Module, own: bool
              ) -> Tuple[nn.Module, Dict[int, torch.Tensor]]:
    """A reference module whose parameters are empty placeholders, and its
    parameters' values by id: with `own`, `model` itself (its tensors
    taken); else a copy of `model` with `model`'s tensors as its values
    (not copied; the buffers are)."""
    values: Dict[int, torch.Tensor] = {}
    memo: Dict[int, Any] = {}
    for param in model.parameters():
        empty = torch.empty(0, dtype=param.dtype, device=param.device)
        if own:
            values[id(param)] = param.data
            param.data = empty
        else:
            stand_in = nn.Parameter(empty, requires_grad=False)
            values[id(stand_in)] = param.data
            memo[id(param)] = stand_in
    if own:
        return model, values
    reference = copy.deepcopy(model, memo)
    reference.eval()  # as TRL's reference, loaded with from_pretrained
    return reference, values


def _no_sync(trainer: str, args: Any) -> None:
    if getattr(args, "sync_ref_model", False):
        raise ValueError(
            f"{trainer}: sync_ref_model=True is not supported yet (the "
            "reference's weights wait on lohand's SSDs); drop it")


class _ReferenceThroughLohan(LohanTrainer):
    """A TRL trainer whose reference model (`ref_model`) lohan holds as a
    frozen model (see the module's doc): in host memory until the engine
    opens, on lohand's SSDs while it is open."""

    _reference: Optional[FrozenModel] = None
    # The reference's values are the policy's own tensors (until train()).
    _reference_is_policy = False

    @property
    def reference(self) -> Optional[FrozenModel]:
        """The reference model through lohan (None: TRL's own way)."""
        return self._reference

    def _hand_over_reference(self, values: Dict[int, torch.Tensor],
                             blocks: Sequence[str]) -> None:
        reference = getattr(self, "ref_model")
        self._reference = FrozenModel(
            reference, values,
            [reference.get_submodule(name) for name in blocks],
            self.args.device)

    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        reference = self._reference
        if reference is not None and self.optimizer is None:
            self.lohan_options.setdefault("frozen_models", True)
        optimizer = super().create_optimizer(model)
        if reference is not None and reference.where == "host":
            reference.to_ssd(self.engine)
        return optimizer

    def train(self, resume_from_checkpoint: Union[None, bool, str] = None,
              *args: Any, **kwargs: Any) -> Any:
        if resume_from_checkpoint and self._reference_is_policy:
            # Trainer loads the checkpoint into the policy in place.
            assert self._reference is not None
            self._reference.own_copies()
            self._reference_is_policy = False
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def close_engine(self) -> None:
        # Back into host memory before lohand drops them with the job.
        if self._reference is not None:
            self._reference.to_host()
        super().close_engine()


class LohanDPOTrainer(_ReferenceThroughLohan, DPOTrainer):
    """DPOTrainer whose optimizer is lohand's AdamW (see LohanTrainer) and
    whose full fine-tune's reference model lohan holds (see the module's
    doc; `trainer.reference`)."""

    def __init__(self, model: Union[str, nn.Module],
                 ref_model: Optional[nn.Module] = None, args: Any = None,
                 *more: Any, lohan: Optional[Dict[str, Any]] = None,
                 **kwargs: Any):
        precompute = getattr(args, "precompute_ref_log_probs", False)
        if precompute and args.device.type != "cpu":
            raise ValueError(
                "LohanDPOTrainer: precompute_ref_log_probs=True off the CPU "
                "is not supported yet (TRL runs that pass on the policy "
                "before lohan has placed it on the device); drop it: the "
                "reference waits on lohand's SSDs instead")
        streamed = not (
            kwargs.get("peft_config") is not None
            or (not isinstance(model, str) and is_peft_model(model))
            or precompute)
        values: Dict[int, torch.Tensor] = {}
        blocks: Tuple[str, ...] = ()
        if streamed:
            _no_sync("LohanDPOTrainer", args)
            if isinstance(model, str):  # loaded as DPOTrainer loads it
                from trl.trainer.utils import create_model_from_path
                model = create_model_from_path(model, **dict(
                    getattr(args, "model_init_kwargs", None) or {}))
            source = model if ref_model is None else ref_model
            if any(p.is_meta for p in source.parameters()):
                raise ValueError(
                    "LohanDPOTrainer: ref_model is on the meta device: "
                    "give it with its weights" if ref_model is not None
                    else "LohanDPOTrainer: the reference would be the "
                    "policy's weights, but it is on the meta device (lohan="
                    "{'weights': ...}): pass ref_model=... (its weights go "
                    "to lohand), or train a peft adapter (the reference "
                    "is the base)")
            blocks = _blocks_by_name(source, (lohan or {}).get("blocks")
                                     if ref_model is None else None)
            self._reference_is_policy = ref_model is None
            ref_model, values = _stand_in(source, own=ref_model is not None)
        super().__init__(model, ref_model, args, *more, lohan=lohan,
                         **kwargs)
        if streamed:
            self._hand_over_reference(values, blocks)


class LohanGRPOTrainer(_ReferenceThroughLohan, GRPOTrainer):
    """GRPOTrainer whose optimizer is lohand's AdamW (see LohanTrainer).
    Generation is transformers' generate on the policy as lohan holds it
    (with params="offload" each block's weights come in for each forward
    of it: every generated token). With beta > 0 on a full fine-tune, the
    reference TRL loads is held by lohan (see the module's doc)."""

    def __init__(self, model: Union[str, nn.Module], reward_funcs: Any,
                 args: Any = None, *more: Any, **kwargs: Any):
        if getattr(args, "use_vllm", False):
            raise ValueError(
                "LohanGRPOTrainer: use_vllm=True is not supported yet (vLLM "
                "would hold its own copy of the weights lohan holds, synced "
                "from the model); drop it: transformers' generate runs on "
                "the model as lohan holds it")
        super().__init__(model, reward_funcs, args, *more, **kwargs)
        reference = getattr(self, "ref_model", None)
        if reference is not None:
            _no_sync("LohanGRPOTrainer", self.args)
            blocks = _blocks_by_name(reference)
            _, values = _stand_in(reference, own=True)
            self._hand_over_reference(values, blocks)
