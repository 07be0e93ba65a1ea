"""The fused path at decoder level: same output as eager, and proof that all three kernels ran.

On a machine without CUDA the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1),
so the sizes stay small: 2 tiles of 16 x 1 latents, 2 temporal chunks.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

from minimax_h3_vae import H3VideoDecoder, fused  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def latents():
    return torch.randn(1, 24, 8, 17, 1, generator=torch.Generator().manual_seed(3))


def decode(layouts, latents, dtype, is_fused):
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], device=DEVICE, dtype=dtype, fused=is_fused)
    assert decoder.config.fused is is_fused
    before = fused.launch_counts()
    out = decoder.decode(latents)
    after = fused.launch_counts()
    return out, {name: after[name] - before[name] for name in after}


def test_fused_fp32_matches_eager_and_runs_every_kernel(layouts, latents):
    eager, eager_launches = decode(layouts, latents, "fp32", False)
    out, launches = decode(layouts, latents, "fp32", True)
    assert set(eager_launches.values()) == {0}
    # 2 decoder calls (chunks) x (1 input norm, 2 layers x (2 residual adds, 1 qk-norm + rope, 1 gate),
    # and on CUDA 2 operand splits for proj_out's TF32 products).
    assert launches == {"rms_norm": 2, "scale_add_rms_norm": 8, "qk_rms_norm_rope": 4, "silu_mul": 4,
                        "tf32x3_linear": 4 if DEVICE == "cuda" else 0}
    # fp32 throughout; the kernels sum in another order (and use rsqrt.approx on the GPU): ~1e-7 relative
    # per op, a few 1e-6 at the output after the blocks amplify it.
    torch.testing.assert_close(out, eager, atol=2e-5, rtol=0)


def test_fused_fp16_matches_eager(layouts, latents):
    eager, _ = decode(layouts, latents, "fp16", False)
    out, launches = decode(layouts, latents, "fp16", True)
    assert launches["qk_rms_norm_rope"] == 4
    # The kernels reproduce eager's fp16 roundings; a norm may still land 1 ulp away where its fp32 value
    # sits on a rounding boundary, and the blocks carry that on. Allow 4 fp16 ulp at the output's scale.
    ulp = 2.0 ** (math.ceil(math.log2(eager.abs().max().item())) - 10)
    torch.testing.assert_close(out, eager, atol=4 * ulp, rtol=0)


def test_environment_selects_fused(layouts, monkeypatch):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "1")
    assert H3VideoDecoder.from_pretrained(layouts["original"], device="cpu").config.fused is True
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0")
    assert H3VideoDecoder.from_pretrained(layouts["original"], device="cpu").config.fused is False



def test_fused_without_triton_is_a_clear_error(layouts, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    with pytest.raises(ValueError, match="needs Triton"):
        H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", fused=True)
    assert H3VideoDecoder.from_pretrained(layouts["original"], device="cpu").config.fused is False
