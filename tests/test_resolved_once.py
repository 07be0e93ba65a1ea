"""Each run setting is decided once, by `resolve`: the options are plain data, the runtime names the kernel of
every op, nothing reads the environment after it, and each decoder counts its own kernel launches."""

from __future__ import annotations

import pytest
import torch

from minimax_h3_vae import DecodeOptions, H3DecoderConfig, H3VideoDecoder, fused
from minimax_h3_vae.runtime import resolve

pytest.importorskip("triton")

CONFIG = H3DecoderConfig(num_layers=1, num_heads=2)


def latents() -> torch.Tensor:
    """One latent: the fewest rows that still launch the kernels (in Triton's interpreter on the CPU)."""
    return torch.randn(1, 24, 1, 1, 1, generator=torch.Generator().manual_seed(0))


def test_options_are_plain_data():
    """Made, they probe no machine: a device this machine lacks, or the automatic choices, are resolve's."""
    options = DecodeOptions(device="cuda:7", fused=None, gemm="auto", attention="auto")
    assert (options.device, options.dtype, options.fused) == (torch.device("cuda:7"), None, None)
    assert (options.gemm, options.attention) == ("auto", "auto")
    if torch.cuda.device_count() < 8:
        with pytest.raises(ValueError, match="cuda:7"):
            resolve(options, CONFIG)


@pytest.mark.skipif(not fused.interpreting(), reason="CPU runs need TRITON_INTERPRET=1")
def test_the_runtime_names_the_kernel_of_every_op():
    on = resolve(DecodeOptions(device="cpu", fused=True), CONFIG)
    assert on.kernels == fused.Kernels(
        rms_norm="triton",
        scale_add_rms_norm="triton",
        qk_rms_norm_rope="triton",
        silu_mul="triton",
        linear_silu_mul="cublas+triton",
        linear_qk_rms_norm_rope="cublas+triton",
        attention="sdpa",
        linear_fp32="tf32x3",
    )
    assert resolve(DecodeOptions(device="cpu", fused=False), CONFIG).kernels == fused.EAGER_KERNELS


@pytest.mark.skipif(not fused.interpreting(), reason="CPU runs need TRITON_INTERPRET=1")
def test_nothing_reads_the_environment_after_resolve(layouts, monkeypatch):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "1")
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", dtype="fp32")
    kernels = decoder.runtime.kernels
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0")
    decoder.decode(latents())
    assert decoder.runtime.fused is True and decoder.runtime.kernels == kernels
    assert decoder.launch_counts()["rms_norm"] > 0


@pytest.mark.skipif(not fused.interpreting(), reason="CPU runs need TRITON_INTERPRET=1")
def test_each_decoder_counts_its_own_launches(layouts):
    a = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", dtype="fp32", fused=True)
    b = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", dtype="fp32", fused=True)
    a.decode(latents())
    assert a.launch_counts()["rms_norm"] > 0 and set(b.launch_counts().values()) == {0}
    assert list(a.launch_counts()) == list(fused.LAUNCH_NAMES)
