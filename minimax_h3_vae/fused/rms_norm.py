"""RMSNorm over the last dim with an affine weight: one Triton launch, float32 math in torch's order, any output
dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..blocks import rms_norm as rms_norm_reference
from . import _common
from ._common import MAX_ROW_WIDTH, as_rows, count_launch, device_problem, dtype_problem, grad_problem, is_number
from ._triton_utils import (
    NO_FMA,
    built_for_interpreter,
    row_launch,
    to_dtype,
    torch_inv_rms,
    torch_row_order,
    torch_sum_of_squares,
)

__all__ = ["model_call", "rms_norm", "rms_norm_reference", "unsupported"]


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    n_rows,
    n_cols,
    stride_x,
    eps,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    THREADS: tl.constexpr,
    WARPS: tl.constexpr,
    VECTORS: tl.constexpr,
    LANE_STEPS: tl.constexpr,
    WARP_STEPS: tl.constexpr,
):
    """x: (n_rows, n_cols) any float dtype, row stride `stride_x`, unit column stride. w: (n_cols,) float32.
    out: (n_rows, n_cols) contiguous. Each program normalises BLOCK_R rows; the sum of squares in torch's
    order (`torch_row_order`), then `(x * rsqrt(mean + eps)) * w` as torch computes it."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_cols
    row_mask = (rows < n_rows)[:, None]
    mask = row_mask & col_mask[None, :]
    rows = rows.to(tl.int64)[:, None]

    squares = torch_sum_of_squares(
        x_ptr + rows * stride_x, n_cols, row_mask, BLOCK_R, THREADS, WARPS, VECTORS, LANE_STEPS, WARP_STEPS
    )
    x = tl.load(x_ptr + rows * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0)
    y = x * torch_inv_rms(squares, n_cols, eps)[:, None] * w[None, :]
    tl.store(out_ptr + rows * n_cols + cols[None, :], to_dtype(y, out_ptr.dtype.element_ty), mask=mask)


def model_call(config, device: torch.device, dtype: torch.dtype) -> tuple:
    """The op's arguments as the decoder passes them (zeros, two tokens): for `unsupported` and the warm-up."""
    c = config
    return (_common.zeros(device, 1, 2, c.dim), _common.zeros(device, c.dim), c.norm_eps, dtype)


def unsupported(x, weight, eps, out_dtype) -> str | None:
    """Why `rms_norm(x, weight, eps, out_dtype)` is outside the kernel's contract, or None."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return "x must be a tensor with at least one dim"
    problem = (
        dtype_problem("x", x.dtype)
        or dtype_problem("out_dtype", out_dtype)
        or _common.row_vector_problem("weight", weight, x.shape[-1])
    )
    if problem:
        return problem
    if x.shape[-1] > MAX_ROW_WIDTH or x.shape[-1] % 4:
        return f"rows must be a multiple of 4 long and at most {MAX_ROW_WIDTH}, got {x.shape[-1]}"
    if as_rows(x) is None:
        return "x must have a contiguous last dim and leading dims that flatten into one row stride"
    if not is_number(eps):
        return f"eps must be a real number, got {type(eps).__name__}"
    return device_problem((x, weight), built_for_interpreter(_rms_norm_kernel)) or grad_problem((x, weight))


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype, *, launches: dict[str, int] | None = None
) -> torch.Tensor:
    """`blocks.rms_norm` in one launch, bit for bit on CUDA: RMSNorm over the last dim, float32 math in torch's
    order, returned in `out_dtype`.

    x: (..., C) float32/float16/bfloat16, last dim contiguous, leading dims flattening to one row stride
    (e.g. rows of a wider buffer), C a multiple of 4, <= 8192. weight: (C,) float32 contiguous. Returns a new contiguous
    (..., C) tensor of `out_dtype`. Raises ValueError outside this contract.
    """
    problem = unsupported(x, weight, eps, out_dtype)
    if problem:
        raise ValueError(f"rms_norm: {problem}")
    rows = as_rows(x)
    n_rows, n_cols = rows.shape
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if n_rows == 0:
        return out
    grid, meta = row_launch(n_rows, n_cols)
    _rms_norm_kernel[grid](
        rows, weight, out, n_rows, n_cols, rows.stride(0), float(eps), **meta, **torch_row_order(n_cols), **NO_FMA
    )
    count_launch(launches, "rms_norm")
    return out
