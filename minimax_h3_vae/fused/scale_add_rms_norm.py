"""`residual += y * scale` in place, then RMSNorm of the new residual: one Triton launch; the sum of squares in
Triton's order, or in torch's (`launch(torch_order=True)`, the `scale_add_rms_norm_exact` kernel)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..blocks import scale_add_rms_norm as scale_add_rms_norm_reference
from . import _common
from ._common import MAX_ROW_WIDTH, as_rows, count_launch, device_problem, dtype_problem, grad_problem, is_number
from ._triton_utils import (
    NO_FMA,
    built_for_interpreter,
    inv_rms,
    row_launch,
    to_dtype,
    torch_add_squares,
    torch_inv_rms,
    torch_order_problem,
    torch_row_order,
    torch_tree_sum,
    torch_vector_columns,
)

__all__ = ["launch", "model_call", "scale_add_rms_norm", "scale_add_rms_norm_reference", "unsupported"]


@triton.jit
def _scale_add_rms_norm_kernel(
    res_ptr,
    y_ptr,
    scale_ptr,
    w_ptr,
    out_ptr,
    n_rows,
    n_cols,
    stride_res,
    stride_y,
    eps,
    NORM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    THREADS: tl.constexpr,
    WARPS: tl.constexpr,
    VECTORS: tl.constexpr,
    LANE_STEPS: tl.constexpr,
    WARP_STEPS: tl.constexpr,
    TORCH_ORDER: tl.constexpr,
):
    """res: (n_rows, n_cols) float32, row stride `stride_res`, updated in place. y: (n_rows, n_cols) any float
    dtype, row stride `stride_y`. scale, w: (n_cols,) float32. out: (n_rows, n_cols) contiguous, written only
    when NORM (w and out are unused otherwise). Unit column strides throughout.

    The new residual is a product and a sum, each rounded (no fused multiply-add: eager's two ops). With
    TORCH_ORDER its sum of squares is taken in torch's order (`torch_row_order`; n_cols a multiple of 4) from
    the row as it will be stored, so the new row is computed twice: once in torch's reading order for the
    norm, once in blocks to store it and its norm; else in Triton's order, from the block."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_cols
    row_mask = (rows < n_rows)[:, None]
    mask = row_mask & col_mask[None, :]
    rows = rows.to(tl.int64)[:, None]

    if NORM and TORCH_ORDER:
        acc = tl.zeros((BLOCK_R, THREADS), dtype=tl.float32)
        for k in tl.static_range(VECTORS):
            col = k * THREADS * 4 + torch_vector_columns(THREADS)
            in_row = col < n_cols
            vector_mask = row_mask[:, :, None] & in_row
            old = tl.load(res_ptr + rows[:, :, None] * stride_res + col, mask=vector_mask, other=0.0)
            y = tl.load(y_ptr + rows[:, :, None] * stride_y + col, mask=vector_mask, other=0.0).to(tl.float32)
            new = old + y * tl.load(scale_ptr + col, mask=in_row, other=0.0)
            acc = torch_add_squares(new, acc, BLOCK_R, THREADS)
        inv = torch_inv_rms(torch_tree_sum(acc, BLOCK_R, THREADS, WARPS, LANE_STEPS, WARP_STEPS), n_cols, eps)

    res_ptrs = res_ptr + rows * stride_res + cols[None, :]
    residual = tl.load(res_ptrs, mask=mask, other=0.0)
    y = tl.load(y_ptr + rows * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + cols, mask=col_mask, other=0.0)
    residual = residual + y * scale[None, :]
    tl.store(res_ptrs, residual, mask=mask)
    if NORM:
        if not TORCH_ORDER:
            inv = inv_rms(residual, n_cols, eps)
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0)
        normed = residual * inv[:, None] * w[None, :]
        tl.store(out_ptr + rows * n_cols + cols[None, :], to_dtype(normed, out_ptr.dtype.element_ty), mask=mask)


def model_call(config, device: torch.device, dtype: torch.dtype) -> tuple:
    """The op's arguments as the decoder passes them (zeros, two tokens): for `unsupported` and the warm-up."""
    c = config
    residual, y = _common.zeros(device, 1, 2, c.dim), _common.zeros(device, 1, 2, c.dim, dtype=dtype)
    return (residual, y, _common.zeros(device, c.dim), _common.zeros(device, c.dim), c.norm_eps, dtype)


def unsupported(residual, y, scale, weight, eps, out_dtype) -> str | None:
    """Why `scale_add_rms_norm(...)` with these arguments is outside the kernel's contract, or None."""
    if not isinstance(residual, torch.Tensor) or not isinstance(y, torch.Tensor) or residual.dim() == 0:
        return "residual and y must be tensors with at least one dim"
    if residual.dtype != torch.float32:
        return f"residual must be float32, got {residual.dtype}"
    if y.shape != residual.shape:
        return f"y must have residual's shape {tuple(residual.shape)}, got {tuple(y.shape)}"
    n_cols = residual.shape[-1]
    problem = dtype_problem("y", y.dtype) or _common.row_vector_problem("scale", scale, n_cols)
    if problem:
        return problem
    if n_cols > MAX_ROW_WIDTH:
        return f"rows longer than {MAX_ROW_WIDTH} are not supported, got {n_cols}"
    if as_rows(residual) is None or as_rows(y) is None:
        return "residual and y must have a contiguous last dim and leading dims that flatten into one row stride"
    tensors = [residual, y, scale]
    if weight is not None:
        problem = _common.row_vector_problem("weight", weight, n_cols) or dtype_problem("out_dtype", out_dtype)
        if problem:
            return problem
        if not is_number(eps):
            return f"eps must be a real number, got {type(eps).__name__}"
        tensors.append(weight)
    return device_problem(tensors, built_for_interpreter(_scale_add_rms_norm_kernel)) or grad_problem(tensors)


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
    """`blocks.scale_add_rms_norm` in one launch: `residual += y * scale` in float32 (eager's bits), then its
    RMSNorm, the sum of squares in Triton's order (within float32 rounding of the eager op;
    `scale_add_rms_norm_exact` keeps its bits).

    residual: (..., C) float32, last dim contiguous, leading dims flattening to one row stride; updated in
    place and returned. y: residual's shape, float32/float16/bfloat16, same layout rule (strides may differ).
    scale, weight: (C,) float32 contiguous, C <= 8192. With weight None only the add runs and normed is None;
    otherwise normed is a new contiguous (..., C) tensor of `out_dtype`. Raises ValueError outside this
    contract.
    """
    return launch(residual, y, scale, weight, eps, out_dtype, launches, "scale_add_rms_norm", torch_order=False)


def launch(
    residual: Tensor,
    y: Tensor,
    scale: Tensor,
    weight: Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
    launches: dict[str, int] | None,
    name: str,
    torch_order: bool,
) -> tuple[Tensor, Tensor | None]:
    """The kernel of both launchers: checks `unsupported` (and, for torch's order, a row length that is a
    multiple of 4), launches once, counts it under `name`."""
    problem = unsupported(residual, y, scale, weight, eps, out_dtype) or (
        torch_order and torch_order_problem(residual.shape[-1])
    )
    if problem:
        raise ValueError(f"scale_add_rms_norm: {problem}")
    res_rows, y_rows = as_rows(residual), as_rows(y)
    n_rows, n_cols = res_rows.shape
    norm = weight is not None
    normed = torch.empty(residual.shape, dtype=out_dtype, device=residual.device) if norm else None
    if n_rows == 0:
        return residual, normed
    grid, meta = row_launch(n_rows, n_cols, torch_order)
    _scale_add_rms_norm_kernel[grid](
        res_rows,
        y_rows,
        scale,
        weight if norm else scale,
        normed if norm else res_rows,
        n_rows,
        n_cols,
        res_rows.stride(0),
        y_rows.stride(0),
        float(eps) if norm else 0.0,
        NORM=norm,
        **meta,
        **torch_row_order(n_cols if torch_order else 4),
        TORCH_ORDER=torch_order,
        **NO_FMA,
    )
    count_launch(launches, name)
    return residual, normed
