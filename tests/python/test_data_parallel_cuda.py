"""Data-parallel ranks on GPUs (NCCL, one GPU per rank): the CUDA path of
sharding.py (reductions and gathers on torch's stream, shards copied out
and weights copied in by the C library). Skipped without two GPUs;
scripts/device_pack runs it on a machine that has them. The CPU/gloo
runs (test_data_parallel.py) hold the same claims."""

from __future__ import annotations

import pytest
import torch

from test_data_parallel import (assert_matches_adamw, assert_sharded, config,
                                reference, train)

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="needs a second GPU (NCCL ranks take one GPU each)")


def test_two_gpu_ranks_match_adamw_on_the_global_batch(lohand, tmp_path):
    max_norm = 0.6 * reference(1, 1, 0.0, 2, device="cuda:0")["norms"][0]
    result = train(config(steps=5, max_grad_norm=max_norm, backend="nccl"),
                   tmp_path, [lohand.socket], 2)
    assert_matches_adamw(result, 5, 1, max_norm, 2, device="cuda:0")
    assert_sharded(result, 2)


def test_two_gpu_ranks_accumulate_through_streamed_buffers(lohand,
                                                           tmp_path):
    max_norm = 0.8 * reference(1, 2, 0.0, 2, device="cuda:0")["norms"][0]
    result = train(config(steps=3, micro=2, buffers="streamed",
                          max_grad_norm=max_norm, backend="nccl"),
                   tmp_path, [lohand.socket], 2)
    assert_matches_adamw(result, 3, 2, max_norm, 2, device="cuda:0")
    assert_sharded(result, 2)
