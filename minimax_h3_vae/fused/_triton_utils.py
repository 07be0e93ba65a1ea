"""Triton helpers shared by the kernels: the RMS scale and torch-exact rounding to the output dtype."""

from __future__ import annotations

import triton
import triton.language as tl


def row_launch(n_rows: int, n_cols: int) -> tuple[tuple[int], dict[str, int]]:
    """(grid, meta) of a kernel that holds whole rows, launched `kernel[grid](..., **meta)`: meta's BLOCK_C
    covers the row, and short rows are packed BLOCK_R to a program so that each program still moves about
    4096 elements (num_warps: 8 from 4096 columns)."""
    block_c = triton.next_power_of_2(n_cols)
    block_r = max(1, 4096 // block_c)
    return (triton.cdiv(n_rows, block_r),), {
        "BLOCK_R": block_r,
        "BLOCK_C": block_c,
        "num_warps": 8 if block_c >= 4096 else 4,
    }


def built_for_interpreter(kernel) -> bool:
    """Whether `triton.jit` made `kernel` for the CPU interpreter (TRITON_INTERPRET set when it was defined)."""
    return not isinstance(kernel, triton.runtime.JITFunction)


@triton.jit
def inv_rms(x, n_cols, eps):
    """x (rows, BLOCK) float32, zero past n_cols -> (rows,) float32 `rsqrt(mean(x^2) + eps)`."""
    return tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)


@triton.jit
def to_dtype(x, dtype: tl.constexpr):
    """float32 `x` rounded to nearest-even into `dtype` (float32, float16 or bfloat16), as torch's casts round."""
    if dtype == tl.bfloat16:
        # Triton's interpreter truncates float32 -> bfloat16; rounding the bits by hand makes the cast below
        # exact, so the interpreter and the GPU both match torch bit for bit. NaN keeps its own bits.
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    return x.to(dtype)


# Launch option for every kernel: torch rounds each product before adding it, and a fused multiply-add
# would round once, so contraction stays off to reproduce the eager results bit for bit.
NO_FMA = {"enable_fp_fusion": False}
