"""lohan.init(bias_correction=False): Adam without its bias correction, as
DeepSpeed's optimizers (bias_correction=False) and Hugging Face's legacy
AdamW(correct_bias=False) run it, against that update written out in torch
(torch's AdamW arithmetic with both 1 - beta^t factors 1), to the suite's
fp32 tolerances; the default keeps torch's AdamW. The option travels as
AdamSpec.no_bias_correction (proto/lohan.proto)."""

from __future__ import annotations

import copy
from typing import Iterable

import pytest
import torch
from torch import nn

from test_engine import (BETAS, EPS, LR, WD, assert_fp32_close, batches,
                         engine_for, tiny_gpt, train_lohan, train_torch)


class UncorrectedAdamW(torch.optim.Optimizer):
    """AdamW as torch's single-tensor loop computes it, bias corrections
    left out (DeepSpeed's bias_correction=False)."""

    def __init__(self, params: Iterable[nn.Parameter]):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                p.mul_(1 - LR * WD)
                exp_avg.lerp_(p.grad, 1 - BETAS[0])
                exp_avg_sq.mul_(BETAS[1]).addcmul_(p.grad, p.grad,
                                                   value=1 - BETAS[1])
                p.addcdiv_(exp_avg, exp_avg_sq.sqrt().add_(EPS), value=-LR)


def test_without_bias_correction_trains_as_deepspeeds_adamw(lohand):
    start = tiny_gpt()
    reference, model = copy.deepcopy(start), copy.deepcopy(start)
    data = batches(4)
    want = train_torch(reference, data,
                       opt=UncorrectedAdamW(reference.parameters()))
    with engine_for(model, lohand, job_name="uncorrected",
                    bias_correction=False) as engine:
        got = train_lohan(engine, model, data)
    assert_fp32_close(model, reference, got, want)
    # The check can fail: torch's AdamW (bias corrected) lands elsewhere.
    corrected = copy.deepcopy(start)
    train_torch(corrected, data)
    with pytest.raises(AssertionError):
        assert_fp32_close(corrected, reference, want, want)


def test_bias_correction_must_be_a_bool():
    import lohan
    with pytest.raises(TypeError, match="bias_correction must be True or "
                       "False"):
        lohan.init(tiny_gpt(), bias_correction="no", socket="/nonexistent")
