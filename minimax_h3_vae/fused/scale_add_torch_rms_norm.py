"""`residual += y * scale` in place in one Triton launch, then torch's own RMSNorm of the new residual: the
eager op's bits (the release's), for runs that ask for them (`exact=True`).

The add is the `scale_add_rms_norm` kernel without its norm (a product and a sum, each rounded to float32, no
fused multiply-add: eager's two ops). The norm is torch's `F.rms_norm`, as the eager op and the release call
it: its sum of squares runs in torch's order, which a Triton row reduction does not reproduce.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..blocks import rms_norm
from ..blocks import scale_add_rms_norm as scale_add_rms_norm_reference
from . import scale_add_rms_norm as scaled_add
from ._common import count_launch

__all__ = ["model_call", "scale_add_rms_norm", "scale_add_rms_norm_reference", "unsupported"]

model_call = scaled_add.model_call
unsupported = scaled_add.unsupported


def scale_add_rms_norm(
    residual: Tensor,
    y: Tensor,
    scale: Tensor,
    weight: Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
    *,
    launches=None,
) -> tuple[Tensor, Tensor | None]:
    """`blocks.scale_add_rms_norm`, bit for bit: the add in one launch, then torch's RMSNorm (none when
    `weight` is None). Arguments and contract as `scale_add_rms_norm.scale_add_rms_norm`'s; raises ValueError
    outside it."""
    problem = unsupported(residual, y, scale, weight, eps, out_dtype)
    if problem:
        raise ValueError(f"scale_add_rms_norm: {problem}")
    residual, _ = scaled_add.scale_add_rms_norm(residual, y, scale, None, eps, out_dtype)
    count_launch(launches, "scale_add_torch_rms_norm")
    return residual, None if weight is None else rms_norm(residual, weight, eps, out_dtype)
