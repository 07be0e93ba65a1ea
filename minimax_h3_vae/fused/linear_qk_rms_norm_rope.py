"""The attention's input projection with the per-head QK RMSNorm and the NeoX partial RoPE in its epilogue.

`blocks.linear_qk_rms_norm_rope` writes the (M, 3 * H * D) projection in fp16 and reads q and k back to
normalise and rotate them. Here quack's Hopper GEMM does both on the float32 accumulator before its one store
(a `@gemm_epilogue` of quack-kernels, a CuTe-DSL kernel), so the projection is written once, already
normalised and rotated, and never read back.

How it fits a GEMM epilogue:
- One 192-column tile of the output is one head's [q | k | v] (quack's Hopper tile is 128 x 192, the release
  interleaves the projection per head and its head_dim is 64), so each 64-column group is a q, k or v. A
  prepass over the accumulator sums the squares per row and group (quack's HeadRstd); q and k are scaled by
  their group's 1 / rms, v by 1 (a 0/1 column mask).
- An epilogue sees a column next to its neighbour, not the column R/2 away that NeoX rotates it with. So
  the GEMM runs on w_qkv with each head's q and k rows reordered (`pair_order`: NeoX partners d and d + R/2
  side by side; `kernel_rows` for the whole projection) and rotates adjacent pairs; v's rows are not moved.
  A decoder on this kernel stores w_qkv in that order from its load (`ordered=True`: nothing is gathered per
  call); given the release's order, the launcher gathers the rows itself. Attention reads q and k
  only through the scores q . k, which one permutation of both leaves unchanged, so the output's q and k
  stay in that order (documented in the launcher's contract) and the attention output is the release's.
- The rotation table holds, per token row, (cos, sin) for each adjacent pair of a head's 192 columns: the
  release's cos and sin rounded to the compute dtype (as the release rounds them) for the R/2 rotated pairs
  of q and of k, and (1, 0) for every other pair. quack indexes it by output row, so it has one row per row
  of the batch; it is built once per rotary table and batch size and kept (about 19 MB for 28 tiles).

Numerics: the bias is added to the float32 accumulator, the norm and the rotation run in float32 (rsqrt
approximate to ~2^-22), and q, k, v are rounded to the compute dtype once. The release rounds the
projection, the normalised values and each product of the rotation; so this op is within about one rounding
of `linear_qk_rms_norm_rope_reference` (float32 throughout) and more accurate than the eager op.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ._common import as_rows, count_launch, grad_problem, is_number, zeros
from .quack_common import ALIGN, TILE_N, gemm_config, import_problem, tensors_problem

__all__ = [
    "kernel_rows",
    "linear_qk_rms_norm_rope",
    "linear_qk_rms_norm_rope_reference",
    "model_call",
    "new_state",
    "pair_order",
    "epilogue_layout",
    "rotation_table",
    "stored_rows",
    "unsupported",
]


def pair_order(head_dim: int, rotary: int) -> torch.Tensor:
    """(head_dim,) int64: the order in which this op writes a head's q (and k) dims.

    NeoX rotates dim d with d + R/2 for d < R/2; here they sit side by side, then the R..D-1 dims that are
    not rotated: [0, R/2, 1, R/2 + 1, ..., R/2 - 1, R - 1, R, R + 1, ..., D - 1]. q[..., pair_order] is what
    the op returns for the release's q.
    """
    half = rotary // 2
    first = torch.arange(half)
    return torch.cat([torch.stack([first, first + half], dim=1).flatten(), torch.arange(rotary, head_dim)])


def linear_qk_rms_norm_rope_reference(x, weight, bias, cos, sin, num_heads: int, eps: float):
    """What the kernel computes, in the release's dim order: the projection, the norm and the rotation in
    float32 (float64 for float64 x), cos and sin rounded to x's dtype first (as the release rounds them), q,
    k, v rounded to x's dtype once. Arguments as in `linear_qk_rms_norm_rope`; returns q, k, v (B, H, S, D)."""
    wide = torch.promote_types(x.dtype, torch.float32)
    qkv = F.linear(x.to(wide), weight.to(wide), bias.to(wide))
    batch, seq, _ = qkv.shape
    q, k, v = qkv.view(batch, seq, num_heads, 3, -1).transpose(1, 2).unbind(3)
    rotary = cos.shape[-1]
    cos, sin = cos.to(x.dtype).to(wide), sin.to(x.dtype).to(wide)

    def norm_rope(t):
        t = F.rms_norm(t, (t.shape[-1],), None, eps)
        first, second = t[..., : rotary // 2], t[..., rotary // 2 : rotary]
        rotated = torch.cat([-second, first], dim=-1)
        return torch.cat([t[..., :rotary] * cos + rotated * sin, t[..., rotary:]], dim=-1)

    return norm_rope(q).to(x.dtype), norm_rope(k).to(x.dtype), v.to(x.dtype)


@functools.cache
def _epilogue(eps: float):
    """The epilogue for one eps, built once (this imports quack)."""
    from quack.epilogue.frontend import gemm_epilogue, pack, unpack
    from quack.epilogue.head_rmsnorm import HeadRstd
    from quack.epilogue.ops import RowVecLoad
    from quack.epilogue.rotary import rotary_cos_sin_load

    rstd = HeadRstd("rstd", eps=eps)

    def squares(acc, bias):
        x = acc + bias
        return {"rstd": x * x}

    @gemm_epilogue(
        ops={
            "bias": RowVecLoad("bias"),
            "rstd": rstd,
            "normed": RowVecLoad("normed"),
            "kept": RowVecLoad("kept"),
            "table": rotary_cos_sin_load("table"),
        },
        prepass=squares,
        prepass_outs=("rstd",),
        mode="acc_pair",
    )
    def qkv_norm_rope(acc, bias, rstd, normed, kept, table):
        # normed, kept: 1, 0 on q and k columns and 0, 1 on v's, so v passes with its bias added only.
        x1, x2 = unpack((acc + bias) * (rstd * normed + kept))
        cos, sin = unpack(table)
        return {"D": pack(x1 * cos - x2 * sin, x1 * sin + x2 * cos)}

    return qkv_norm_rope


def kernel_rows(num_heads: int, head_dim: int, rotary: int) -> torch.Tensor:
    """(3 * H * D,) int64 on the CPU: the rows of w_qkv (and its bias) in the order the GEMM takes them, release rows
    indexed: per head its q rows in `pair_order`, its k rows in `pair_order`, its v rows as released."""
    with torch.device("cpu"):  # also when called under another default device (a model built on meta)
        order = pair_order(head_dim, rotary)
        per_head = torch.cat([order, head_dim + order, 2 * head_dim + torch.arange(head_dim)])
        return (torch.arange(num_heads)[:, None] * 3 * head_dim + per_head).flatten()


@functools.cache
def epilogue_layout(num_heads: int, head_dim: int, rotary: int, device: torch.device):
    """What the epilogue reads besides the accumulator, on `device`: `kernel_rows` (3 * H * D,) int64, and the
    float32 (3 * H * D,) column masks `normed` (1 on q and k columns, 0 on v) and `kept` (1 - normed), in the
    GEMM's column order: per head [q | k | v]. Made once per shape and device."""
    normed = torch.tensor([1.0, 1.0, 0.0]).repeat_interleave(head_dim).repeat(num_heads)
    return kernel_rows(num_heads, head_dim, rotary).to(device), normed.to(device), (1.0 - normed).to(device)


# Rotation tables kept per model (its ops hold one `tables` dict), at most this many: one per tile shape in use.
KEPT_TABLES = 4


def _version(t: torch.Tensor) -> int | None:
    """t's in-place write counter; None for an inference tensor (it has none, and can only be written inside
    inference mode, where the decoder never writes its rotary tables)."""
    return None if t.is_inference() else t._version


def rotation_table(
    cos: torch.Tensor, sin: torch.Tensor, batch: int, head_dim: int, dtype: torch.dtype, tables: dict | None
) -> torch.Tensor:
    """The epilogue's rotation table: (batch * S, 3 * head_dim) in `dtype`, per row and adjacent column pair
    (2j, 2j + 1) of a head's [q | k | v], (cos, sin) of the rotation, (1, 0) where nothing rotates. Checks the
    NeoX halves once per table (one synchronisation).

    tables: the model's cache, (id(cos), id(sin), batch, dtype) -> (cos, sin, their versions, the table). It
    holds cos and sin themselves (the model's rotary tables, which live as long as the model), so an id is
    never reused while its entry stands, and an entry is used only while both are unchanged. None: no cache."""
    key = (id(cos), id(sin), batch, dtype)
    versions = (_version(cos), _version(sin))
    hit = tables.get(key) if tables is not None else None
    if hit and hit[0] is cos and hit[1] is sin and hit[2] == versions:
        return hit[3]
    seq, rotary = cos.shape
    half = rotary // 2
    if not (torch.equal(cos[:, :half], cos[:, half:]) and torch.equal(sin[:, :half], sin[:, half:])):
        raise ValueError("linear_qk_rms_norm_rope: cos and sin must repeat their first half (NeoX, as rope builds)")
    pairs = torch.zeros(seq, 3, head_dim // 2, 2, dtype=dtype, device=cos.device)
    pairs[..., 0] = 1
    pairs[:, :2, :half, 0] = cos[:, None, :half].to(dtype)
    pairs[:, :2, :half, 1] = sin[:, None, :half].to(dtype)
    table = pairs.view(seq, 3 * head_dim).repeat(batch, 1)
    if tables is not None:
        if len(tables) >= KEPT_TABLES:
            tables.pop(next(iter(tables)))
        tables[key] = (cos, sin, versions, table)
    return table


def new_state() -> dict:
    """What one model's launcher keeps: its rotation tables (`rotation_table`'s `tables`)."""
    return {"tables": {}}


def stored_rows(config) -> torch.Tensor:
    """The row order in which a model on this kernel stores w_qkv and its bias, from its load (`kernel_rows`):
    its GEMM then takes the weight as stored (`ordered=True`)."""
    return kernel_rows(config.num_heads, config.head_dim, config.rope_dim)


def model_call(config, device: torch.device, dtype: torch.dtype) -> tuple:
    """The op's arguments as the decoder passes them (zeros, two tokens): for `unsupported` and the warm-up."""
    c, rows = config, 3 * config.dim
    x, weight, bias = (zeros(device, *shape, dtype=dtype) for shape in ((1, 2, c.dim), (rows, c.dim), (rows,)))
    # A rotary table as rope builds them (NeoX halves equal), which the launcher checks.
    table = zeros(device, 2, c.rope_dim)
    return (x, weight, bias, table, table.clone(), c.num_heads, c.norm_eps)


def unsupported(x, weight, bias, cos, sin, num_heads, eps) -> str | None:
    """Why `linear_qk_rms_norm_rope(...)` with these arguments is outside the kernel's contract, or None (this
    imports quack)."""
    if not all(isinstance(t, torch.Tensor) for t in (x, weight, bias, cos, sin)):
        return "x, weight, bias, cos and sin must be tensors"
    problem = tensors_problem([x, weight, bias])
    if problem:
        return problem
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 1:
        return f"num_heads must be a positive int, got {num_heads!r}"
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[1] != x.shape[-1] or weight.shape[0] % (3 * num_heads):
        return f"need x (B, S, K) and weight (3 * H * D, K), got {tuple(x.shape)} and {tuple(weight.shape)}"
    head_dim = weight.shape[0] // (3 * num_heads)
    if 3 * head_dim != TILE_N:
        return f"head_dim must be {TILE_N // 3} (one head's q, k and v per tile of quack's GEMM), got {head_dim}"
    if bias.shape != (weight.shape[0],) or not bias.is_contiguous() or not weight.is_contiguous():
        return f"weight and bias must be contiguous with bias ({weight.shape[0]},), got {tuple(bias.shape)}"
    batch, seq, width = x.shape
    if (cos.dtype, sin.dtype) != (torch.float32, torch.float32) or cos.device != x.device or sin.device != x.device:
        return "cos and sin must be float32 on x's device"
    rotary = cos.shape[-1] if cos.dim() == 2 else 0
    if cos.shape != (seq, rotary) or sin.shape != cos.shape or rotary % 2 or not 0 < rotary <= head_dim:
        return f"cos and sin must both be (S, R) with S={seq}, R even and <= {head_dim}, got {tuple(cos.shape)}"
    if not is_number(eps) or not eps > 0:
        return f"eps must be a positive number, got {eps!r}"
    if width % ALIGN:
        return f"K must be a multiple of {ALIGN} (16-byte rows), got {width}"
    rows = as_rows(x)
    if rows is None or (rows.shape[0] > 1 and rows.stride(0) % ALIGN):
        return "x must flatten to rows of 16-byte aligned stride"
    return grad_problem([x, weight, bias]) or import_problem()


def linear_qk_rms_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    eps: float,
    *,
    launches: dict[str, int] | None = None,
    tables: dict | None = None,
    ordered: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`blocks.linear_qk_rms_norm_rope` as one GEMM, the norm and rotation applied to the float32 accumulator.

    x: (B, S, K) float16/bfloat16 on a Hopper GPU, last dim contiguous, flattening to one row stride.
    weight: (3 * H * D, K) contiguous, rows per head [q; k; v] (release layout). bias: (3 * H * D,). One dtype;
    K a multiple of 8; D = 64. cos, sin: (S, R) float32, R even and <= D, the two
    halves of each row equal (NeoX: `rope.rotary_table`). Returns q, k, v: (B, H, S, D) views of one new
    (B, S, H, 3, D)-contiguous tensor of x's dtype. v is in the release's dim order; q and k have their head
    dims in `pair_order(D, R)` (attention's q . k is the release's). Raises ValueError outside this contract.
    tables: the model's rotation-table cache (`rotation_table`), bound into its ops with `launches`. ordered: weight
    and bias are stored with their rows in `kernel_rows` order (a decoder on this kernel, from its load), not
    the release's, and go to the GEMM as they are.
    """
    problem = unsupported(x, weight, bias, cos, sin, num_heads, eps)
    if problem:
        raise ValueError(f"linear_qk_rms_norm_rope: {problem}")
    batch, seq, _ = x.shape
    head_dim = weight.shape[0] // (3 * num_heads)
    out = torch.empty((batch, seq, num_heads, 3, head_dim), dtype=x.dtype, device=x.device)
    if out.numel():
        rows, normed, kept = epilogue_layout(num_heads, head_dim, cos.shape[-1], x.device)
        if not ordered:
            weight, bias = weight.index_select(0, rows), bias.index_select(0, rows)
        _epilogue(float(eps))(
            as_rows(x),
            weight.T,
            out={"D": out.view(batch * seq, -1)},
            config=gemm_config(),
            tuned=False,
            bias=bias,
            rstd=head_dim,
            normed=normed,
            kept=kept,
            table=rotation_table(cos, sin, batch, head_dim, x.dtype, tables),
        )
        count_launch(launches, "linear_qk_rms_norm_rope")
    q, k, v = out.transpose(1, 2).unbind(3)
    return q, k, v
