"""Derived weights are made once per model, not per call: fp16x3's split of the proj_out weight is kept in the
model's ops (and made again only when the weight is written), with the same values a split per call gives."""

from __future__ import annotations

import pytest
import torch

from minimax_h3_vae import fused
from minimax_h3_vae.fused import interpreting
from minimax_h3_vae.fused.fp16x3_linear import split_rows, split_weight

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not interpreting(), reason="CPU runs need TRITON_INTERPRET=1")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


@pytest.mark.parametrize("device", DEVICES)
def test_the_weight_split_is_made_once_and_again_after_a_write(device):
    weight = torch.randn(24, 40, generator=torch.Generator().manual_seed(0)).to(device)
    weights = {}
    first = split_weight(weight, weights)
    assert split_weight(weight, weights) is first, "kept: not split again per call"
    assert all(torch.equal(a, b) for a, b in zip(first, split_rows(weight, lo_segment=1))), "the same values"
    weight.mul_(3.0)
    again = split_weight(weight, weights)
    assert again is not first and all(torch.equal(a, b) for a, b in zip(again, split_rows(weight, lo_segment=1)))
    assert len(weights) == 1, "one proj_out per model"
    assert split_weight(weight, None) is not split_weight(weight, None), "without a cache nothing is kept"


def test_each_models_ops_keep_their_own_state():
    """The rotation tables and the weight split belong to one model's ops: two models never share them."""
    kernels = fused.Kernels(linear_qk_rms_norm_rope="quack", linear_fp32="fp16x3")
    a, b = fused.ops_for(kernels), fused.ops_for(kernels)
    assert a.linear_qk_rms_norm_rope.keywords["tables"] is not b.linear_qk_rms_norm_rope.keywords["tables"]
    assert a.linear_fp32.keywords["weights"] is not b.linear_fp32.keywords["weights"]
    launches = {}
    c = fused.ops_for(kernels, launches)
    assert c.linear_fp32.keywords["launches"] is launches is c.linear_qk_rms_norm_rope.keywords["launches"]
