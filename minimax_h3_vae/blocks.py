"""The ViT decoder's block and the ops it is built on.

The ops below are the eager path and the reference of record: the Triton kernels in `fused/` compute the
same functions, with the same signatures and the same intermediate roundings. A block receives its ops
as an argument and never asks which path it is on.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from . import sdpa
from .rope import RotaryTable


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype) -> torch.Tensor:
    """RMSNorm over the last dim with an affine weight, computed in float32, returned in `out_dtype`.

    x: (..., C) any float dtype. weight: (C,) float32.
    """
    return F.rms_norm(x.float(), (x.shape[-1],), weight, eps).to(out_dtype)


def scale_add_rms_norm(
    residual: torch.Tensor,
    y: torch.Tensor,
    scale: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`residual += y * scale` in float32 (in place), then `rms_norm(residual)` if a norm weight is given.

    residual: (..., C) float32, updated in place and returned. y: (..., C) any float dtype. scale, weight: (C,)
    float32. Returns (residual, normed or None).
    """
    residual.add_(y * scale)
    return residual, None if weight is None else rms_norm(residual, weight, eps, out_dtype)


def qk_rms_norm_rope(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the fused projection, RMS-normalise q and k per head, rotate their first dims (NeoX).

    qkv: (B, S, 3 * H * D), per-head interleaved: head h owns columns [3hD, 3hD + D) for q, the next D for k,
    the next D for v. cos, sin: (S, R) float32, R <= D even, shared by the whole batch.
    Returns q, k, v as (B, H, S, D) views in qkv's dtype. The norm runs in float32 and is rounded back to the
    compute dtype; the rotation runs in the compute dtype, as the release does.

    The norm and the rotation run on the release's layout, (B, S, H, D) views of qkv, and q, k, v are
    transposed after: on CUDA a row reduction over a small tensor may split its rows by the layout it is given.
    """
    batch, seq, _ = qkv.shape
    q, k, v = qkv.view(batch, seq, num_heads, 3, -1).unbind(3)
    rotary = cos.shape[-1]
    cos, sin = cos.to(qkv.dtype).unsqueeze(-2), sin.to(qkv.dtype).unsqueeze(-2)  # over the heads

    def norm_rope(x):
        x = F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(qkv.dtype)
        x_rot, x_pass = x[..., :rotary], x[..., rotary:]
        first, second = x_rot.chunk(2, dim=-1)
        rotated = torch.cat([-second, first], dim=-1)
        return torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1)

    return norm_rope(q).transpose(1, 2), norm_rope(k).transpose(1, 2), v.transpose(1, 2)


def linear_qk_rms_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention's input projection, then `qk_rms_norm_rope`; the projection rounded to x's dtype first
    (as the release computes it).

    x: (B, S, K). weight: (3 * H * D, K), rows per head [q; k; v] (release layout), x's dtype. bias: (3 * H * D,)
    or None. Returns q, k, v as `qk_rms_norm_rope` does.
    """
    return qk_rms_norm_rope(F.linear(x, weight, bias), cos, sin, num_heads, eps)


def silu_mul(h: torch.Tensor) -> torch.Tensor:
    """The FFN's gate: `silu(gate) * value` with `gate, value = h.chunk(2, -1)` (release order).

    h: (..., 2F) any float dtype -> (..., F) same dtype; silu and the product each round to that dtype.
    """
    gate, value = h.chunk(2, dim=-1)
    return F.silu(gate) * value


def linear_silu_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The FFN's first half, w1 and its gate: `silu_mul(linear(x, weight, bias))`, w1's output rounded to x's
    dtype before the gate (as the release computes it).

    x: (..., K). weight: (2F, K), rows [gate; value] (release layout), x's dtype. bias: (2F,) or None. Returns
    (..., F) in x's dtype.
    """
    return silu_mul(F.linear(x, weight, bias))


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backends: tuple[str, ...] = sdpa.BACKENDS
) -> torch.Tensor:
    """Softmax attention, no mask, scale 1/sqrt(D), through torch's SDPA: the first of `backends` (SDPBackend
    names, a run's `attention_backends`) that can run these inputs, chosen for this call alone (sdpa.py).
    q, k, v: (B, H, S, D), one dtype -> (B, H, S, D) of that dtype."""
    return sdpa.attention(q, k, v, backends)


def linear_fp32(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A float32 Linear (proj_out, which the release runs in float32). x: (B, ..., K), weight: (N, K), bias:
    (N,) or None -> (B, ..., N).

    One GEMM per entry of x's first dim (a tile), written in place: a library GEMM (cuBLAS, MKL) may pick its
    kernel by the row count, and a tile's rows must not depend on how many tiles share the call."""
    out = x.new_empty(*x.shape[:-1], weight.shape[0])
    for tile, rows in zip(x, out):
        tile, rows = tile.reshape(-1, x.shape[-1]), rows.view(-1, weight.shape[0])
        if bias is None:
            torch.mm(tile, weight.T, out=rows)
        else:
            torch.addmm(bias, tile, weight.T, out=rows)
    return out


EAGER_OPS = SimpleNamespace(
    rms_norm=rms_norm,
    scale_add_rms_norm=scale_add_rms_norm,
    qk_rms_norm_rope=qk_rms_norm_rope,
    linear_qk_rms_norm_rope=linear_qk_rms_norm_rope,
    silu_mul=silu_mul,
    linear_silu_mul=linear_silu_mul,
    attention=attention,
    linear_fp32=linear_fp32,
)


# The block's linears, by their names inside it: the part of the release's fp16 recipe that runs in fp16, and
# what offload="blocks" streams from host memory (~134 MB per block in fp16 at the released size).
BLOCK_LINEARS = ("attn.to_qkv", "attn.to_out", "ff.w1", "ff.w2")


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.to_out = nn.Linear(dim, dim)


class GatedFeedForward(nn.Module):
    """`w2(silu_mul(w1(x)))`: w1's output rows are [gate; value] (release layout)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, 2 * hidden)
        self.w2 = nn.Linear(hidden, dim)


class RMSNormWeight(nn.Module):
    """Holds an RMSNorm's affine weight; the norm itself is one of the ops."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class DecoderBlock(nn.Module):
    """Pre-norm block with layer scales. The residual stream is float32; the linears run in their own dtype.

    The block takes its input already normalised (`normed = norm1(residual)`) and returns the next block's
    normalised input along with the new residual, so each residual add and the norm after it are one op.
    """

    def __init__(self, dim: int, num_heads: int, ffn_dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.norm1 = RMSNormWeight(dim)
        self.attn = Attention(dim, num_heads)
        self.scale1 = nn.Parameter(torch.zeros(dim))
        self.norm2 = RMSNormWeight(dim)
        self.ff = GatedFeedForward(dim, ffn_dim)
        self.scale2 = nn.Parameter(torch.zeros(dim))

    def forward(
        self,
        residual: torch.Tensor,
        normed: torch.Tensor,
        rotary: RotaryTable,
        ops: SimpleNamespace,
        next_norm_weight: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """residual: (B, S, C) float32, updated in place. normed: (B, S, C) in the linears' dtype."""
        batch, seq, dim = residual.shape
        compute_dtype = normed.dtype
        qkv = self.attn.to_qkv
        q, k, v = ops.linear_qk_rms_norm_rope(
            normed, qkv.weight, qkv.bias, rotary.cos, rotary.sin, self.attn.num_heads, self.eps
        )
        # q and k may come with their head dims in an order of the op's own (the same for both): the scores
        # q . k, all that attention reads of them, do not change.
        o = ops.attention(q, k, v).transpose(1, 2).reshape(batch, seq, dim)
        # The release scrubs attention outputs as `nan_to_num(0.0)` does: NaN to 0, +-inf to the dtype's
        # largest finite values (an fp16 overflow in a row must not spread). In place on the (B, S, H*D)
        # layout, which the attention backends write contiguously: one vectorised pass.
        o = o.nan_to_num_(nan=0.0)
        o = self.attn.to_out(o)
        residual, normed = ops.scale_add_rms_norm(residual, o, self.scale1, self.norm2.weight, self.eps, compute_dtype)
        y = self.ff.w2(ops.linear_silu_mul(normed, self.ff.w1.weight, self.ff.w1.bias))
        return ops.scale_add_rms_norm(residual, y, self.scale2, next_norm_weight, self.eps, compute_dtype)
