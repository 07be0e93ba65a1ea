"""RMSNorm over the last dim with an affine weight: one Triton launch, float32 math, any output dtype; the sum of
squares in Triton's order, or in torch's (`launch(torch_order=True)`, the `rms_norm_exact` kernel)."""

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
    inv_rms,
    row_launch,
    to_dtype,
    torch_inv_rms,
    torch_order_problem,
    torch_row_order,
    torch_sum_of_squares,
)

__all__ = ["launch", "model_call", "rms_norm", "rms_norm_reference", "unsupported"]


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
    TORCH_ORDER: tl.constexpr,
):
    """x: (n_rows, n_cols) any float dtype, row stride `stride_x`, unit column stride. w: (n_cols,) float32.
    out: (n_rows, n_cols) contiguous. Each program normalises BLOCK_R rows: `(x * rsqrt(mean + eps)) * w`, the
    sum of squares in torch's order when TORCH_ORDER (`torch_row_order`; n_cols a multiple of 4), else in
    Triton's."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_cols
    row_mask = (rows < n_rows)[:, None]
    mask = row_mask & col_mask[None, :]
    rows = rows.to(tl.int64)[:, None]

    if TORCH_ORDER:
        squares = torch_sum_of_squares(
            x_ptr + rows * stride_x, n_cols, row_mask, BLOCK_R, THREADS, WARPS, VECTORS, LANE_STEPS, WARP_STEPS
        )
        inv = torch_inv_rms(squares, n_cols, eps)
    x = tl.load(x_ptr + rows * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if not TORCH_ORDER:
        inv = inv_rms(x, n_cols, eps)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0)
    y = x * inv[:, None] * w[None, :]
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
    if x.shape[-1] > MAX_ROW_WIDTH:
        return f"rows longer than {MAX_ROW_WIDTH} are not supported, got {x.shape[-1]}"
    if as_rows(x) is None:
        return "x must have a contiguous last dim and leading dims that flatten into one row stride"
    if not is_number(eps):
        return f"eps must be a real number, got {type(eps).__name__}"
    return device_problem((x, weight), built_for_interpreter(_rms_norm_kernel)) or grad_problem((x, weight))


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype, *, launches: dict[str, int] | None = None
) -> torch.Tensor:
    """`blocks.rms_norm` in one launch: RMSNorm over the last dim, float32 math, returned in `out_dtype`; the
    sum of squares in Triton's order (within float32 rounding of the eager op; `rms_norm_exact` keeps its bits).

    x: (..., C) float32/float16/bfloat16, last dim contiguous, leading dims flattening to one row stride
    (e.g. rows of a wider buffer), C <= 8192. weight: (C,) float32 contiguous. Returns a new contiguous
    (..., C) tensor of `out_dtype`. Raises ValueError outside this contract.
    """
    return launch(x, weight, eps, out_dtype, launches, "rms_norm", torch_order=False)


def launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype,
    launches: dict[str, int] | None,
    name: str,
    torch_order: bool,
) -> torch.Tensor:
    """The kernel of both RMSNorm launchers: checks `unsupported` (and, for torch's order, a row length that
    is a multiple of 4), launches once, counts it under `name`."""
    problem = unsupported(x, weight, eps, out_dtype) or (torch_order and torch_order_problem(x.shape[-1]))
    if problem:
        raise ValueError(f"rms_norm: {problem}")
    rows = as_rows(x)
    n_rows, n_cols = rows.shape
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if n_rows == 0:
        return out
    grid, meta = row_launch(n_rows, n_cols, torch_order)
    order = torch_row_order(n_cols if torch_order else 4)
    _rms_norm_kernel[grid](
        rows, weight, out, n_rows, n_cols, rows.stride(0), float(eps), **meta, **order, TORCH_ORDER=torch_order,
        **NO_FMA,
    )  # fmt: skip
    count_launch(launches, name)
    return out
