"""Gated SiLU of the FFN, `silu(gate) * value` over the two halves of w1's output: one Triton launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..blocks import silu_mul as silu_mul_reference
from ._common import as_rows, count_launch, device_problem, dtype_problem, grad_problem, zeros
from ._triton_utils import NO_FMA, built_for_interpreter, to_dtype

__all__ = ["model_call", "silu_mul", "silu_mul_reference", "unsupported"]

_BLOCK = 2048


@triton.jit
def _silu_mul_kernel(h_ptr, out_ptr, half, stride_h, BLOCK: tl.constexpr, LIBDEVICE_EXP: tl.constexpr):
    """h: (rows, 2 * half) any float dtype, row stride `stride_h`, unit column stride, [gate | value].
    out: (rows, half) contiguous, h's dtype. Grid: (rows, column blocks of BLOCK).

    silu is `g / (1 + exp(-g))` with CUDA's accurate expf (libdevice) and a correctly rounded division, the
    same float32 arithmetic as torch's silu, so the rounded results agree bit for bit; `tl.exp` is a
    faster approximation that flips the rounding of ~1 in 6 fp16 outputs. The interpreter has no
    libdevice and uses `tl.exp`."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < half
    gate = tl.load(h_ptr + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
    value = tl.load(h_ptr + row * stride_h + half + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    # Rounded to the dtype between the two ops, as eager's silu and mul each round their result.
    if LIBDEVICE_EXP:
        exp = libdevice.exp(-gate)
    else:
        exp = tl.exp(-gate)
    activated = to_dtype(tl.div_rn(gate, 1.0 + exp), dtype).to(tl.float32)
    tl.store(out_ptr + row * half + cols, to_dtype(activated * value, dtype), mask=mask)


def model_call(config, device: torch.device, dtype: torch.dtype) -> tuple:
    """The op's arguments as the decoder passes them (zeros, two tokens): for `unsupported` and the warm-up."""
    return (zeros(device, 1, 2, 2 * config.ffn_dim, dtype=dtype),)


def unsupported(h) -> str | None:
    """Why `silu_mul(h)` is outside the kernel's contract, or None."""
    if not isinstance(h, torch.Tensor) or h.dim() == 0:
        return "h must be a tensor with at least one dim"
    problem = dtype_problem("h", h.dtype)
    if problem:
        return problem
    if h.shape[-1] % 2:
        return f"h's last dim must be even ([gate | value]), got {h.shape[-1]}"
    if as_rows(h) is None:
        return "h must have a contiguous last dim and leading dims that flatten into one row stride"
    if as_rows(h).shape[0] > 2**31 - 1:
        return "too many rows for one launch"
    return device_problem((h,), built_for_interpreter(_silu_mul_kernel)) or grad_problem((h,))


def silu_mul(h: torch.Tensor, *, launches: dict[str, int] | None = None) -> torch.Tensor:
    """`blocks.silu_mul` in one launch.

    h: (..., 2F) float32/float16/bfloat16, [gate | value] halves, last dim contiguous, leading dims flattening
    to one row stride. Returns a new contiguous (..., F) tensor of h's dtype. Raises ValueError outside this
    contract.
    """
    problem = unsupported(h)
    if problem:
        raise ValueError(f"silu_mul: {problem}")
    rows = as_rows(h)
    half = h.shape[-1] // 2
    out = torch.empty((*h.shape[:-1], half), dtype=h.dtype, device=h.device)
    if out.numel() == 0:
        return out
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(half, _BLOCK))](
        rows,
        out,
        half,
        rows.stride(0),
        BLOCK=_BLOCK,
        LIBDEVICE_EXP=not built_for_interpreter(_silu_mul_kernel),
        num_warps=8,
        **NO_FMA,
    )
    count_launch(launches, "silu_mul")
    return out
