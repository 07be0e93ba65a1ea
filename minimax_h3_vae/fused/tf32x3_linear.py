"""float32 Linear as three TF32 tensor-core products per tile: near-float32 accuracy at tensor-core speed.

Each float32 operand tile is split in registers into a TF32 high part and the rest, `a = a_hi + a_lo`; then
`a @ b ~= a_hi @ b_hi + a_hi @ b_lo + a_lo @ b_hi`, dropping only `a_lo @ b_lo` (about 2^-22 relative),
with float32 accumulation (Triton's `input_precision="tf32x3"`). No operand is split or copied in memory and
no global matmul setting is touched. For proj_out (2048 -> 3072 over ~50k tokens) this is several times
faster than a plain float32 GEMM, the release's precision for that layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..blocks import linear_fp32 as linear_fp32_reference
from ._common import as_rows, count_launch, device_problem, grad_problem, linear_fp32_call, linear_fp32_problem
from ._triton_utils import built_for_interpreter

__all__ = ["model_call", "linear_fp32", "linear_fp32_reference", "unsupported"]

_BLOCK_M, _BLOCK_N, _BLOCK_K, _GROUP_M = 128, 128, 32, 8


@triton.jit
def _linear_tf32x3_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_x,
    stride_w,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """x: (M, K) float32, row stride `stride_x`. w: (N, K) float32, row stride `stride_w`. b: (N,) float32
    (unused unless HAS_BIAS). out: (M, N) float32 contiguous. Unit column strides. One program per output
    tile, ordered in groups of GROUP_M row tiles so that neighbouring programs share x and w in L2."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    first_m = (pid // (GROUP_M * tiles_n)) * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % group_m
    pid_n = (pid % (GROUP_M * tiles_n)) // group_m

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_x + ks[None, :]
    w_ptrs = w_ptr + cols.to(tl.int64)[None, :] * stride_w + ks[:, None]  # a (BLOCK_K, BLOCK_N) tile of w^T
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = ks < K - k * BLOCK_K
        x = tl.load(x_ptrs, mask=(rows < M)[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_mask[:, None] & (cols < N)[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision="tf32x3")
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0)[None, :]
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(out_ptrs, acc, mask=(rows < M)[:, None] & (cols < N)[None, :])


def model_call(config, device: torch.device, dtype: torch.dtype) -> tuple:
    """The op's arguments as the decoder passes them (zeros, two tokens): for `unsupported` and the warm-up."""
    return linear_fp32_call(config, device)


def unsupported(x, weight, bias) -> str | None:
    """Why `linear_fp32(x, weight, bias)` is outside the kernel's contract, or None."""
    problem = linear_fp32_problem(x, weight, bias)
    if problem:
        return problem
    tensors = [t for t in (x, weight, bias) if t is not None]
    return device_problem(tensors, built_for_interpreter(_linear_tf32x3_kernel)) or grad_problem(tensors)


def linear_fp32(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, launches: dict[str, int] | None = None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` in float32 through three TF32 products per tile, in one launch.

    x: (..., K) float32, last dim contiguous, leading dims flattening to one row stride. weight: (N, K)
    float32, last dim contiguous. bias: (N,) float32 contiguous, or None. Returns a new contiguous (..., N)
    float32 tensor, within a few float32 ulps of the float32 product. Raises ValueError outside this contract.
    """
    problem = unsupported(x, weight, bias)
    if problem:
        raise ValueError(f"linear_fp32: {problem}")
    rows = as_rows(x)
    (m, k), n = rows.shape, weight.shape[0]
    out = torch.empty((*x.shape[:-1], n), dtype=torch.float32, device=x.device)
    if out.numel() == 0:
        return out
    grid = (triton.cdiv(m, _BLOCK_M) * triton.cdiv(n, _BLOCK_N),)
    _linear_tf32x3_kernel[grid](
        rows,
        weight,
        bias if bias is not None else weight,
        out,
        m,
        n,
        k,
        rows.stride(0),
        weight.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_M=_BLOCK_M,
        BLOCK_N=_BLOCK_N,
        BLOCK_K=_BLOCK_K,
        GROUP_M=_GROUP_M,
        num_warps=8,
        num_stages=3,
    )
    count_launch(launches, "tf32x3_linear")
    return out
