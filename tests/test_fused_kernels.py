"""The Triton kernels of `minimax_h3_vae.fused` against their eager references in `blocks.py`.

Each test runs on every device that can run the kernels: the CPU through Triton's interpreter
(TRITON_INTERPRET=1, set below when there is no GPU) and CUDA when present. Sizes stay small so the
interpreter is quick, but odd: row and token counts that fill no block, rows narrower than their block.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

# triton.jit picks compiled or interpreted when a kernel is defined, so this must precede the kernel imports.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from minimax_h3_vae import H3DecoderConfig, blocks  # noqa: E402
from minimax_h3_vae.fused import interpreting, kernel_module, registry, select_ops  # noqa: E402
from minimax_h3_vae.fused import qk_rms_norm_rope as qk_module  # noqa: E402
from minimax_h3_vae.fused import rms_norm as rms_norm_module  # noqa: E402
from minimax_h3_vae.fused import tf32x3_linear as tf32x3_module  # noqa: E402
from minimax_h3_vae.fused.qk_rms_norm_rope import qk_rms_norm_rope, qk_rms_norm_rope_reference  # noqa: E402
from minimax_h3_vae.fused.rms_norm import rms_norm, rms_norm_reference  # noqa: E402
from minimax_h3_vae.fused.scale_add_rms_norm import scale_add_rms_norm, scale_add_rms_norm_reference  # noqa: E402
from minimax_h3_vae.fused.silu_mul import silu_mul, silu_mul_reference  # noqa: E402
from minimax_h3_vae.fused.tf32x3_linear import linear_fp32, linear_fp32_reference  # noqa: E402

DTYPES = [pytest.param(d, id=str(d).split(".")[-1]) for d in (torch.float32, torch.float16, torch.bfloat16)]
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not interpreting(), reason="CPU runs need TRITON_INTERPRET=1")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]
EPS = 1e-5  # the released norm_eps


def randn(*shape, dtype=torch.float32, device="cpu", seed=0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)


def norm_weight(channels, device, seed) -> torch.Tensor:
    return 1.0 + 0.2 * randn(channels, device=device, seed=seed)


def assert_matches(actual, expected):
    """Kernel output against the eager reference, to a tolerance set by the dtype.

    float32: the kernel reduces in another order than torch, a few float32 ulps apart. float16/bfloat16:
    both sides compute the same float32 value up to those few ulps and round it once into the dtype, so they
    differ only where it sits next to a rounding boundary, and then by one ulp of the dtype: rtol = eps, and
    atol = the smallest subnormal (one ulp near zero).
    """
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if expected.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    else:
        info = torch.finfo(expected.dtype)
        torch.testing.assert_close(actual.double(), expected.double(), rtol=info.eps, atol=info.tiny * info.eps)


def assert_rope_matches(actual, expected, head_dim):
    """q or k against the eager reference.

    The tolerance: the norm may land one ulp of the dtype apart (see `assert_matches`); a normalised value is at
    most sqrt(head_dim) in magnitude and |cos|, |sin| <= 1, so a product moves by at most eps * sqrt(head_dim),
    and the final sum rounds once more (rtol = eps). In float16/bfloat16 the rotation must also round each
    product and the sum exactly as torch's half ops do: rounding only the sum differs from eager on about a
    third of the rotated elements, so nearly all elements must be bit-identical.
    """
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.transpose(1, 2).is_contiguous(), "q and k are written (B, S, H, D) for attention"
    if expected.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
        return
    eps = torch.finfo(expected.dtype).eps
    torch.testing.assert_close(actual.double(), expected.double(), rtol=eps, atol=eps * math.sqrt(head_dim))
    assert (actual == expected).double().mean().item() >= 0.99


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_rms_norm_matches_reference_on_strided_rows(device, dtype, out_dtype):
    """3 x 23 = 69 rows (no multiple of the 32-row block) of 96 channels, inside a wider buffer."""
    x = randn(3, 23, 100, dtype=dtype, device=device)[..., 2:98]
    weight = norm_weight(96, device, seed=1)
    launches = {}  # counted by the launcher, after its launch
    out = rms_norm(x, weight, EPS, out_dtype, launches=launches)
    assert launches == {"rms_norm": 1}
    assert out.is_contiguous()
    assert_matches(out, rms_norm_reference(x, weight, EPS, out_dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_wide_rows(device):
    """2048 channels: two rows per program, and 5 rows leave the last program half empty."""
    x = randn(5, 2048, device=device)
    weight = norm_weight(2048, device, seed=1)
    assert_matches(rms_norm(x, weight, EPS, torch.float16), rms_norm_reference(x, weight, EPS, torch.float16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_add_rms_norm_updates_residual_in_place(device, dtype):
    """The residual is a column slice of a wider buffer: the add lands in it, the columns beside it stay."""
    buffer = randn(2, 19, 80, device=device)
    untouched = buffer.clone()
    residual = buffer[..., 4:76]
    y = randn(2, 19, 72, dtype=dtype, device=device, seed=1)
    scale = randn(72, device=device, seed=2)
    weight = norm_weight(72, device, seed=3)
    expected_residual, expected_normed = scale_add_rms_norm_reference(residual.clone(), y, scale, weight, EPS, dtype)
    launches = {}  # counted by the launcher, after its launch
    out_residual, normed = scale_add_rms_norm(residual, y, scale, weight, EPS, dtype, launches=launches)
    assert launches == {"scale_add_rms_norm": 1}
    assert out_residual is residual
    # Exact: float(y) * scale, then + residual, two float32 roundings on both sides (the kernel never fuses them).
    torch.testing.assert_close(residual, expected_residual, rtol=0, atol=0)
    torch.testing.assert_close(buffer[..., :4], untouched[..., :4], rtol=0, atol=0)
    torch.testing.assert_close(buffer[..., 76:], untouched[..., 76:], rtol=0, atol=0)
    assert normed.is_contiguous()
    assert_matches(normed, expected_normed)


@pytest.mark.parametrize("device", DEVICES)
def test_scale_add_without_norm_weight_only_adds(device):
    """weight None: the last block's add, no norm; y has a row stride of its own."""
    residual = randn(37, 48, device=device)
    expected = residual.clone()
    y = randn(37, 64, dtype=torch.float16, device=device, seed=1)[:, 8:56]
    scale = randn(48, device=device, seed=2)
    scale_add_rms_norm_reference(expected, y, scale, None, EPS, torch.float16)
    launches = {}  # counted by the launcher, after its launch
    out_residual, normed = scale_add_rms_norm(residual, y, scale, None, EPS, torch.float16, launches=launches)
    assert launches == {"scale_add_rms_norm": 1}
    assert out_residual is residual and normed is None
    torch.testing.assert_close(residual, expected, rtol=0, atol=0)


def strided_qkv_and_table(batch, seq, heads, head_dim, rotary, dtype, device, scale=1.0):
    """(buffer, qkv, cos, sin): qkv (batch, seq, 3 * heads * head_dim) a window of a wider `buffer` (offset,
    padded rows, padded tokens), values `scale` x N(0, 1); cos, sin (seq, rotary) column slices of one (seq,
    2 * rotary) table of random angles. Every stride the QK kernels take differs from the contiguous one."""
    width = 3 * heads * head_dim
    buffer = scale * randn(batch, seq + 2, width + 16, dtype=dtype, device=device)
    qkv = buffer[:, 1 : seq + 1, 8 : 8 + width]
    angles = (2 * math.pi * torch.rand(seq, rotary // 2, generator=torch.Generator().manual_seed(1))).repeat(1, 2)
    table = torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)
    return buffer, qkv, table[:, :rotary], table[:, rotary:]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim, rotary", [(64, 48), (32, 32), (16, 4)])
def test_qk_rms_norm_rope_matches_reference(device, dtype, head_dim, rotary):
    """Released shape (64, 48), full and narrow rotation; 37 tokens fill no token block; batch 2, one table.

    qkv is a window of a wider buffer (offset, padded rows, padded tokens) and cos, sin are column slices of one
    (S, 2R) table: every stride the kernel takes differs from the contiguous one.
    """
    batch, seq, heads = 2, 37, 3
    buffer, qkv, cos, sin = strided_qkv_and_table(batch, seq, heads, head_dim, rotary, dtype, device)

    launches = {}  # counted by the launcher, after its launch
    q, k, v = qk_rms_norm_rope(qkv, cos, sin, heads, EPS, launches=launches)
    assert launches == {"qk_rms_norm_rope": 1}
    expected_q, expected_k, expected_v = qk_rms_norm_rope_reference(qkv, cos, sin, heads, EPS)
    assert q.shape == (batch, heads, seq, head_dim)
    assert_rope_matches(q, expected_q, head_dim)
    assert_rope_matches(k, expected_k, head_dim)
    assert v.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    assert v.data_ptr() == expected_v.data_ptr() and v.stride() == expected_v.stride()
    assert torch.equal(v, expected_v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [4, 8, 16, 32, 64, 128, 256])
def test_qk_rms_norm_rope_exact_is_the_eager_op(device, dtype, head_dim):
    """The exact kernel sums each head's squares in torch's order from the tile it loaded: for every head size
    (1 to 64 torch threads, one or two warps) on CUDA the eager op's values bit for bit, strided qkv as above
    (with Triton's order instead, 10 of the 21 CUDA cases fail). The interpreter's rsqrt is not CUDA's: there,
    within the fast kernel's tolerance."""
    heads, rotary = 3, max(2, head_dim * 3 // 4 // 2 * 2)
    _, qkv, cos, sin = strided_qkv_and_table(2, 37, heads, head_dim, rotary, dtype, device, scale=3.0)

    launches = {}
    q, k, _ = kernel_module("qk_rms_norm_rope_exact").qk_rms_norm_rope(qkv, cos, sin, heads, EPS, launches=launches)
    assert launches == {"qk_rms_norm_rope_exact": 1}
    expected_q, expected_k, _ = qk_rms_norm_rope_reference(qkv, cos, sin, heads, EPS)
    for got, want in ((q, expected_q), (k, expected_k)):
        if got.is_cuda:
            assert torch.equal(got, want), f"{(got != want).sum().item()} values differ"
        else:
            assert_rope_matches(got, want, head_dim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_reference_on_strided_rows(device, dtype):
    """37 rows of [gate | value] halves of 2500 (the last column block part empty), inside a wider buffer.

    Tolerance: silu and the product each round to the dtype on both sides; the kernel's exp differs from
    torch's by float32 ulps, which can move the rounded silu by one ulp of the dtype, and the product by
    one more: rtol = 2 eps. Nearly all elements must still be bit-identical.
    """
    h = randn(37, 5008, dtype=dtype, device=device)[:, 4:5004] * 4
    launches = {}  # counted by the launcher, after its launch
    out = silu_mul(h, launches=launches)
    assert launches == {"silu_mul": 1}
    expected = silu_mul_reference(h)
    assert out.shape == (37, 2500) and out.dtype == dtype and out.is_contiguous()
    eps = torch.finfo(dtype).eps if dtype != torch.float32 else 1e-6
    torch.testing.assert_close(out.double(), expected.double(), rtol=2 * eps, atol=torch.finfo(dtype).tiny)
    if dtype != torch.float32:
        assert (out == expected).double().mean().item() >= 0.99
    if device == "cuda":
        assert torch.equal(out, expected), "on CUDA the kernel uses the same expf and division as torch"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_tf32x3_linear_matches_reference_on_strided_rows(device, bias):
    """2 x 75 rows (no multiple of the 128-row tile) of K = 70 (no multiple of the 32-wide k step) inside a
    wider buffer, N = 130 (one full column tile and a sliver). Against a float64 product: within a few
    float32 ulps of the magnitudes summed, as the plain float32 product is."""
    x = randn(2, 75, 80, device=device)[..., 5:75]
    weight = randn(130, 70, device=device, seed=1) * 0.1
    b = randn(130, device=device, seed=2) if bias else None
    launches = {}  # counted by the launcher, after its launch
    out = linear_fp32(x, weight, b, launches=launches)
    assert launches == {"tf32x3_linear": 1}
    assert out.shape == (2, 75, 130) and out.dtype == torch.float32 and out.is_contiguous()
    exact = torch.nn.functional.linear(x.double(), weight.double(), None if b is None else b.double())
    scale = torch.nn.functional.linear(x.double().abs(), weight.double().abs()).max().item()
    assert (out.double() - exact).abs().max().item() <= 8 * torch.finfo(torch.float32).eps * scale


@pytest.mark.parametrize("device", DEVICES)
def test_tf32x3_linear_leaves_global_matmul_settings_alone(device, monkeypatch):
    """The kernel chooses its own precision: torch's process-wide TF32 switches are never written."""
    writes = []
    module = type(torch.backends.cuda.matmul)
    setattr_ = module.__setattr__
    monkeypatch.setattr(
        module, "__setattr__", lambda self, name, value: writes.append(name) or setattr_(self, name, value)
    )
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda *a: writes.append("precision"))
    linear_fp32(randn(5, 64, device=device), randn(16, 64, device=device, seed=1), None)
    assert writes == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 needs CUDA tensor cores")
def test_tf32x3_linear_is_float32_accurate():
    """At proj_out's width, against a float64 product: the three TF32 products stay within a few float32 ulps,
    as plain float32 does, where one TF32 product alone would be ~2^-11 off."""
    x, weight, bias = (
        randn(4096, 2048, device="cuda"),
        randn(3072, 2048, device="cuda", seed=1) * 0.02,
        randn(3072, device="cuda", seed=2),
    )
    exact = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
    launches = {}  # counted by the launcher, after its launch
    out = linear_fp32(x, weight, bias, launches=launches)
    assert launches == {"tf32x3_linear": 1}
    plain = linear_fp32_reference(x, weight, bias)
    error, plain_error = (out.double() - exact).abs().max(), (plain.double() - exact).abs().max()
    assert error <= 4 * plain_error + 1e-6, (error, plain_error)


# The video decoder's kernels that every fused run takes where they run (registry.py), op -> launcher; their
# interface is checked with every other kernel's in tests/test_kernel_registry.py.
LAUNCHERS = {
    line.op: getattr(kernel_module(line.module), line.op)
    for line in reversed(registry.KERNELS)  # the first line of an op that every fused run takes wins
    if line.module and line.option is None and hasattr(blocks.EAGER_OPS, line.op)
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_select_ops_takes_every_kernel_for_the_released_layout(device, dtype, recwarn):
    """The released widths and head layout on a device that runs the kernels: every op is its kernel, no
    warning."""
    ops = select_ops(H3DecoderConfig(num_layers=1), torch.device(device), dtype)
    # each op is its launcher, with the model's launch counts bound in
    assert {name: getattr(ops, name).func for name in LAUNCHERS} == LAUNCHERS
    assert not [w for w in recwarn if "fused path" in str(w.message)]


def _rope_args(device, dtype=torch.float16, head_dim=64, rotary=48, table_shape=None):
    seq, heads = 21, 2
    qkv = randn(2, seq, 3 * heads * head_dim, dtype=dtype, device=device)
    angles = randn(*(table_shape or (seq, rotary)), device=device, seed=1)
    return qkv, angles.cos(), angles.sin(), heads, EPS


def _scale_add_args(device, dtype=torch.float32, y_shape=(3, 11, 40), residual=None):
    residual = randn(3, 11, 40, dtype=dtype, device=device) if residual is None else residual
    y = randn(*y_shape, dtype=dtype, device=device, seed=1)
    return residual, y, randn(40, device=device, seed=2), norm_weight(40, device, 3), EPS, torch.float16


# Calls the reference handles but the kernels do not: (op, a function of the device building its arguments).
OUT_OF_CONTRACT = {
    "rms_norm_float64": (
        "rms_norm",
        lambda d: (randn(9, 40, dtype=torch.float64, device=d), norm_weight(40, d, 1), EPS, torch.float16),
    ),
    "rms_norm_float64_out": ("rms_norm", lambda d: (randn(9, 40, device=d), norm_weight(40, d, 1), EPS, torch.float64)),
    "rms_norm_column_stride": (
        "rms_norm",
        lambda d: (randn(40, 9, device=d).t(), norm_weight(40, d, 1), EPS, torch.float32),
    ),
    "rms_norm_requires_grad": (
        "rms_norm",
        lambda d: (randn(9, 40, device=d).requires_grad_(), norm_weight(40, d, 1), EPS, torch.float32),
    ),
    "scale_add_float64": ("scale_add_rms_norm", lambda d: _scale_add_args(d, dtype=torch.float64)),
    "scale_add_broadcast_y": ("scale_add_rms_norm", lambda d: _scale_add_args(d, y_shape=(40,))),
    "scale_add_rows_not_one_stride": (
        "scale_add_rms_norm",
        lambda d: _scale_add_args(d, residual=randn(3, 13, 40, device=d)[:, :11]),
    ),
    "rope_head_dim_48": ("qk_rms_norm_rope", lambda d: _rope_args(d, head_dim=48, rotary=32)),
    "rope_float64": ("qk_rms_norm_rope", lambda d: _rope_args(d, dtype=torch.float64)),
    "rope_odd_rotary": ("qk_rms_norm_rope", lambda d: _rope_args(d, head_dim=16, rotary=5)),
    "rope_table_with_batch_dim": ("qk_rms_norm_rope", lambda d: _rope_args(d, table_shape=(1, 21, 48))),
    "silu_mul_column_stride": ("silu_mul", lambda d: (randn(32, 5, device=d).t(),)),
    "silu_mul_float64": ("silu_mul", lambda d: (randn(5, 32, dtype=torch.float64, device=d),)),
    "linear_fp32_float16": (
        "linear_fp32",
        lambda d: (randn(5, 32, dtype=torch.float16, device=d), randn(8, 32, dtype=torch.float16, device=d), None),
    ),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", OUT_OF_CONTRACT)
def test_launchers_refuse_calls_outside_the_contract(device, case):
    """A call the eager op handles but the kernel does not: a ValueError naming the op, and no launch."""
    name, make_args = OUT_OF_CONTRACT[case]
    args = make_args(device)
    getattr(blocks.EAGER_OPS, name)(*make_args(device))  # the reference takes it
    launches = {}
    with pytest.raises(ValueError, match=name):
        LAUNCHERS[name](*args, launches=launches)
    assert launches == {}


def test_launchers_refuse_the_cpu_without_the_interpreter(monkeypatch):
    """A kernel built compiled (TRITON_INTERPRET unset when it was defined) refuses CPU tensors: the launcher
    asks its kernel how it was built, never the environment (read once, when the kernels are chosen)."""
    for module in (rms_norm_module, qk_module, tf32x3_module):
        monkeypatch.setattr(module, "built_for_interpreter", lambda kernel: False)
    x, weight = randn(9, 40), norm_weight(40, "cpu", 1)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        rms_norm(x, weight, EPS, torch.float16)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        qk_rms_norm_rope(*_rope_args("cpu"))
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        linear_fp32(x, randn(8, 40, seed=1), None)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs_launch_nothing(device):
    x, weight = randn(0, 40, device=device), norm_weight(40, device, 1)
    qkv = randn(2, 0, 3 * 64, device=device)
    launches = {}
    assert rms_norm(x, weight, EPS, torch.float16, launches=launches).shape == (0, 40)
    q, k, v = qk_rms_norm_rope(qkv, qkv.new_empty(0, 48), qkv.new_empty(0, 48), 1, EPS, launches=launches)
    assert q.shape == k.shape == v.shape == (2, 1, 0, 64)
    assert launches == {}
