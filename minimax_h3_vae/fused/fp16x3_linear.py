"""float32 Linear (proj_out) as one fp16 GEMM on quack: each float32 operand split into two fp16 parts.

The release runs proj_out (2048 -> 3072 over every token) in float32. `tf32x3_linear` does that with three
TF32 products per tile in a Triton GEMM (8.7 ms at 28 tiles on the H200); fp16 tensor cores run at twice TF32's
rate, and quack's Hopper GEMM reaches cuBLAS's speed on them: 3.0 ms here, the split included. So
(gemm="quack"):

1. Each row of x, and each row of the weight, is scaled by a power of two `s` that puts its largest finite
   magnitude in [2^14, 2^15), and split into `hi = fp16(x s)` and `lo = fp16(x s - hi)`. `x s - hi` is exact
   in float32, so `hi + lo` holds x s to about 2^-22 (22 significant bits, what TF32x3's split keeps).
2. Laid out along K as x' = [hi | hi | lo] (M, 3K) and w' = [w_hi | w_lo | w_hi] (N, 3K), one GEMM of depth 3K
   sums `hi w_hi + hi w_lo + lo w_hi` in float32. Only `lo w_lo` (~2^-22 relative) is left out, as in
   tf32x3_linear.
3. The epilogue undoes both scales and adds the bias: `y = acc / s_row / s_col + b`, rounded to float32 once.

Numerics: the split keeps 22 bits, but Hopper's fp16 tensor cores sum less precisely than float32 FMAs do. On the
H200, GEMMs of fp16 values whose products are known exactly come out 7.2e-6 off on average (relative) at depth
6144, against 1.2e-6 for cuBLAS's float32 GEMM on the same values (benchmarks/LOG.md#2026-12-01-fp16x3-proj-out). So at
proj_out's size this op is within 1.4e-5 of the output's largest value (7.6e-6 mean abs), tf32x3_linear within
4.5e-7 and cuBLAS float32 within 2.4e-6: 20x closer than fp16-rounded operands (3.2e-4) can be, and below
anything the decode shows (its error against fp32 moves from 8.38e-3 to 8.39e-3). Not bit-equal to either.
A power of two scales exactly, so a row's result depends on that row alone (the same bits whatever the tile
batch). Values below 2^-17 of their row's largest fall into fp16's subnormals, where they keep an absolute
precision of 2^-39 of that largest. NaN or inf in a row of x (or of the weight) gives NaN in its row (column)
of the result, where a float32 product would give inf for an inf.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..blocks import linear_fp32 as linear_fp32_reference
from ._common import MAX_ROW_WIDTH, as_rows, count_launch, grad_problem, linear_fp32_call, linear_fp32_problem
from ._triton_utils import row_launch
from .quack_common import ALIGN, gemm_config, import_problem, tensors_problem

__all__ = [
    "linear_fp32",
    "linear_fp32_reference",
    "model_call",
    "new_state",
    "split_rows",
    "split_rows_reference",
    "split_weight",
    "unsupported",
]

# The scale puts a row's largest magnitude in [2^TOP, 2^(TOP + 1)), below fp16's largest finite (65504).
TOP = 14
# Scales stay within [2^-MAX_SHIFT, 2^MAX_SHIFT], normal float32 numbers, as are their inverses.
MAX_SHIFT = 126


@triton.jit
def _split_rows_kernel(
    src_ptr,
    out_ptr,
    inv_scale_ptr,
    n_rows,
    n_cols,
    stride_src,
    LO_SEGMENT: tl.constexpr,
    TOP: tl.constexpr,
    MAX_SHIFT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """src: (n_rows, n_cols) float32, row stride `stride_src`, unit column stride. out: (n_rows, 3 * n_cols)
    float16 contiguous, written [hi | hi | lo] (LO_SEGMENT 2) or [hi | lo | hi] (LO_SEGMENT 1).
    inv_scale: (n_rows,) float32, 1 / s per row. BLOCK_R whole rows per program."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    rows = rows.to(tl.int64)
    x = tl.load(src_ptr + rows[:, None] * stride_src + cols[None, :], mask=mask, other=0.0)
    magnitude = tl.abs(x)
    # The largest finite magnitude (NaN <= max is false): a NaN or inf must not set the scale of its row.
    largest = tl.max(tl.where(magnitude <= 3.4028234663852886e38, magnitude, 0.0), axis=1)
    # floor(log2(largest)) from the exponent bits (-127 for zero and subnormals), so s is an exact power of 2.
    exponent = ((largest.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    shift = tl.minimum(tl.maximum(TOP - exponent, -MAX_SHIFT), MAX_SHIFT)
    scale = ((shift + 127) << 23).to(tl.float32, bitcast=True)
    value = x * scale[:, None]
    hi = value.to(tl.float16)
    lo = (value - hi.to(tl.float32)).to(tl.float16)  # value - hi is exact (Sterbenz): only lo's rounding is lost
    base = out_ptr + rows[:, None] * (3 * n_cols) + cols[None, :]
    tl.store(base, hi, mask=mask)
    if LO_SEGMENT == 1:
        tl.store(base + n_cols, lo, mask=mask)
        tl.store(base + 2 * n_cols, hi, mask=mask)
    else:
        tl.store(base + n_cols, hi, mask=mask)
        tl.store(base + 2 * n_cols, lo, mask=mask)
    tl.store(inv_scale_ptr + rows, ((127 - shift) << 23).to(tl.float32, bitcast=True), mask=row_ok)


def split_rows(t: torch.Tensor, lo_segment: int) -> tuple[torch.Tensor, torch.Tensor]:
    """t: (R, K) float32, contiguous last dim, on CUDA (or the CPU under TRITON_INTERPRET=1) -> (parts (R, 3K)
    float16 contiguous: each row [hi | hi | lo] for lo_segment 2 or [hi | lo | hi] for 1, of the row scaled by a
    power of two s; inv_scale (R,) float32, 1 / s). K <= MAX_ROW_WIDTH. Contract checked by the caller."""
    n_rows, n_cols = t.shape
    parts = torch.empty(n_rows, 3 * n_cols, dtype=torch.float16, device=t.device)
    inv_scale = torch.empty(n_rows, dtype=torch.float32, device=t.device)
    if n_rows:
        grid, meta = row_launch(n_rows, n_cols)
        constants = {"LO_SEGMENT": lo_segment, "TOP": TOP, "MAX_SHIFT": MAX_SHIFT}
        _split_rows_kernel[grid](t, parts, inv_scale, n_rows, n_cols, t.stride(0), **constants, **meta)
    return parts, inv_scale


def split_rows_reference(t: torch.Tensor, lo_segment: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What `split_rows` computes, in torch."""
    magnitude = t.abs()
    largest = torch.where(magnitude < float("inf"), magnitude, 0.0).amax(dim=1)
    _, exponent = torch.frexp(largest)  # largest = m 2^e with m in [0.5, 1): floor(log2) = e - 1
    exponent = torch.where(largest >= torch.finfo(torch.float32).tiny, exponent - 1, -127)
    shift = (TOP - exponent).clamp(-MAX_SHIFT, MAX_SHIFT).to(torch.float32)
    value = t * torch.exp2(shift)[:, None]
    hi = value.half()
    lo = (value - hi.float()).half()
    parts = (hi, lo, hi) if lo_segment == 1 else (hi, hi, lo)
    return torch.cat(parts, dim=1), torch.exp2(-shift)


@functools.cache
def _epilogue():
    """y = acc * row_scale * col_scale + bias, built once (this imports quack)."""
    from quack.epilogue.frontend import gemm_epilogue
    from quack.epilogue.ops import ColVecLoad, RowVecLoad

    @gemm_epilogue(
        ops={"bias": RowVecLoad("bias"), "col_scale": RowVecLoad("col_scale"), "row_scale": ColVecLoad("row_scale")}
    )
    def unscale(acc, bias, col_scale, row_scale):
        # Both scales are powers of two, so both products are exact.
        return {"D": acc * row_scale * col_scale + bias}

    return unscale


def new_state() -> dict:
    """What one model's launcher keeps: the split of its proj_out weight (`split_weight`'s `weights`)."""
    return {"weights": {}}


def model_call(config, device: torch.device, dtype: torch.dtype) -> tuple:
    """The op's arguments as the decoder passes them (zeros, two tokens): for `unsupported` and the warm-up."""
    return linear_fp32_call(config, device)


def unsupported(x, weight, bias) -> str | None:
    """Why `linear_fp32(x, weight, bias)` is outside the kernel's contract, or None (this imports quack)."""
    tensors = [t for t in (x, weight, bias) if t is not None]
    problem = linear_fp32_problem(x, weight, bias) or tensors_problem(tensors, dtypes=(torch.float32,))
    if problem:
        return problem
    (n, k), align = weight.shape, ALIGN // 2  # float32 output rows: 16 bytes are 4 elements
    if k % ALIGN or n % align or k > MAX_ROW_WIDTH:
        return f"K must be a multiple of {ALIGN} up to {MAX_ROW_WIDTH} and N a multiple of {align}, got K={k}, N={n}"
    return grad_problem(tensors) or import_problem()


def split_weight(weight: torch.Tensor, weights: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`split_rows(weight, lo_segment=1)`, kept in `weights` (the model's cache, bound into its ops):
    id(weight) -> (weight, its version, the split). The weight is held (its id is never reused while its
    entry stands) and split again when written in place; the model's proj_out weight is so split once, not
    per call. None: no cache."""
    key, version = id(weight), None if weight.is_inference() else weight._version
    hit = weights.get(key) if weights is not None else None
    if hit and hit[0] is weight and hit[1] == version:
        return hit[2]
    split = split_rows(weight, lo_segment=1)
    if weights is not None:
        weights.clear()  # one proj_out per model: the weight it replaces is not used again
        weights[key] = (weight, version, split)
    return split


def linear_fp32(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    launches: dict[str, int] | None = None,
    weights: dict | None = None,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` in float32 as one fp16 GEMM over split operands (module docstring).

    x: (..., K) float32 on a Hopper GPU, last dim contiguous, leading dims flattening to one row stride.
    weight: (N, K) float32, last dim contiguous. bias: (N,) float32 contiguous, or None. K a multiple of 8 up
    to 8192, N a multiple of 4. Returns a new contiguous (..., N) float32 tensor: the product summed by fp16
    tensor cores into float32 at depth 3K (the module docstring has the accuracy). Raises ValueError outside
    this contract. weights: the model's cache of the weight's split (`split_weight`).
    """
    problem = unsupported(x, weight, bias)
    if problem:
        raise ValueError(f"linear_fp32: {problem}")
    rows = as_rows(x)
    n = weight.shape[0]
    out = torch.empty(rows.shape[0], n, dtype=torch.float32, device=x.device)
    if out.numel():
        x_parts, row_scale = split_rows(rows, lo_segment=2)
        w_parts, col_scale = split_weight(weight, weights)
        _epilogue()(
            x_parts,
            w_parts.T,
            out={"D": out},
            config=gemm_config(),
            tuned=False,
            bias=bias if bias is not None else torch.zeros(n, dtype=torch.float32, device=x.device),
            col_scale=col_scale,
            row_scale=row_scale,
        )
        count_launch(launches, "fp16x3_linear")
    return out.view(*x.shape[:-1], n)
