"""RMSNorm with the eager op's bits: the `rms_norm` kernel with its sum of squares in torch's CUDA order."""

from __future__ import annotations

import torch

from ..blocks import rms_norm as rms_norm_reference
from . import rms_norm as fast
from ._triton_utils import torch_order_problem

__all__ = ["model_call", "rms_norm", "rms_norm_reference", "unsupported"]

model_call = fast.model_call


def unsupported(x, weight, eps, out_dtype) -> str | None:
    """Why `rms_norm(x, weight, eps, out_dtype)` is outside the kernel's contract, or None: the fast kernel's
    contract, with rows a multiple of 4 long."""
    return fast.unsupported(x, weight, eps, out_dtype) or torch_order_problem(x.shape[-1])


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype, *, launches: dict[str, int] | None = None
) -> torch.Tensor:
    """`blocks.rms_norm` in one launch, bit for bit on CUDA (the sum of squares in torch's order). Arguments as
    `rms_norm.rms_norm`'s, with C a multiple of 4; raises ValueError outside this contract."""
    return fast.launch(x, weight, eps, out_dtype, launches, "rms_norm_exact", torch_order=True)
