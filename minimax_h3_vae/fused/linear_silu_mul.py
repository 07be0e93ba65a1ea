"""w1 and the FFN's gate in one GEMM: quack's Hopper GEMM with the SwiGLU in its epilogue.

`blocks.linear_silu_mul` writes w1's (M, 2F) output in fp16 and reads it back for the gate; here the gate is
applied to the float32 accumulator inside the GEMM (quack-kernels' `gemm_act(..., activation="swiglu")`, a
CuTe-DSL kernel), so the (M, 2F) tensor never exists. On the H200 at the released size (M = 50316, K = 2048,
2F = 16384) that is 5.05 ms against 5.33 for cuBLAS + the Triton gate (benchmarks/LOG.md#2026-12-01-quack-w1-probe).

Numerics: the result is `silu(gate) * value` of the float32 product and bias, rounded to fp16 once, so it
is within one fp16 rounding of `linear_silu_mul_reference` (below). The release rounds three times (w1's
output, the silu, the product), so this op is more accurate than the eager one and not bit-equal to it.

quack reads w1's rows as released ([gate; value] halves): `concat_layout` makes the kernel see them
interleaved, so nothing is rewritten at load. One compiled kernel serves every row count M (quack keys its
builds on dtypes, layouts and alignment, not on M); the first call in a process builds it (~3 s on an
H200) and importing quack costs 8-17 s, so the decoder does both at load (the import when its kernels are
chosen, `fused.choose_kernels`; the build beside the weight load, `fused.warm_up`).

The exact variant (`linear_silu_mul_exact`, `launch(exact=True)`) is the same GEMM with the release's three
roundings in its epilogue instead of quack's SwiGLU (`_eager_swiglu`; linear_silu_mul_exact.py says why its bits
are the eager op's).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ._common import as_rows, count_launch, grad_problem, zeros
from .quack_common import ALIGN, gemm_config, import_problem, load, tensors_problem

__all__ = ["exact_problem", "launch", "model_call", "linear_silu_mul", "linear_silu_mul_reference", "unsupported"]


def linear_silu_mul_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What the kernel computes: w1 and the gate in float32, rounded to x's dtype once. Shapes as in
    `linear_silu_mul`."""
    h = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    gate, value = h.chunk(2, dim=-1)
    return (F.silu(gate) * value).to(x.dtype)


@functools.cache
def _gemm_act():
    """quack's `gemm_act`, imported once."""
    load()
    from quack.gemm_interface import gemm_act

    return gemm_act


@functools.cache
def _eager_swiglu():
    """The exact variant's epilogue, built once (this imports quack): the accumulator plus bias rounded to fp16,
    `g / (1 + exp(-g))` with the CuTe DSL's accurate `exp` and a correctly rounded division, rounded, times the
    rounded value (rounded at the store). Its bias comes with the halves interleaved, as the GEMM sees B."""
    load()
    import cutlass.cute as cute
    from cutlass import Float16, Float32
    from quack.epilogue.frontend import gemm_epilogue, unpack
    from quack.epilogue.ops import RowVecLoad

    @gemm_epilogue(outputs=("postact",), ops={"bias": RowVecLoad("bias")}, mode="acc_pair")
    def eager_swiglu(acc, bias):
        gate, value = unpack(acc + bias)
        gate = gate.to(Float16).to(Float32)
        activated = (gate / (Float32(1.0) + cute.math.exp(-gate, fastmath=False))).to(Float16).to(Float32)
        return {"postact": activated * value.to(Float16).to(Float32)}

    return eager_swiglu


def model_call(config, device: torch.device, dtype: torch.dtype) -> tuple:
    """The op's arguments as the decoder passes them (zeros, two tokens): for `unsupported` and the warm-up."""
    c, rows = config, 2 * config.ffn_dim  # w1's full weight (134 MB at the released size)
    return (
        zeros(device, 1, 2, c.dim, dtype=dtype),
        zeros(device, rows, c.dim, dtype=dtype),
        zeros(device, rows, dtype=dtype),
    )


def unsupported(x, weight, bias) -> str | None:
    """Why `linear_silu_mul(x, weight, bias)` is outside the kernel's contract, or None (this imports quack)."""
    if not all(isinstance(t, torch.Tensor) for t in (x, weight)) or not (
        bias is None or isinstance(bias, torch.Tensor)
    ):
        return "x and weight must be tensors, bias a tensor or None"
    tensors = [t for t in (x, weight, bias) if t is not None]
    problem = tensors_problem(tensors)
    if problem:
        return problem
    if x.dim() == 0 or weight.dim() != 2 or weight.shape[1] != x.shape[-1] or weight.shape[0] % 2:
        return f"need x (..., K) and weight (2F, K), got {tuple(x.shape)} and {tuple(weight.shape)}"
    if bias is not None and (bias.shape != (weight.shape[0],) or not bias.is_contiguous()):
        return f"bias must be contiguous with shape ({weight.shape[0]},), got {tuple(bias.shape)}"
    if x.shape[-1] % ALIGN or weight.shape[0] // 2 % ALIGN:
        return f"K and F must be multiples of {ALIGN} (16-byte rows), got K={x.shape[-1]}, F={weight.shape[0] // 2}"
    rows = as_rows(x)
    if rows is None or (rows.shape[0] > 1 and rows.stride(0) % ALIGN) or not weight.is_contiguous():
        return "x must flatten to rows of 16-byte aligned stride and weight must be contiguous"
    return grad_problem(tensors) or import_problem()


def linear_silu_mul(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, launches: dict[str, int] | None = None
) -> torch.Tensor:
    """`blocks.linear_silu_mul` as one GEMM, the gate applied to the float32 accumulator.

    x: (..., K) float16/bfloat16 on a Hopper GPU, last dim contiguous, leading dims flattening to one row
    stride. weight: (2F, K) contiguous, rows [gate; value] (release layout). bias: (2F,) or None. All one
    dtype; K and F multiples of 8. Returns a new contiguous (..., F) tensor of x's dtype. Raises ValueError
    outside this contract.
    """
    return launch(x, weight, bias, launches, "linear_silu_mul", exact=False)


def exact_problem(x, bias) -> str | None:
    """What the exact variant needs beyond `unsupported`'s contract (fp16, a bias), or None."""
    if x.dtype != torch.float16:
        return f"the epilogue rounds as the fp16 recipe does: x must be float16, got {x.dtype}"
    if bias is None:
        return "bias must be a tensor: the epilogue adds it to the accumulator"
    return None


def launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    launches: dict[str, int] | None,
    name: str,
    exact: bool,
) -> torch.Tensor:
    """The GEMM of both launchers: checks `unsupported` (and for `exact`, `exact_problem`), launches once with
    quack's SwiGLU or, `exact`, the release's roundings (`_eager_swiglu`), counts it under `name`."""
    problem = unsupported(x, weight, bias) or (exact and exact_problem(x, bias))
    if problem:
        raise ValueError(f"linear_silu_mul: {problem}")
    rows = as_rows(x)
    half = weight.shape[0] // 2
    out = torch.empty((rows.shape[0], half), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out.view(*x.shape[:-1], half)
    if exact:
        _eager_swiglu()(
            rows,
            weight.T,
            out={"postact": out},
            store_d=False,
            config=gemm_config(),
            tuned=False,
            bias=torch.stack([bias[:half], bias[half:]], dim=1).flatten(),
            concat_layout=("B",),
        )
    else:
        _gemm_act()(
            rows,
            weight.T,
            bias=bias,
            activation="swiglu",
            postact_out=out,
            store_preact=False,
            tuned=False,
            config=gemm_config(),
            concat_layout=("B", "bias") if bias is not None else ("B",),
        )
    count_launch(launches, name)
    return out.view(*x.shape[:-1], half)
