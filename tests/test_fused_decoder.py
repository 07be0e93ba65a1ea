"""The fused path at decoder level: same output as eager, and proof that all three kernels ran.

On a machine without CUDA the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1),
so the sizes stay small: 2 tiles of 8 x 1 latents in one temporal window, one decoder call (each interpreted
launch costs ~0.2 s of CPU; the windows and tiles around the call are the eager path's, tested elsewhere).
"""

from __future__ import annotations

import math

import pytest
import torch
from command_runs import run_cli, small_latents

pytest.importorskip("triton")

from minimax_h3_vae import H3VideoDecoder, Tiling, fused  # noqa: E402
from minimax_h3_vae.blocks import EAGER_OPS  # noqa: E402
from minimax_h3_vae.fused import registry  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def latents():
    return torch.randn(1, 24, 7, 9, 1, generator=torch.Generator().manual_seed(3))


def decode(layouts, latents, dtype, is_fused):
    # The Triton kernels' path: cuBLAS for every GEMM (quack's, where installed, is tested in test_quack_gemm.py).
    decoder = H3VideoDecoder.from_pretrained(
        layouts["original"],
        device=DEVICE,
        dtype=dtype,
        fused=is_fused,
        gemm="cublas",
        attention="sdpa",
        tiling=Tiling(128, 32),
    )
    assert decoder.runtime.fused is is_fused
    before = decoder.launch_counts()
    out = decoder.decode(latents)
    after = decoder.launch_counts()
    return out, {name: after[name] - before[name] for name in after}


def test_fused_fp32_matches_eager_and_runs_every_kernel(layouts, latents):
    eager, eager_launches = decode(layouts, latents, "fp32", False)
    out, launches = decode(layouts, latents, "fp32", True)
    assert set(eager_launches.values()) == {0}
    # 1 decoder call x (1 input norm, 2 layers x (2 residual adds, 1 qk-norm + rope, 1 gate), 1 proj_out).
    assert launches == {
        "rms_norm": 1,
        "rms_norm_exact": 0,  # the exact kernels, for exact=True only
        "scale_add_rms_norm": 4,
        "scale_add_rms_norm_exact": 0,
        "qk_rms_norm_rope": 2,
        "qk_rms_norm_rope_exact": 0,
        "silu_mul": 2,
        "tf32x3_linear": 1,
        "linear_silu_mul": 0,  # quack's, for gemm="quack" only
        "linear_silu_mul_exact": 0,
        "linear_qk_rms_norm_rope": 0,
        "fp16x3_linear": 0,
        "flash_attention": 0,  # flash-attn-4's, for attention="fa4" only
        "anti_aliased_snake_beta": 0,  # the audio decoder's
    }
    # fp32 throughout; the kernels sum in another order (and use rsqrt.approx on the GPU): ~1e-7 relative
    # per op, a few 1e-6 at the output after the blocks amplify it.
    torch.testing.assert_close(out, eager, atol=2e-5, rtol=0)


def test_fused_fp16_matches_eager(layouts, latents):
    eager, _ = decode(layouts, latents, "fp16", False)
    out, launches = decode(layouts, latents, "fp16", True)
    assert launches["qk_rms_norm_rope"] == 2
    # The kernels reproduce eager's fp16 roundings; a norm may still land 1 ulp away where its fp32 value
    # sits on a rounding boundary, and the blocks carry that on. Allow 4 fp16 ulp at the output's scale.
    ulp = 2.0 ** (math.ceil(math.log2(eager.abs().max().item())) - 10)
    torch.testing.assert_close(out, eager, atol=4 * ulp, rtol=0)


def test_environment_selects_fused(layouts, monkeypatch):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "1")
    assert H3VideoDecoder.from_pretrained(layouts["original"], device="cpu").runtime.fused is True
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0")
    assert H3VideoDecoder.from_pretrained(layouts["original"], device="cpu").runtime.fused is False


def test_fused_without_triton_is_a_clear_error(layouts, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    with pytest.raises(ValueError, match="needs Triton"):
        H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", fused=True)
    assert H3VideoDecoder.from_pretrained(layouts["original"], device="cpu").runtime.fused is False


def test_fused_choice_is_made_once_per_model(layouts, latents, monkeypatch):
    """The kernels are chosen once per model (when its options are resolved, at load) and its ops made once per
    set of kernels and reused; the kernels' own contract checks run per launch, but the choice is not redone
    per call."""
    calls = []
    choose = fused.choose_kernels
    monkeypatch.setattr(fused, "choose_kernels", lambda *a: calls.append(a) or choose(*a))
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], device=DEVICE, dtype="fp32", fused=True)
    assert len(calls) == 1
    ops = decoder.ops()
    decoder.decode(latents[:, :, :1, :1])  # the choice is checked, not the output: one small tile
    assert len(calls) == 1 and decoder.ops() is ops
    decoder.configure(fused=False)
    assert decoder.ops() is EAGER_OPS
    decoder.configure(fused=True)
    assert decoder.ops() is ops, "kept per set of kernels: switching back makes no new ops"


def test_no_library_set_up_on_the_cpu(layouts):
    """The load's set-up thread is for CUDA only: on the CPU loading launches no kernel."""
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", dtype="fp32", fused=True)
    assert set(decoder.launch_counts().values()) == {0}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_library_set_up_runs_each_kernel_while_loading(layouts, latents, dtype, monkeypatch):
    """On CUDA each fused kernel is launched once while the weights load (Triton's one-time set-up moves
    off the first decode), the model keeps the ops selected there, and the output is the same as from a
    model whose set-up came with its first decode."""
    decoder = H3VideoDecoder.from_pretrained(
        layouts["original"], device="cuda", dtype=dtype, fused=True, gemm="cublas", attention="sdpa"
    )
    after = decoder.launch_counts()
    # quack's run for gemm="quack" only, flash-attn-4's for attention="fa4" only, the exact variants for
    # exact=True only, the audio decoder's never here
    exact = tuple(
        k.module
        for k in registry.KERNELS
        if k.exact and k.module and any(c.option is None and not c.exact for c in registry.candidates(k.op))
    )
    quack = (*fused.QUACK_KERNELS, *fused.FA4_KERNELS, *exact, "anti_aliased_snake_beta")
    assert after == {name: int(name not in quack) for name in after}
    ops = decoder.ops()
    assert all(getattr(ops, name) is not getattr(EAGER_OPS, name) for name in fused.FUSED_OPS)
    assert ops.attention is EAGER_OPS.attention, "SDPA unless attention='fa4'"
    # A decoder whose set-up came with its first decode (warm-up off) gives the same output.
    monkeypatch.setattr(fused, "warm_up", lambda *args: None)
    late = H3VideoDecoder.from_pretrained(
        layouts["original"], device="cuda", dtype=dtype, fused=True, gemm="cublas", attention="sdpa"
    )
    assert set(late.launch_counts().values()) == {0}
    assert torch.equal(decoder.decode(latents), late.decode(latents))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_failed_library_set_up_only_loses_the_head_start(layouts, latents, monkeypatch):
    """A set-up that raises leaves the load alone: the ops are chosen at the first decode instead, and the
    output is unchanged."""
    reference = H3VideoDecoder.from_pretrained(layouts["original"], device="cuda", dtype="fp16", fused=True)

    def broken(*args):
        raise RuntimeError("no head start today")

    monkeypatch.setattr(fused, "warm_up", broken)
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], device="cuda", dtype="fp16", fused=True)
    assert set(decoder.launch_counts().values()) == {0}, "the set-up launched nothing"
    assert torch.equal(decoder.decode(latents), reference.decode(latents))


def test_kernels_that_cannot_run_warn_once_and_run_eagerly(monkeypatch):
    """On the CPU without TRITON_INTERPRET no kernel can run: one warning names each, and every op is the
    eager one, so the decode still works."""
    from minimax_h3_vae import H3DecoderConfig

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    config = H3DecoderConfig(num_layers=1, num_heads=2)
    with pytest.warns(UserWarning) as caught:
        ops = fused.select_ops(config, torch.device("cpu"), torch.float32)
    assert len(caught) == 1
    message = str(caught[0].message)
    for kernel in ("rms_norm", "scale_add_rms_norm", "qk_rms_norm_rope", "silu_mul", "tf32x3_linear"):
        assert kernel in message
    assert "TRITON_INTERPRET" in message
    assert all(getattr(ops, name) is getattr(EAGER_OPS, name) for name in vars(EAGER_OPS))


def test_a_kernel_outside_its_contract_is_named():
    """A head size the QK kernel does not take (48: not a power of two) leaves only that op eager."""
    from minimax_h3_vae import H3DecoderConfig

    config = H3DecoderConfig(num_layers=1, num_heads=2, head_dim=48, rope_dim_ratio=0.5)
    with pytest.warns(UserWarning, match=r"qk_rms_norm_rope, qk_rms_norm_rope_exact \(head_dim must be a power of two"):
        ops = fused.select_ops(config, torch.device(DEVICE), torch.float16)
    assert ops.qk_rms_norm_rope is EAGER_OPS.qk_rms_norm_rope
    assert ops.rms_norm is not EAGER_OPS.rms_norm


# ---- the command's summary of what runs ----------------------------------------------------------------------------


@pytest.mark.usefixtures("eager_offline")
def test_the_commands_ops_line_names_what_runs(capsys, tmp_path, monkeypatch):
    """MINIMAX_H3_VAE_FUSED=1 where no kernel can run (the CPU without the Triton interpreter): the line says
    eager, as the decode runs, not fused."""
    from minimax_h3_vae import fused

    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "1")
    monkeypatch.setattr(fused, "choose_kernels", lambda *args: fused.EAGER_KERNELS)
    code, err = run_cli(capsys, small_latents(tmp_path), tmp_path / "o.safetensors")
    assert code == 0 and "eager ops" in err and "fused ops" not in err
