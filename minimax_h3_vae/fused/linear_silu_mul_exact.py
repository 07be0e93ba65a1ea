"""w1 and the FFN's gate in one GEMM with the eager op's bits: the `linear_silu_mul` GEMM with the release's three
roundings in its epilogue instead of quack's SwiGLU.

The eager op (`blocks.linear_silu_mul`, the release's under fp16 autocast) writes w1's output rounded to fp16,
then computes `silu(gate)` in float32 and rounds it, then rounds the product with the value. Here each of those
steps runs on the float32 accumulator inside the GEMM (an `acc_pair` epilogue of quack-kernels' `@gemm_epilogue`,
which sees each gate column beside its value column): accumulator plus bias rounded to x's dtype; `g / (1 +
exp(-g))` with the CuTe DSL's accurate `exp` (not its fast approximation) and a correctly rounded division,
rounded; the product, rounded once at the store. So w1's (M, 2F) output is never written or read back.

The epilogue's arithmetic is the eager op's on every fp16 gate value (all 65,536 checked, tests/test_quack_gemm.py).
Its GEMM sums each output as cuBLAS's does where both run the same Hopper MMA order over K, which they do at the
released block shapes (1 to 28 tiles per call) and the tests' model: the tests compare this op with the eager
one bit for bit, and the release-parity tests the whole decode. Another cuBLAS that chose otherwise (a split over
K, say) would give other bits, which those tests would show.

quack reads w1's rows as released ([gate; value] halves) through `concat_layout`, as the fast kernel does; the
bias goes to the epilogue with its halves interleaved the same way (a (2F,) copy per call).
"""

from __future__ import annotations

import torch

from ..blocks import linear_silu_mul as linear_silu_mul_reference
from . import linear_silu_mul as fast

__all__ = ["model_call", "linear_silu_mul", "linear_silu_mul_reference", "unsupported"]

model_call = fast.model_call


def unsupported(x, weight, bias) -> str | None:
    """Why `linear_silu_mul(x, weight, bias)` is outside the kernel's contract, or None (this imports quack):
    quack's gated GEMM's contract (`linear_silu_mul.unsupported`), fp16 only, with a bias (the epilogue adds it
    before the first rounding, as cuBLAS does)."""
    return fast.unsupported(x, weight, bias) or fast.exact_problem(x, bias)


def linear_silu_mul(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *, launches: dict[str, int] | None = None
) -> torch.Tensor:
    """`blocks.linear_silu_mul` as one GEMM, with its bits.

    x: (..., K) float16 on a Hopper GPU, last dim contiguous, leading dims flattening to one row stride.
    weight: (2F, K) contiguous, rows [gate; value] (release layout). bias: (2F,). All float16; K and F
    multiples of 8. Returns a new contiguous (..., F) float16 tensor. Raises ValueError outside this contract.
    """
    return fast.launch(x, weight, bias, launches, "linear_silu_mul_exact", exact=True)
