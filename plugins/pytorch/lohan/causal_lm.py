"""The chunked loss (chunked_loss.py) under a Hugging Face causal LM's own
forward: while the model trains and is given labels, its head returns
the hidden states it was given and its loss function computes the head
and the cross-entropy a chunk of tokens at a time, so the full logits
never exist. Everything else of the forward (the label shift,
ignore_index, Trainer's num_items_in_batch) is the model's own.

Applies to the families whose forward ends in a plain linear head and
their causal LM loss (PLAIN_HEAD_MODEL_TYPES); any other Hugging Face
model with an output head keeps its own loss, and lohan.init says so
once. The returned output has no logits while the loss is chunked (no
full logits exist); evaluation (model.eval() or no grad) and calls
without labels are the model's own forward, logits included.
"""

from __future__ import annotations

import functools
import inspect
import sys
import warnings
from typing import Any, Callable, List, Optional

import torch
from torch import nn
from torch.nn import functional as F

from lohan.chunked_loss import (chunk_tokens_for, linear_cross_entropy,
                                 working_bytes)

# Model types whose causal LM forward computes `logits = lm_head(hidden)`
# and hands those logits, unchanged, to the causal LM loss (no soft-cap,
# scale or bias added after the head).
PLAIN_HEAD_MODEL_TYPES = frozenset({
    "gpt2", "gpt_neo", "gptj", "gpt_neox", "gpt_bigcode", "opt", "llama",
    "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi",
    "phi3", "starcoder2", "olmo", "olmo2", "stablelm", "falcon", "gemma",
})

class Installed:
    """What install() did: nothing (the model's own loss)."""

    # The largest working_bytes of a chunked call so far (0: none): what
    # a profile reports beside the tensors the loss saves.
    working_bytes = 0

    def uninstall(self) -> None:
        pass


def install(model: nn.Module, enabled: bool,
            chunk_tokens: Optional[int]) -> Installed:
    """Chunks the loss of the causal LM in `model` (itself, or wrapped,
    as PEFT does) when `enabled`; returns what undoes it. A model with an
    output head it cannot chunk gets a warning, once."""
    lm = _causal_lm(model)
    if lm is None or not enabled:
        return Installed()
    head = lm.get_output_embeddings()
    why = _not_plain(lm, head)
    if why:
        warnings.warn(
            f"lohan: {type(lm).__name__} {why}: its loss is computed as the "
            "model does, with the full logits on the device (chunked_loss "
            "applies to causal LMs of the types "
            f"{', '.join(sorted(PLAIN_HEAD_MODEL_TYPES))})", stacklevel=4)
        return Installed()
    return _ChunkedForward(lm, head, chunk_tokens)


def _causal_lm(model: nn.Module) -> Optional[nn.Module]:
    """The first Hugging Face model with an output head in `model`."""
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return None  # no Hugging Face model can exist
    for module in model.modules():
        if isinstance(module, transformers.PreTrainedModel) and (
                module.get_output_embeddings() is not None):
            return module
    return None


def _not_plain(lm: nn.Module, head: nn.Module) -> str:
    """Why `lm`'s loss cannot be chunked; "" when it can."""
    model_type = getattr(getattr(lm, "config", None), "model_type", None)
    if model_type not in PLAIN_HEAD_MODEL_TYPES:
        return f"(model type {model_type!r}) is not known to end in a " \
               "plain linear head and cross-entropy"
    if not type(lm).__name__.endswith(("ForCausalLM", "LMHeadModel")):
        return "is not a causal LM"
    if type(head) is not nn.Linear:
        return f"has a {type(head).__name__} head, not a plain nn.Linear"
    if "_loss_function" in vars(lm) or getattr(lm, "loss_type", None) not in (
            None, "ForCausalLM"):
        return "has its own loss function"
    return ""


class _ChunkedForward(Installed):
    """`lm.forward` replaced by one that chunks the loss when it applies."""

    def __init__(self, lm: nn.Module, head: nn.Linear,
                 chunk_tokens: Optional[int]) -> None:
        self.working_bytes = 0
        self._lm, self._head, self._chunk_tokens = lm, head, chunk_tokens
        self._own_forward = vars(lm).get("forward")
        self._installed = True
        original = lm.forward
        signature = inspect.signature(original)

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind_partial(*args, **kwargs).arguments
            # TRL's fused LM head (fused_lm_head=True) makes no full
            # logits either: its forward is its own.
            if (not self._installed or bound.get("labels") is None
                    or kwargs.get("fused_lm_head")
                    or not lm.training or not torch.is_grad_enabled()
                    or bound.get("logits_to_keep") not in (None, 0)
                    or bound.get("return_dict") is False):
                return original(*args, **kwargs)
            return self._chunked(original, args, kwargs)

        self._forward = forward
        lm.forward = forward

    def uninstall(self) -> None:
        """The model's forward back; one set over ours since (accelerate's
        autocast wrapper, say) stays, ours inside it passing through."""
        self._installed = False
        if vars(self._lm).get("forward") is not self._forward:
            return
        if self._own_forward is not None:
            self._lm.forward = self._own_forward
        else:
            del self._lm.forward

    def _chunk_for(self, hidden: torch.Tensor) -> int:
        """The chunk of this call (the option's, or the default for its
        tokens), its working bytes counted."""
        tokens = hidden.numel() // hidden.shape[-1]
        vocab, width = self._head.weight.shape
        chunk = (chunk_tokens_for(tokens, vocab, width)
                 if self._chunk_tokens is None else self._chunk_tokens)
        self.working_bytes = max(self.working_bytes, working_bytes(
            chunk, tokens, vocab, width))
        return chunk

    def _chunked(self, original: Callable[..., Any], args: Any,
                 kwargs: Any) -> Any:
        hidden: List[torch.Tensor] = []

        def head_forward(x: torch.Tensor) -> torch.Tensor:
            hidden.append(x)
            return x

        def loss_function(logits: torch.Tensor, labels: torch.Tensor,
                          vocab_size: Optional[int] = None,
                          num_items_in_batch: Optional[object] = None,
                          ignore_index: int = -100,
                          shift_labels: Optional[torch.Tensor] = None,
                          **_: Any) -> torch.Tensor:
            if len(hidden) != 1 or logits is not hidden[0]:
                raise RuntimeError(
                    f"lohan: {type(self._lm).__name__} changed its logits "
                    "between the head and the loss, so its loss cannot be "
                    "chunked: pass chunked_loss=False to lohan.init")
            if shift_labels is None:
                padded = F.pad(labels, (0, 1), value=ignore_index)
                shift_labels = padded[..., 1:]
            return linear_cross_entropy(
                hidden[0], self._head.weight, self._head.bias, shift_labels,
                chunk_tokens=self._chunk_for(hidden[0]),
                ignore_index=ignore_index, divisor=num_items_in_batch)

        lm, head = self._lm, self._head
        head_own_forward = vars(head).get("forward")
        head.forward = head_forward
        lm.loss_function = loss_function
        try:
            output = original(*args, **kwargs)
        finally:
            if head_own_forward is not None:
                head.forward = head_own_forward
            else:
                del head.forward
            del vars(lm)["_loss_function"]
        if isinstance(output, tuple):
            raise RuntimeError(
                f"lohan: {type(lm).__name__} returned a tuple "
                "(return_dict=False): its loss cannot be chunked there; "
                "pass chunked_loss=False to lohan.init")
        # The "logits" are the hidden states: no logits were made.
        return type(output)(**{key: value for key, value in output.items()
                               if key != "logits"})
