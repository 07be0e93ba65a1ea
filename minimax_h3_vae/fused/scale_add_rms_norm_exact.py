"""The residual add and the RMSNorm after it with the eager op's bits: the `scale_add_rms_norm` kernel with its
sum of squares in torch's CUDA order."""

from __future__ import annotations

import torch
from torch import Tensor

from ..blocks import scale_add_rms_norm as scale_add_rms_norm_reference
from . import scale_add_rms_norm as fast
from ._triton_utils import torch_order_problem

__all__ = ["model_call", "scale_add_rms_norm", "scale_add_rms_norm_reference", "unsupported"]

model_call = fast.model_call


def unsupported(residual, y, scale, weight, eps, out_dtype) -> str | None:
    """Why `scale_add_rms_norm(...)` is outside the kernel's contract, or None: the fast kernel's contract, with
    rows a multiple of 4 long."""
    problem = fast.unsupported(residual, y, scale, weight, eps, out_dtype)
    return problem or torch_order_problem(residual.shape[-1])


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
    """`blocks.scale_add_rms_norm` in one launch, bit for bit on CUDA (the norm's sum of squares in torch's
    order). Arguments as `scale_add_rms_norm.scale_add_rms_norm`'s, with C a multiple of 4; raises ValueError
    outside this contract."""
    name = "scale_add_rms_norm_exact"
    return fast.launch(residual, y, scale, weight, eps, out_dtype, launches, name, torch_order=True)
