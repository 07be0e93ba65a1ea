"""Per-head RMSNorm of q and k and NeoX partial RoPE, read straight from the fused qkv projection."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..blocks import qk_rms_norm_rope as qk_rms_norm_rope_reference
from ._common import MAX_GRID_YZ, count_launch, device_problem, dtype_problem, grad_problem, is_number, zeros
from ._triton_utils import (
    NO_FMA,
    built_for_interpreter,
    inv_rms,
    to_dtype,
    torch_add_squares,
    torch_inv_rms,
    torch_order_problem,
    torch_row_order,
    torch_tree_sum,
)

__all__ = ["launch", "model_call", "qk_rms_norm_rope", "qk_rms_norm_rope_reference", "unsupported"]

MAX_HEAD_DIM = 256
# Elements of one (tokens x head_dim) tile per program: the fast kernel's (its bits depend on the tile's layout),
# and the exact one's, whose bits do not and which was fastest at 4096 (benchmarks/LOG.md, 2026-12-04-exact-costs).
_TILE = 2048
_TILE_TORCH_ORDER = 4096


@triton.jit
def _norm_rope(
    row_ptrs,
    dims,
    partner,
    mask,
    cos,
    sin,
    is_rotary,
    eps,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    dtype: tl.constexpr,
    THREADS: tl.constexpr,
    WARPS: tl.constexpr,
    LANE_STEPS: tl.constexpr,
    WARP_STEPS: tl.constexpr,
    TORCH_ORDER: tl.constexpr,
):
    """Normalise one (BLOCK_S, HEAD_DIM) tile of q or k and rotate its first dims; returns it in `dtype`.
    row_ptrs: (BLOCK_S, 1) pointers to each token's head.

    Mirrors the eager op's roundings: the RMS (in torch's order when TORCH_ORDER, `torch_row_order`; else in
    Triton's), the norm rounded to `dtype`, then each product and their sum rounded to `dtype` as torch's
    half-precision ops do. cos, sin: already rounded to `dtype`, float32, sin negated on the first rotary half.
    """
    x = tl.load(row_ptrs + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    if TORCH_ORDER:
        # A head (at most MAX_HEAD_DIM values, under torch's 128 threads x 4) is at most one vector per torch
        # thread, so its squares are summed from the tile as loaded: thread t's vector is columns 4t..4t+3.
        vectors = tl.reshape(x, (BLOCK_S, THREADS, 4))
        acc = torch_add_squares(vectors, tl.zeros((BLOCK_S, THREADS), dtype=tl.float32), BLOCK_S, THREADS)
        scale = torch_inv_rms(torch_tree_sum(acc, BLOCK_S, THREADS, WARPS, LANE_STEPS, WARP_STEPS), HEAD_DIM, eps)
        scale = scale[:, None]
    else:
        scale = inv_rms(x, HEAD_DIM, eps)[:, None]
    # Each column's NeoX partner, loaded again rather than permuted in registers; it is in cache.
    x_partner = tl.load(row_ptrs + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    normed = to_dtype(x * scale, dtype).to(tl.float32)
    partner = to_dtype(x_partner * scale, dtype).to(tl.float32)
    rotated = to_dtype(normed * cos, dtype).to(tl.float32) + to_dtype(partner * sin, dtype).to(tl.float32)
    return to_dtype(tl.where(is_rotary[None, :], rotated, normed), dtype)


@triton.jit
def _qk_rms_norm_rope_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    q_ptr,
    k_ptr,
    seq_len,
    stride_qkv_b,
    stride_qkv_s,
    stride_cos_s,
    stride_cos_r,
    stride_sin_s,
    stride_sin_r,
    eps,
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    THREADS: tl.constexpr,
    WARPS: tl.constexpr,
    LANE_STEPS: tl.constexpr,
    WARP_STEPS: tl.constexpr,
    TORCH_ORDER: tl.constexpr,
):
    """qkv: (B, S, 3 * H * HEAD_DIM) any float dtype, per-head interleaved [q | k | v], unit column stride.
    cos, sin: (S, ROTARY_DIM) float32, any strides, shared by every batch entry. q, k: (B, S, H, HEAD_DIM)
    contiguous, qkv's dtype. Grid: (S blocks of BLOCK_S tokens, H, B)."""
    head, batch = tl.program_id(1), tl.program_id(2)
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    dims = tl.arange(0, HEAD_DIM)
    half = ROTARY_DIM // 2
    is_rotary = dims < ROTARY_DIM
    # rotate_half pairs d with d + R/2 (negated) and d - R/2; dims past R pair with themselves, unused.
    partner = tl.where(dims < half, dims + half, tl.where(is_rotary, dims - half, dims))
    mask = (tokens < seq_len)[:, None]
    tokens = tokens.to(tl.int64)[:, None]
    dtype = q_ptr.dtype.element_ty

    table_mask = mask & is_rotary[None, :]
    cos = tl.load(cos_ptr + tokens * stride_cos_s + dims[None, :] * stride_cos_r, mask=table_mask, other=0.0)
    sin = tl.load(sin_ptr + tokens * stride_sin_s + dims[None, :] * stride_sin_r, mask=table_mask, other=0.0)
    cos = to_dtype(cos, dtype).to(tl.float32)
    # Negation is exact, so moving rotate_half's sign onto sin rounds exactly like the eager op.
    sin = to_dtype(tl.where(dims < half, -sin, sin), dtype).to(tl.float32)

    q_row = qkv_ptr + batch.to(tl.int64) * stride_qkv_b + tokens * stride_qkv_s + head * 3 * HEAD_DIM
    k_row = q_row + HEAD_DIM
    out = ((batch.to(tl.int64) * seq_len + tokens) * tl.num_programs(1) + head) * HEAD_DIM + dims[None, :]
    q = _norm_rope(
        q_row, dims, partner, mask, cos, sin, is_rotary, eps, HEAD_DIM, BLOCK_S, dtype,
        THREADS, WARPS, LANE_STEPS, WARP_STEPS, TORCH_ORDER,
    )  # fmt: skip
    tl.store(q_ptr + out, q, mask=mask)
    k = _norm_rope(
        k_row, dims, partner, mask, cos, sin, is_rotary, eps, HEAD_DIM, BLOCK_S, dtype,
        THREADS, WARPS, LANE_STEPS, WARP_STEPS, TORCH_ORDER,
    )  # fmt: skip
    tl.store(k_ptr + out, k, mask=mask)


def _head_dim(qkv: torch.Tensor, num_heads: int) -> int:
    return qkv.shape[-1] // (3 * num_heads)


def model_call(config, device: torch.device, dtype: torch.dtype) -> tuple:
    """The op's arguments as the decoder passes them (zeros, two tokens): for `unsupported` and the warm-up."""
    c = config
    table = zeros(device, 2, c.rope_dim)
    return (zeros(device, 1, 2, 3 * c.dim, dtype=dtype), table, table.clone(), c.num_heads, c.norm_eps)


def unsupported(qkv, cos, sin, num_heads, eps) -> str | None:
    """Why `qk_rms_norm_rope(...)` with these arguments is outside the kernel's contract, or None."""
    if not all(isinstance(t, torch.Tensor) for t in (qkv, cos, sin)):
        return "qkv, cos and sin must be tensors"
    if qkv.dim() != 3 or qkv.stride(-1) != 1:
        return f"qkv must be (B, S, 3 * H * D) with a contiguous last dim, got shape {tuple(qkv.shape)}"
    problem = (
        dtype_problem("qkv", qkv.dtype)
        or dtype_problem("cos", cos.dtype, (torch.float32,))
        or dtype_problem("sin", sin.dtype, (torch.float32,))
    )
    if problem:
        return problem
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or not 0 < num_heads <= MAX_GRID_YZ:
        return f"num_heads must be an int in [1, {MAX_GRID_YZ}], got {num_heads!r}"
    batch, seq, width = qkv.shape
    head_dim = _head_dim(qkv, num_heads)
    if width != 3 * num_heads * head_dim:
        return f"qkv's last dim {width} is not 3 * num_heads * head_dim with num_heads={num_heads}"
    if head_dim & (head_dim - 1) or not 0 < head_dim <= MAX_HEAD_DIM:
        return f"head_dim must be a power of two <= {MAX_HEAD_DIM}, got {head_dim}"
    if batch > MAX_GRID_YZ:
        return f"batch must be <= {MAX_GRID_YZ}, got {batch}"
    if cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != seq:
        return f"cos and sin must both be (S, R) with S={seq}, got {tuple(cos.shape)} and {tuple(sin.shape)}"
    rotary = cos.shape[-1]
    if rotary % 2 or not 0 < rotary <= head_dim:
        return f"rotary dims must be even, positive and <= head_dim={head_dim}, got {rotary}"
    if not is_number(eps):
        return f"eps must be a real number, got {type(eps).__name__}"
    tensors = (qkv, cos, sin)
    return device_problem(tensors, built_for_interpreter(_qk_rms_norm_rope_kernel)) or grad_problem(tensors)


def qk_rms_norm_rope(
    qkv: Tensor, cos: Tensor, sin: Tensor, num_heads: int, eps: float, *, launches: dict[str, int] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """`blocks.qk_rms_norm_rope` in one launch; the RMS in Triton's order (within float32 rounding of the eager
    op; `qk_rms_norm_rope_exact` keeps its bits).

    qkv: (B, S, 3 * H * D) float32/float16/bfloat16, per-head interleaved [q | k | v], last dim contiguous,
    any batch and sequence strides (e.g. a slice of a wider buffer); D a power of two <= 256.
    cos, sin: (S, R) float32, R even and <= D, any strides, one table for the whole batch.
    Returns q, k: (B, H, S, D) views of new (B, S, H, D)-contiguous tensors of qkv's dtype, normalised and
    rotated (the layout in which attention writes its output (B, S, H * D)-contiguous, ready for to_out,
    with no transpose copy); v: a strided (B, H, S, D) view of qkv, as the reference returns. Raises
    ValueError outside this contract.
    """
    return launch(qkv, cos, sin, num_heads, eps, launches, "qk_rms_norm_rope", torch_order=False)


def launch(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    num_heads: int,
    eps: float,
    launches: dict[str, int] | None,
    name: str,
    torch_order: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel of both launchers: checks `unsupported` (and, for torch's order, a head dim of at least 4),
    launches once, counts it under `name`."""
    problem = unsupported(qkv, cos, sin, num_heads, eps) or (
        torch_order and torch_order_problem(_head_dim(qkv, num_heads))
    )
    if problem:
        raise ValueError(f"qk_rms_norm_rope: {problem}")
    batch, seq, _ = qkv.shape
    head_dim = _head_dim(qkv, num_heads)
    v = qkv.view(batch, seq, num_heads, 3, head_dim).transpose(1, 2).unbind(3)[2]
    q = torch.empty((batch, seq, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device).transpose(1, 2)
    k = torch.empty_like(q)
    if q.numel() == 0:
        return q, k, v
    block_s = max(1, (_TILE_TORCH_ORDER if torch_order else _TILE) // head_dim)
    order = torch_row_order(head_dim if torch_order else 4)  # VECTORS is 1: a head is one row of vectors
    _qk_rms_norm_rope_kernel[(triton.cdiv(seq, block_s), num_heads, batch)](
        qkv,
        cos,
        sin,
        q,
        k,
        seq,
        qkv.stride(0),
        qkv.stride(1),
        cos.stride(0),
        cos.stride(1),
        sin.stride(0),
        sin.stride(1),
        float(eps),
        HEAD_DIM=head_dim,
        ROTARY_DIM=cos.shape[-1],
        BLOCK_S=block_s,
        num_warps=4,
        THREADS=order["THREADS"],
        WARPS=order["WARPS"],
        LANE_STEPS=order["LANE_STEPS"],
        WARP_STEPS=order["WARP_STEPS"],
        TORCH_ORDER=torch_order,
        **NO_FMA,
    )
    count_launch(launches, name)
    return q, k, v
