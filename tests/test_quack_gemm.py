"""gemm="quack": w1 and its gate as one quack GEMM (fused/linear_silu_mul.py), the attention's projection with
its QK norm and RoPE as another (fused/linear_qk_rms_norm_rope.py); how the option is decided, with
attention's, is tests/test_kernel_options.py.

The kernel tests need a Hopper GPU with quack-kernels and NVIDIA's CuTe DSL installed (the `hopper` extra)
and skip elsewhere; CI (CPU) runs the option's checks, the launcher's contract and the fallbacks.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder, blocks, fused
from minimax_h3_vae.fused import linear_qk_rms_norm_rope as qkv_op
from minimax_h3_vae.fused import linear_silu_mul_exact as exact_op
from minimax_h3_vae.fused import quack_common
from minimax_h3_vae.fused.linear_silu_mul import (
    exact_problem,
    linear_silu_mul,
    linear_silu_mul_reference,
    unsupported,
)
from minimax_h3_vae.rope import rotary_table, token_positions
from minimax_h3_vae.runtime import resolve_gemm

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
QUACK = importlib.util.find_spec("quack") is not None and importlib.util.find_spec("cutlass") is not None
needs_quack = pytest.mark.skipif(not (HOPPER and QUACK), reason="needs a Hopper GPU with the hopper extra")
CUDA = torch.device("cuda")


# ---- not installed ----------------------------------------------------------------------------------------------


def test_quack_not_installed_names_the_extra(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "quack" else find_spec(name, *a))
    with pytest.raises(ValueError, match=r'pip install -e "\.\[hopper\]" in the checkout') as caught:
        resolve_gemm("quack", CUDA, torch.float16, True)
    assert "minimax-h3-vae[" not in str(caught.value), "the package index has no minimax-h3-vae"
    assert resolve_gemm("auto", CUDA, torch.float16, True) == "cublas"


# ---- the launcher's contract and the fallback ---------------------------------------------------------------


def test_contract_is_checked_before_quack_is_touched():
    x, w = torch.zeros(2, 16), torch.zeros(32, 16)
    assert "must share one of" in unsupported(x, w, None), "float32 is not a quack dtype here"
    assert "CUDA device" in unsupported(x.half(), w.half(), None)
    with pytest.raises(ValueError, match="linear_silu_mul: the tensors must share"):
        linear_silu_mul(x, w, None)


def test_select_ops_without_quack_here_keeps_cublas_and_the_ops_after_it(recwarn):
    """Asked for quack where it cannot run (here: the CPU), select_ops warns, naming the three GEMMs, and each
    runs as on the cuBLAS path: torch's linear followed by its op (the gate; the QK norm and RoPE), and proj_out
    as the cuBLAS path's (the Triton tf32x3_linear where the CPU interprets Triton, else the eager op)."""
    config = H3DecoderConfig(num_layers=1, num_heads=2)
    kernels = fused.choose_kernels(config, torch.device("cpu"), torch.float32, True, "quack")
    ops = fused.ops_for(kernels)
    messages = " ".join(str(w.message) for w in recwarn)
    assert "torch's linear and the silu_mul op run instead" in messages
    assert "torch's linear and the qk_rms_norm_rope op run instead" in messages
    # (where the CPU cannot run Triton at all, one reason is given for every kernel it names)
    assert "fp16x3_linear" in messages and ("CUDA device" in messages or "TRITON_INTERPRET" in messages)
    assert not fused.uses_quack(kernels)
    assert kernels.linear_fp32 == fused.choose_kernels(config, torch.device("cpu"), torch.float32).linear_fp32
    x = torch.randn(3, 5, config.dim)
    weight, bias = torch.randn(2 * config.ffn_dim, config.dim), torch.randn(2 * config.ffn_dim)
    assert torch.equal(ops.linear_silu_mul(x, weight, bias), ops.silu_mul(F.linear(x, weight, bias)))
    weight, bias = torch.randn(3 * config.dim, config.dim), torch.randn(3 * config.dim)
    table = rotary_table(token_positions(1, 1, 5, 0), config.rope_dim, config.rope_theta)
    args = (table.cos, table.sin, config.num_heads, config.norm_eps)
    for got, expected in zip(
        ops.linear_qk_rms_norm_rope(x, weight, bias, *args), ops.qk_rms_norm_rope(F.linear(x, weight, bias), *args)
    ):
        assert torch.equal(got, expected)


def test_cublas_never_imports_the_quack_module(monkeypatch):
    imported = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name) or real(name, *a))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU runs the interpreter here
    fused.select_ops(H3DecoderConfig(num_layers=1, num_heads=2), device, torch.float16, "cublas")
    assert imported and not any(name.endswith(tuple(fused.QUACK_KERNELS)) for name in imported)


def test_the_dsl_logger_gets_quacks_fingerprint_and_no_other_logger_does():
    """quack's compile-cache keyer needs a fingerprint of the CuTe DSL's logger: that one object gets it (its
    class becomes a subclass with the key); logging.Logger and every other logger of the host are unchanged,
    and the keyed logger still logs."""
    import logging
    import types

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    dsl = types.SimpleNamespace(logger=logging.Logger("cutlass-dsl-stand-in"))
    dsl.logger.addHandler(handler)
    other = logging.Logger("host")
    quack_common.key_logger(dsl)
    quack_common.key_logger(dsl)  # once is enough; again changes nothing
    assert type(dsl.logger).__quack_semantic_key__(dsl.logger) == ("logging.Logger", "cutlass-dsl-stand-in")
    assert isinstance(dsl.logger, logging.Logger) and type(dsl.logger).__mro__[1] is logging.Logger
    assert not hasattr(logging.Logger, "__quack_semantic_key__") and type(other) is logging.Logger
    dsl.logger.warning("still logs")
    assert [r.getMessage() for r in records] == ["still logs"]


def test_quacks_disk_cache_keys_take_this_packages_sources():
    """quack keys an installed package's epilogues by name alone: the package's folder goes into its cache's
    fingerprint sources once, beside what the host put there, and is the folder that holds the epilogues."""
    import types

    host = Path("/host/kernels")
    cache = types.SimpleNamespace(EXTRA_SOURCE_DIRS=[host])
    quack_common.fingerprint_sources(cache)
    quack_common.fingerprint_sources(cache)  # once is enough
    assert cache.EXTRA_SOURCE_DIRS == [host, quack_common.PACKAGE]
    assert (quack_common.PACKAGE / "fused" / "linear_qk_rms_norm_rope.py").is_file()
    assert (quack_common.PACKAGE / "fused" / "fp16x3_linear.py").is_file()


@needs_quack
def test_loading_quack_puts_this_package_into_its_cache_fingerprint():
    import quack.cache

    quack_common.load()
    assert quack.cache.EXTRA_SOURCE_DIRS.count(quack_common.PACKAGE) == 1


@needs_quack
def test_loading_quack_leaves_the_logging_classes_alone():
    import logging

    quack_common.load()
    assert not hasattr(logging.Logger, "__quack_semantic_key__")
    assert not hasattr(logging.getLoggerClass(), "__quack_semantic_key__")


def test_eager_op_is_linear_then_gate():
    """The block's w1 op is the release's two steps: w1 in fp16 (torch's linear, as the release runs it), its
    output rounded to fp16 before the gate, then the gate's own roundings."""
    x, w, b = torch.randn(4, 16).half(), torch.randn(32, 16).half(), torch.randn(32).half()
    h = F.linear(x, w, b)
    expected = (F.silu(h[:, :16].float()).half().float() * h[:, 16:].float()).half()
    assert torch.equal(blocks.linear_silu_mul(x, w, b), expected)


def test_eager_qkv_op_is_linear_then_norm_and_rope():
    """The block's attention input is the release's two steps, the projection rounded to fp16 first."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 5, 32, generator=g).half(), torch.randn(192, 32, generator=g).half()
    b = torch.randn(192, generator=g).half()
    table = rotary_table(token_positions(1, 1, 5, 0), 48, 100.0)
    args = (table.cos, table.sin, 1, 1e-5)
    for got, expected in zip(
        blocks.linear_qk_rms_norm_rope(x, w, b, *args), blocks.qk_rms_norm_rope(F.linear(x, w, b), *args)
    ):
        assert torch.equal(got, expected)


def qkv_case(batch, seq, width, heads, dtype, device, seed):
    """x, weight, bias in `dtype` and the released rotary table (48 of 64 dims) for `seq` tokens."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(batch, seq, width, device=device, generator=g).to(dtype)
    weight = (torch.randn(3 * heads * 64, width, device=device, generator=g) / width**0.5).to(dtype)
    bias = (0.1 * torch.randn(3 * heads * 64, device=device, generator=g)).to(dtype)
    table = rotary_table(token_positions(1, 1, seq, 0, device=device), 48, 100.0)
    return x, weight, bias, table.cos, table.sin


def release_order(t: torch.Tensor, rotary: int) -> torch.Tensor:
    """q or k as the op returns them (head dims in pair_order) -> the release's dim order."""
    out = torch.empty_like(t)
    out[..., qkv_op.pair_order(t.shape[-1], rotary)] = t
    return out


def test_qkv_epilogue_layout_is_the_release_norm_and_rope():
    """The op's own layout (its row order of w_qkv, its q/k vs v masks, its rotation table), run through the
    epilogue's arithmetic in float64 on the CPU, gives the release's q, k, v once q and k are put back in
    the release's dim order: the permutation, the table's pairs and the masks are right before any GPU
    runs them. A wrong partner, sign or mask is O(1) off."""
    heads, dim = 2, 64
    x, weight, bias, cos, sin = qkv_case(2, 5, 32, heads, torch.float16, "cpu", 0)
    rows, normed, kept = qkv_op.epilogue_layout(heads, dim, 48, torch.device("cpu"))
    acc = F.linear(x.double(), weight.double()[rows], bias.double()[rows]).view(2, 5, 3 * heads, dim)
    rstd = torch.rsqrt(acc.pow(2).mean(-1, keepdim=True) + 1e-5)
    y = (acc * (rstd * normed.double().view(-1, dim) + kept.double().view(-1, dim))).view(10, -1)
    table = qkv_op.rotation_table(cos, sin, 2, dim, torch.float16, None).double()
    assert table.shape == (10, 3 * dim)
    x1, x2 = y.view(10, heads, -1, 2).unbind(-1)
    c, s = table.view(10, 1, -1, 2).unbind(-1)
    out = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).view(2, 5, heads, 3, dim).transpose(1, 2)
    q, k, v = out.unbind(3)
    expected = qkv_op.linear_qk_rms_norm_rope_reference(
        x.double(), weight.double(), bias.double(), cos.half().double(), sin.half().double(), heads, 1e-5
    )
    for got, want in zip((release_order(q, 48), release_order(k, 48), v), expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_qkv_rotation_table_takes_neox_tables_only():
    """The kernel reads each rotated pair's angle once: a table whose halves differ is refused, not misread."""
    _, _, _, cos, sin = qkv_case(1, 4, 8, 1, torch.float16, "cpu", 1)
    cos = cos.clone()
    cos[:, -1] += 1
    with pytest.raises(ValueError, match="repeat their first half"):
        qkv_op.rotation_table(cos, sin, 1, 64, torch.float16, None)


def test_qkv_rotation_table_is_kept_per_table_and_rebuilt_after_a_change():
    """One table per rotary table and batch in the model's cache (`tables`, which its ops hold: the decoder's
    tables live across calls, inference tensors included); writing into cos builds a new one."""
    _, _, _, cos, sin = qkv_case(1, 4, 8, 1, torch.float16, "cpu", 5)
    tables = {}
    first = qkv_op.rotation_table(cos, sin, 2, 64, torch.float16, tables)
    assert qkv_op.rotation_table(cos, sin, 2, 64, torch.float16, tables) is first
    assert qkv_op.rotation_table(cos, sin, 3, 64, torch.float16, tables).shape == (12, 192)
    cos.mul_(0.5)
    assert not torch.equal(qkv_op.rotation_table(cos, sin, 2, 64, torch.float16, tables), first)
    with torch.inference_mode():
        _, _, _, cos, sin = qkv_case(1, 4, 8, 1, torch.float16, "cpu", 5)
    assert qkv_op.rotation_table(cos, sin, 2, 64, torch.float16, tables) is qkv_op.rotation_table(
        cos, sin, 2, 64, torch.float16, tables
    )
    # The cache holds cos and sin themselves (so an id is never reused while its entry stands), is bounded,
    # and goes with the model that holds it; without one nothing is kept.
    assert any(entry[0] is cos and entry[1] is sin for entry in tables.values())
    for batch in range(4, 4 + qkv_op.KEPT_TABLES):
        qkv_op.rotation_table(cos, sin, batch, 64, torch.float16, tables)
    assert len(tables) == qkv_op.KEPT_TABLES
    assert qkv_op.rotation_table(cos, sin, 2, 64, torch.float16, None) is not qkv_op.rotation_table(
        cos, sin, 2, 64, torch.float16, None
    )


def test_qkv_contract_is_checked_before_quack_is_touched():
    x, weight, bias, cos, sin = qkv_case(1, 4, 16, 1, torch.float16, "cpu", 2)
    assert "CUDA device" in qkv_op.unsupported(x, weight, bias, cos, sin, 1, 1e-5)
    assert "must share one of" in qkv_op.unsupported(x.float(), weight.float(), bias.float(), cos, sin, 1, 1e-5)
    with pytest.raises(ValueError, match="linear_qk_rms_norm_rope: the tensors must be on one CUDA device"):
        qkv_op.linear_qk_rms_norm_rope(x, weight, bias, cos, sin, 1, 1e-5)


# ---- the kernel on the GPU ------------------------------------------------------------------------------------


def exact_and_allowance(x, weight, bias) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(gate) * value of the float64 product and bias (what the kernel rounds once), and per value what
    a float32 sum over K may lose on the way, carried through the gate.

    A GEMM sums K products in float32 in blocks (tensor-core steps inside a k-tile, then k-tiles one after
    another), so each output has at most about K / 64 + 6 roundings at the scale of sum |x_k w_k| (2^-23
    each: tensor cores may truncate). Through `silu(g) * v` that error is scaled by at most
    |v| * max silu' (1.1) + |silu(g)|.
    """
    b64 = None if bias is None else bias.double()
    h = F.linear(x.double(), weight.double(), b64)
    scale = F.linear(x.double().abs(), weight.double().abs(), None if b64 is None else b64.abs())
    gate, value = h.chunk(2, dim=-1)
    slack_g, slack_v = ((x.shape[-1] / 64 + 6) * 2.0**-23 * scale).chunk(2, dim=-1)
    return F.silu(gate) * value, 1.1 * value.abs() * slack_g + F.silu(gate).abs() * slack_v


def assert_one_rounding(out: torch.Tensor, exact: torch.Tensor, allowance: torch.Tensor) -> None:
    """out is within one rounding step of its dtype from the exact value, plus the float32 sum's allowance
    (exact_and_allowance). A wrong pairing of gate and value, a lost bias or a wrong scale is O(1) off and
    fails this by far."""
    eps = torch.finfo(out.dtype).eps  # one step at the value's scale is at most eps * |value|
    subnormal_step = torch.finfo(out.dtype).smallest_normal * eps
    bound = eps * exact.abs() + subnormal_step + allowance
    excess = (out.double() - exact).abs() - bound
    assert excess.max() <= 0, f"{int((excess > 0).sum())} values beyond the bound, worst by {excess.max().item():.3e}"


@needs_quack
@pytest.mark.parametrize(("rows", "bias"), [(28 * 1797, True), (2 * 1797 + 5, True), (3, False)])
def test_kernel_at_released_width_is_one_rounding_from_exact(rows, bias):
    """The released w1 (2048 -> 2 x 8192) at a whole unit's 28 tiles, at an odd row count, and without bias;
    more accurate on average than the release's three roundings."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 2048, device="cuda", generator=g).half()
    weight = (torch.randn(16384, 2048, device="cuda", generator=g) / 2048**0.5).half()
    b = (torch.randn(16384, device="cuda", generator=g) * 0.1).half() if bias else None
    launches = {}  # counted by the launcher, after its launch
    out = linear_silu_mul(x, weight, b, launches=launches)
    assert launches == {"linear_silu_mul": 1}
    assert out.shape == (rows, 8192) and out.dtype == torch.float16
    exact, allowance = exact_and_allowance(x, weight, b)
    assert_one_rounding(out, exact, allowance)
    assert_one_rounding(linear_silu_mul_reference(x, weight, b), exact, allowance)
    eager = blocks.linear_silu_mul(x, weight, b)
    assert (out.double() - exact).abs().mean() < (eager.double() - exact).abs().mean()


@needs_quack
def test_kernel_takes_the_blocks_layout_and_bf16():
    """A (B, S, K) batch of tiles as the block passes it (rows flatten), in bf16 too."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(3, 37, 64, device="cuda", generator=g).to(dtype)
        weight = (torch.randn(256, 64, device="cuda", generator=g) / 8).to(dtype)
        b = torch.randn(256, device="cuda", generator=g).to(dtype)
        out = linear_silu_mul(x, weight, b)
        assert out.shape == (3, 37, 128)
        assert_one_rounding(out, *exact_and_allowance(x, weight, b))


def qkv_exact_and_allowance(x, weight, bias, cos, sin, heads, eps):
    """q, k, v of the float64 projection (cos and sin rounded to x's dtype as the kernel's table holds them),
    in the release's order, and per value what the kernel may lose before its one rounding:
    - the float32 sum over K: about K / 64 + 6 roundings at the scale of sum |x_k w_k| (exact_and_allowance);
    - through the norm q = t / r, r = sqrt(mean(t^2) + eps): dq_i <= dt_i / r + |t_i| / r^3 * sum_j |t_j| dt_j / D;
    - the approximate rsqrt and the float32 norm and rotation: 2^-20 of the values they combine;
    - through the rotation: a rotated dim combines its own and its partner's error, by |cos| and |sin|.
    """
    x64, w64, b64 = x.double(), weight.double(), bias.double()
    cos64, sin64 = cos.to(x.dtype).double(), sin.to(x.dtype).double()
    exact = qkv_op.linear_qk_rms_norm_rope_reference(x64, w64, b64, cos64, sin64, heads, eps)
    batch, seq, width = x.shape
    pre = F.linear(x64, w64, b64).view(batch, seq, heads, 3, -1).transpose(1, 2)
    slack = (width / 64 + 6) * 2.0**-23 * F.linear(x64.abs(), w64.abs(), b64.abs())
    slack = slack.view(batch, seq, heads, 3, -1).transpose(1, 2)
    rotary, half = cos.shape[-1], cos.shape[-1] // 2
    allowances = []
    for i in range(2):
        t, dt = pre[..., i, :], slack[..., i, :]
        r = (t.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        normed = t / r
        d = dt / r + t.abs() / r**3 * (t.abs() * dt).mean(-1, keepdim=True) + 2.0**-20 * normed.abs()
        partner = torch.cat([d[..., half:rotary], d[..., :half]], dim=-1)
        partner_value = torch.cat([normed[..., half:rotary], normed[..., :half]], dim=-1)
        own = d[..., :rotary]
        turned = own * cos64.abs() + partner * sin64.abs() + 2.0**-20 * partner_value.abs()
        allowances.append(torch.cat([turned, d[..., rotary:]], dim=-1))
    allowances.append(slack[..., 2, :])
    return exact, allowances


@needs_quack
@pytest.mark.parametrize(
    ("batch", "seq", "dtype"), [(2, 1797, torch.float16), (3, 37, torch.float16), (1, 50, torch.bfloat16)]
)
def test_qkv_kernel_at_released_width_is_one_rounding_from_exact(batch, seq, dtype):
    """The released projection (2048 -> 32 heads x [q | k | v] x 64) over two released tiles, a ragged batch
    and bf16: q and k (put back in the release's order) and v within one rounding of the float64 result, and
    closer to it on average than the release's fp16 steps."""
    x, weight, bias, cos, sin = qkv_case(batch, seq, 2048, 32, dtype, "cuda", seq)
    launches = {}  # counted by the launcher, after its launch
    q, k, v = qkv_op.linear_qk_rms_norm_rope(x, weight, bias, cos, sin, 32, 1e-5, launches=launches)
    assert launches == {"linear_qk_rms_norm_rope": 1}
    assert q.shape == k.shape == v.shape == (batch, 32, seq, 64) and q.dtype == dtype
    exact, allowances = qkv_exact_and_allowance(x, weight, bias, cos, sin, 32, 1e-5)
    got = (release_order(q, 48), release_order(k, 48), v)
    eager = blocks.linear_qk_rms_norm_rope(x, weight, bias, cos, sin, 32, 1e-5)
    for name, out, want, allowance, release in zip("qkv", got, exact, allowances, eager):
        assert_one_rounding(out, want, allowance)
        if name != "v":  # v is the projection alone, one rounding in both
            assert (out.double() - want).abs().mean() < (release.double() - want).abs().mean(), name


@needs_quack
def test_qkv_kernel_scores_are_the_release_order_scores():
    """What attention reads: softmax(q k^T) v from the op's q and k (in its own dim order) equals the same
    from q and k put back in the release's order, to fp16 attention's own noise."""
    x, weight, bias, cos, sin = qkv_case(2, 300, 2048, 32, torch.float16, "cuda", 4)
    q, k, v = qkv_op.linear_qk_rms_norm_rope(x, weight, bias, cos, sin, 32, 1e-5)
    ours = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    release = F.scaled_dot_product_attention(release_order(q, 48).float(), release_order(k, 48).float(), v.float())
    torch.testing.assert_close(ours, release, rtol=0, atol=1e-5)


@needs_quack
def test_decoder_on_quack_is_as_close_to_fp32_as_cublas(layouts):
    """The whole decode with gemm="quack" (exact=False) against an fp32 eager decode of the same weights: no
    further from it than the cuBLAS fused path (the gate reads the float32 accumulator), and quack's op ran for
    every block of every call, the Triton gate for none."""
    z = torch.randn(1, 24, 8, 17, 9, generator=torch.Generator().manual_seed(5))
    reference = H3VideoDecoder.from_pretrained(layouts["original"], device="cuda", dtype="fp32", fused=False).decode(z)
    outs, launches = {}, {}
    for gemm in ("cublas", "quack"):
        decoder = H3VideoDecoder.from_pretrained(
            layouts["original"], device="cuda", dtype="fp16", gemm=gemm, attention="sdpa", exact=False
        )
        assert decoder.runtime.gemm == gemm and fused.uses_quack(decoder.runtime.kernels) == (gemm == "quack")
        before = decoder.launch_counts()
        outs[gemm] = decoder.decode(z)
        launches[gemm] = {k: v - before[k] for k, v in decoder.launch_counts().items()}
    layers = len(decoder.decoder.transformer_blocks)
    assert launches["quack"]["linear_silu_mul"] == launches["cublas"]["silu_mul"] > 0
    assert launches["quack"]["linear_silu_mul"] % layers == 0 and launches["quack"]["silu_mul"] == 0
    assert launches["quack"]["linear_qk_rms_norm_rope"] == launches["cublas"]["qk_rms_norm_rope"] > 0
    assert launches["quack"]["qk_rms_norm_rope"] == 0
    assert launches["quack"]["fp16x3_linear"] == launches["cublas"]["tf32x3_linear"] > 0
    assert launches["quack"]["tf32x3_linear"] == 0
    errors = {gemm: (out - reference).abs() for gemm, out in outs.items()}
    assert errors["quack"].mean() <= errors["cublas"].mean() * 1.1
    assert errors["quack"].max() <= errors["cublas"].max() * 1.5
    assert not torch.equal(outs["quack"], outs["cublas"]), "the quack path ran"


@needs_quack
@pytest.mark.parametrize("exact", [None, False])
def test_load_builds_quack_beside_the_weights(layouts, exact):
    """The set-up thread imports quack and builds the GEMMs the decoder takes at load, one launch each, none left
    for the first decode: by default (exact on: it costs nothing with quack) the exact w1 alone; with exact=False
    the fast ones."""
    decoder = H3VideoDecoder.from_pretrained(
        layouts["original"], device="cuda", dtype="fp16", gemm="quack", exact=exact
    )
    assert decoder.runtime.exact is (exact is None)
    after = decoder.launch_counts()
    # each counts its launches under its module's name
    exact_w1 = {"linear_silu_mul_exact"}
    taken = exact_w1 if exact is None else set(fused.QUACK_KERNELS) - exact_w1
    assert {name: after[name] for name in fused.QUACK_KERNELS} == {n: int(n in taken) for n in fused.QUACK_KERNELS}


# ---- the exact kernel: w1 and the gate with the release's roundings --------------------------------------------


def assert_same_bits(out: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bit for bit, a NaN equal to any NaN (the gate of a NaN is NaN either way)."""
    nan = out.isnan() & want.isnan()
    differ = (out.view(torch.int16) != want.view(torch.int16)) & ~nan
    assert not differ.any(), f"{int(differ.sum())} of {out.numel()} values differ"


@needs_quack
def test_exact_kernel_is_the_eager_gate_on_every_fp16_value():
    """w1 zero, so its output is the bias: the gate takes each of the 65,536 fp16 values (NaN, infinities and
    subnormals included) beside random values, and the epilogue's rounding, exp and division give the eager
    op's bits on every one."""
    n = 65536
    g = torch.Generator(device="cuda").manual_seed(0)
    gate = torch.arange(n, dtype=torch.int32, device="cuda").to(torch.int16).view(torch.float16)
    bias = torch.cat([gate, torch.randn(n, device="cuda", generator=g).half()])
    weight = torch.zeros(2 * n, 64, dtype=torch.float16, device="cuda")
    x = torch.randn(4, 64, device="cuda", generator=g).half()
    launches = {}
    out = exact_op.linear_silu_mul(x, weight, bias, launches=launches)
    assert launches == {"linear_silu_mul_exact": 1}
    assert_same_bits(out, blocks.linear_silu_mul(x, weight, bias))


@needs_quack
@pytest.mark.parametrize(
    ("rows", "k", "f"),
    [(28 * 1797, 2048, 8192), (1797, 2048, 8192), (2 * 1797 + 5, 2048, 8192), (3 * 1797, 128, 512), (37, 64, 24)],
)
def test_exact_kernel_is_the_eager_op(rows, k, f):
    """Random weights at the released w1 (28 tiles, one tile, an odd row count) and at the test models' sizes:
    the GEMM sums as cuBLAS's does there, so the whole op is the eager one's bits."""
    g = torch.Generator(device="cuda").manual_seed(rows + k)
    x = torch.randn(rows, k, device="cuda", generator=g).half()
    weight = (torch.randn(2 * f, k, device="cuda", generator=g) / k**0.5).half()
    bias = (torch.randn(2 * f, device="cuda", generator=g) * 0.1).half()
    assert_same_bits(exact_op.linear_silu_mul(x, weight, bias), blocks.linear_silu_mul(x, weight, bias))


def test_exact_kernel_refuses_what_it_cannot_round_as_the_release():
    """bf16 (the release's recipe is fp16) and a missing bias (the epilogue adds it before the first rounding):
    the exact variant's own check names each, and its `unsupported` passes them on where quack runs."""
    x, weight = torch.zeros(2, 64, dtype=torch.float16), torch.zeros(48, 64, dtype=torch.float16)
    bias = torch.zeros(48, dtype=torch.float16)
    assert "must be float16" in exact_problem(x.bfloat16(), bias.bfloat16())
    assert "bias must be a tensor" in exact_problem(x, None)
    assert exact_problem(x, bias) is None
    if HOPPER and QUACK:
        x, weight = x.cuda(), weight.cuda()
        assert "must be float16" in exact_op.unsupported(x.bfloat16(), weight.bfloat16(), None)
        assert "bias must be a tensor" in exact_op.unsupported(x, weight, None)
