"""Triton helpers shared by the kernels: the RMS scale and torch-exact rounding to the output dtype."""

from __future__ import annotations

import triton
import triton.language as tl


def row_launch(n_rows: int, n_cols: int, torch_order: bool = False) -> tuple[tuple[int], dict[str, int]]:
    """(grid, meta) of a kernel that holds whole rows, launched `kernel[grid](..., **meta)`: meta's BLOCK_C
    covers the row, and short rows are packed BLOCK_R to a program so that each program still moves about
    4096 elements (num_warps: 8 from 4096 columns). A kernel that sums in torch's order (`torch_order`) gets
    one row per program, as torch's kernel has: its per-thread sums and halving trees over several rows cost
    more than the row's loads, over one row about what the fast kernel's reduction costs (benchmarks/LOG.md,
    2026-12-04-exact-one-row)."""
    block_c = triton.next_power_of_2(n_cols)
    block_r = 1 if torch_order else max(1, 4096 // block_c)
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
    """x (rows, BLOCK) float32, zero past n_cols -> (rows,) float32 `rsqrt(mean(x^2) + eps)`, summed in the
    order Triton's reduction takes (fast; within float32 rounding of torch's)."""
    return tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)


# torch's CUDA RMSNorm (its vectorised layer-norm kernel, as of torch 2.11) sums a row's squares in a fixed
# order: 128 threads read the row in 4-wide vectors, thread t the vectors t, t + 128, ..., each square added
# into its running sum by a fused multiply-add; the 32 lanes of each warp are then summed as a halving tree
# (lane l takes lane l + 16, then l + 8, ...), and the warps' sums likewise (w takes w + 2, then w + 1).
# `torch_row_order` and `torch_sum_of_squares` reproduce that order, so that a kernel's RMS is torch's to the bit
# (measured on an H200 over 10^7 random rows of 64 and of 2048; docs/kernels.md). Idle threads (rows of
# fewer than 512 elements) hold zeros, which add exactly.
TORCH_THREADS = 128
TORCH_VECTOR = 4


def torch_order_problem(n_cols: int) -> str | None:
    """Why rows of `n_cols` cannot be summed in torch's order (its 4-wide vectors need a multiple of 4), or None."""
    if n_cols % TORCH_VECTOR:
        return f"torch's order reads rows in vectors of {TORCH_VECTOR}: rows must be a multiple of 4 long, got {n_cols}"
    return None


def torch_row_order(n_cols: int) -> dict[str, int]:
    """The constexprs of a row of `n_cols` (a multiple of TORCH_VECTOR) read in torch's order: THREADS (those
    that hold data, a power of two), WARPS, VECTORS per thread (each thread's element `k * THREADS * 4 + t * 4 +
    v` for k < VECTORS, v < 4), and the halvings of the trees: LANE_STEPS = log2(THREADS / WARPS), WARP_STEPS =
    log2(WARPS)."""
    threads = min(TORCH_THREADS, triton.next_power_of_2(triton.cdiv(n_cols, TORCH_VECTOR)))
    warps = max(1, threads // 32)
    return {
        "THREADS": threads,
        "WARPS": warps,
        "VECTORS": triton.cdiv(n_cols, TORCH_THREADS * TORCH_VECTOR) if threads == TORCH_THREADS else 1,
        "LANE_STEPS": (threads // warps).bit_length() - 1,
        "WARP_STEPS": warps.bit_length() - 1,
    }


@triton.jit
def torch_vector_columns(THREADS: tl.constexpr):
    """(1, THREADS, 4): the columns of each thread's first vector in torch's order (thread t's at [0, t, :]); its
    k-th vectors are these plus `k * THREADS * 4`."""
    return tl.arange(0, THREADS)[None, :, None] * 4 + tl.arange(0, 4)[None, None, :]


@triton.jit
def torch_add_squares(vectors, acc, ROWS: tl.constexpr, THREADS: tl.constexpr):
    """acc (ROWS, THREADS) float32, each thread's running sum in torch's order, with the squares of its next
    vector `vectors` (ROWS, THREADS, 4) float32 added element by element by fused multiply-adds."""
    even, odd = tl.split(tl.reshape(vectors, (ROWS, THREADS, 2, 2)))  # elements (0, 2) and (1, 3)
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    acc = tl.fma(x0, x0, acc)
    acc = tl.fma(x1, x1, acc)
    acc = tl.fma(x2, x2, acc)
    return tl.fma(x3, x3, acc)


@triton.jit
def torch_sum_of_squares(
    ptrs,
    cols_left,
    mask,
    ROWS: tl.constexpr,
    THREADS: tl.constexpr,
    WARPS: tl.constexpr,
    VECTORS: tl.constexpr,
    LANE_STEPS: tl.constexpr,
    WARP_STEPS: tl.constexpr,
):
    """(ROWS,) float32 sums of squares of rows read in torch's order (`torch_row_order`'s constexprs), a whole
    vector per load. ptrs: (ROWS, 1) pointers to each row's first element; cols_left: the row length; mask:
    (ROWS, 1) rows to read."""
    acc = tl.zeros((ROWS, THREADS), dtype=tl.float32)
    for k in tl.static_range(VECTORS):
        col = k * THREADS * 4 + torch_vector_columns(THREADS)
        x = tl.load(ptrs[:, :, None] + col, mask=mask[:, :, None] & (col < cols_left), other=0.0)
        acc = torch_add_squares(x.to(tl.float32), acc, ROWS, THREADS)
    return torch_tree_sum(acc, ROWS, THREADS, WARPS, LANE_STEPS, WARP_STEPS)


@triton.jit
def torch_tree_sum(
    acc,
    ROWS: tl.constexpr,
    THREADS: tl.constexpr,
    WARPS: tl.constexpr,
    LANE_STEPS: tl.constexpr,
    WARP_STEPS: tl.constexpr,
):
    """acc (ROWS, THREADS) float32, each thread's running sum -> (ROWS,): the warps' halving trees, then the
    warps'. A sum of two is the same in either order, so each halving is a sum over a size-2 axis."""
    acc = tl.reshape(acc, (ROWS, WARPS, THREADS // WARPS))
    for step in tl.static_range(LANE_STEPS):
        acc = tl.sum(tl.reshape(acc, (ROWS, WARPS, 2, (THREADS // WARPS) >> (step + 1))), axis=2)
    acc = tl.reshape(acc, (ROWS, WARPS))
    for step in tl.static_range(WARP_STEPS):
        acc = tl.sum(tl.reshape(acc, (ROWS, 2, WARPS >> (step + 1))), axis=1)
    return tl.reshape(acc, (ROWS,))


@triton.jit
def torch_inv_rms(sum_of_squares, n_cols, eps):
    """torch's `rsqrt(sum / n + eps)` from a row's sum of squares: a correctly rounded division."""
    return tl.rsqrt(tl.div_rn(sum_of_squares, n_cols * 1.0) + eps)


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
