"""The QK norm and RoPE with the eager op's bits: the `qk_rms_norm_rope` kernel with its RMS in torch's CUDA
order."""

from __future__ import annotations

from torch import Tensor

from ..blocks import qk_rms_norm_rope as qk_rms_norm_rope_reference
from . import qk_rms_norm_rope as fast
from ._triton_utils import torch_order_problem

__all__ = ["model_call", "qk_rms_norm_rope", "qk_rms_norm_rope_reference", "unsupported"]

model_call = fast.model_call


def unsupported(qkv, cos, sin, num_heads, eps) -> str | None:
    """Why `qk_rms_norm_rope(...)` is outside the kernel's contract, or None: the fast kernel's contract, with a
    head dim of at least 4."""
    problem = fast.unsupported(qkv, cos, sin, num_heads, eps)
    return problem or torch_order_problem(qkv.shape[-1] // (3 * num_heads))


def qk_rms_norm_rope(
    qkv: Tensor, cos: Tensor, sin: Tensor, num_heads: int, eps: float, *, launches: dict[str, int] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """`blocks.qk_rms_norm_rope` in one launch, bit for bit on CUDA (the RMS in torch's order). Arguments and
    returns as `qk_rms_norm_rope.qk_rms_norm_rope`'s; raises ValueError outside this contract."""
    return fast.launch(qkv, cos, sin, num_heads, eps, launches, "qk_rms_norm_rope_exact", torch_order=True)
