"""gemm="quack"'s proj_out (fused/fp16x3_linear.py): float32 rows split into two fp16 parts by a Triton kernel,
multiplied by one quack GEMM whose epilogue undoes the scales.

The split kernel runs on the CPU through Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py without a
GPU) and on CUDA; the GEMM needs a Hopper GPU with the hopper extra and skips elsewhere.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from minimax_h3_vae.fused import interpreting
from minimax_h3_vae.fused.fp16x3_linear import TOP, linear_fp32, split_rows, split_rows_reference, unsupported

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
QUACK = importlib.util.find_spec("quack") is not None and importlib.util.find_spec("cutlass") is not None
needs_quack = pytest.mark.skipif(not (HOPPER and QUACK), reason="needs a Hopper GPU with the hopper extra")
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not interpreting(), reason="CPU runs need TRITON_INTERPRET=1")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


def rows_of_every_kind(device, width=100) -> torch.Tensor:
    """Rows from 1e-30 to 1e30 in magnitude, then a zero row, a subnormal row, and rows holding NaN, inf and
    -inf among finite values; inside a wider buffer (a row stride that is not the width)."""
    g = torch.Generator().manual_seed(0)
    buffer = torch.randn(12, width + 7, generator=g)
    buffer[:7] *= torch.logspace(-30, 30, 7)[:, None]
    buffer[7] = 0
    buffer[8] = 1e-41 * torch.sign(buffer[8])
    buffer[9, 3], buffer[10, 0], buffer[11, 5] = float("nan"), float("inf"), float("-inf")
    return buffer.to(device)[:, 2 : 2 + width]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lo_segment", [1, 2])
def test_split_is_its_reference_bit_for_bit(device, lo_segment):
    t = rows_of_every_kind(device)
    parts, inv_scale = split_rows(t, lo_segment)
    expected_parts, expected_inv = split_rows_reference(t, lo_segment)
    assert parts.dtype == torch.float16 and parts.shape == (12, 300) and parts.is_contiguous()
    assert torch.equal(parts.view(torch.int16), expected_parts.view(torch.int16))
    assert torch.equal(inv_scale, expected_inv)


@pytest.mark.parametrize("device", DEVICES)
def test_split_holds_each_finite_row_to_22_bits(device):
    """Checked against the row itself, not the reference: hi + lo, scaled back, is each value to 2^-22 of its
    row's largest; the largest lands in [2^TOP, 2^(TOP + 1)) (no fp16 overflow); hi repeats in [hi | hi | lo]."""
    t = rows_of_every_kind(device)[:8].double()  # the finite rows but the subnormal one (its scale is clamped)
    parts, inv_scale = split_rows(t.float(), 2)
    parts, width = parts.double(), t.shape[1]
    hi, hi_again, lo = parts[:, :width], parts[:, width : 2 * width], parts[:, 2 * width :]
    assert torch.equal(hi, hi_again)
    largest = t.abs().amax(dim=1)
    back = (hi + lo) * inv_scale.double()[:, None]
    assert ((back - t).abs() <= 2**-22 * largest[:, None]).all()
    scaled = hi.abs().amax(dim=1)[:7]  # the zero row has no largest
    assert ((scaled >= 2**TOP) & (scaled <= 2 ** (TOP + 1))).all()


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_values_do_not_scale_their_row(device):
    t = rows_of_every_kind(device)
    clean = t.clone()
    clean[9, 3] = clean[10, 0] = clean[11, 5] = 0
    assert torch.equal(split_rows(t, 2)[1], split_rows(clean, 2)[1])


def test_contract_is_checked_before_quack_is_touched():
    x, w = torch.zeros(2, 16), torch.zeros(32, 16)
    assert "must be float32" in unsupported(x.half(), w.half(), None)
    assert "CUDA device" in unsupported(x, w, None)
    with pytest.raises(ValueError, match="linear_fp32: the tensors must be on one CUDA device"):
        linear_fp32(x, w, None)


def layer_norm_like(rows, width, seed=0) -> torch.Tensor:
    """proj_out's input: a LayerNorm's output (norm weights 1 +- 0.1) over rows of uneven channel scales."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(rows, width, device="cuda", generator=g) * (1 + torch.rand(width, device="cuda", generator=g))
    weight = 1 + 0.1 * torch.randn(width, device="cuda", generator=g)
    return F.layer_norm(h, (width,), weight, 0.02 * torch.randn(width, device="cuda", generator=g))


@needs_quack
@pytest.mark.parametrize("rows", [2 * 1797 + 5, 3])
def test_kernel_at_proj_out_width_is_far_closer_than_fp16(rows):
    """2048 -> 3072 against the float64 product. Bound: a float32 accumulation of depth 3K (each step rounding
    toward zero at worst, 2^-23) plus the split's 2^-21, of the magnitudes summed. Teeth: on average 8x closer
    than the float64 product of the operands rounded to fp16 once (what a plain fp16 GEMM could at best be)."""
    x = layer_norm_like(rows, 2048)
    weight = 0.02 * torch.randn(3072, 2048, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    bias = 0.02 * torch.randn(3072, device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    launches = {}  # counted by the launcher, after its launch
    out = linear_fp32(x, weight, bias, launches=launches)
    assert launches == {"fp16x3_linear": 1}
    assert out.shape == (rows, 3072) and out.dtype == torch.float32 and out.is_contiguous()
    exact = F.linear(x.double(), weight.double(), bias.double())
    bound = (3 * 2048 * 2**-23 + 2**-21) * F.linear(x.double().abs(), weight.double().abs()) + 2**-24 * exact.abs()
    error = (out.double() - exact).abs()
    assert (error <= bound).all()
    once = F.linear(x.half().double(), weight.half().double(), bias.double())
    assert error.mean() <= (once - exact).abs().mean() / 8


@needs_quack
def test_rows_are_independent_of_each_other():
    """A power-of-two scale per row: a row's bits are the same alone or in a batch, and a NaN in one row leaves
    the others' bits alone (the whole NaN row is NaN). Strided rows give the contiguous rows' bits; no bias is a
    zero bias."""
    x = layer_norm_like(1797 + 40, 2048)
    weight = 0.02 * torch.randn(3072, 2048, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    bias = 0.02 * torch.randn(3072, device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    whole = linear_fp32(x, weight, bias)
    assert torch.equal(linear_fp32(x[:40], weight, bias), whole[:40])
    poisoned = x.clone()
    poisoned[7, 100] = float("nan")
    out = linear_fp32(poisoned, weight, bias)
    assert out[7].isnan().all() and torch.equal(out[:7], whole[:7]) and torch.equal(out[8:], whole[8:])
    wide = torch.zeros(x.shape[0], 2048 + 64, device="cuda")
    wide[:, 32 : 32 + 2048] = x
    assert torch.equal(linear_fp32(wide[:, 32 : 32 + 2048], weight, bias), whole)
    assert torch.equal(linear_fp32(x, weight, None), linear_fp32(x, weight, torch.zeros_like(bias)))
