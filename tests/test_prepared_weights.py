"""Derived weights are made once per model, not per call: fp16x3's split of the proj_out weight is kept in the
model's ops (and made again only when the weight is written), with the same values a split per call gives; a
decoder on the quack projection stores w_qkv in the GEMM's row order from its load, and gives the release's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minimax_h3_vae import H3VideoDecoder, Runtime, fused
from minimax_h3_vae.fused import interpreting
from minimax_h3_vae.fused.fp16x3_linear import split_rows, split_weight
from minimax_h3_vae.fused.linear_qk_rms_norm_rope import kernel_rows

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not interpreting(), reason="CPU runs need TRITON_INTERPRET=1")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


@pytest.mark.parametrize("device", DEVICES)
def test_the_weight_split_is_made_once_and_again_after_a_write(device):
    weight = torch.randn(24, 40, generator=torch.Generator().manual_seed(0)).to(device)
    weights = {}
    first = split_weight(weight, weights)
    assert split_weight(weight, weights) is first, "kept: not split again per call"
    assert all(torch.equal(a, b) for a, b in zip(first, split_rows(weight, lo_segment=1))), "the same values"
    weight.mul_(3.0)
    again = split_weight(weight, weights)
    assert again is not first and all(torch.equal(a, b) for a, b in zip(again, split_rows(weight, lo_segment=1)))
    assert len(weights) == 1, "one proj_out per model"
    assert split_weight(weight, None) is not split_weight(weight, None), "without a cache nothing is kept"


def test_each_models_ops_keep_their_own_state():
    """The rotation tables and the weight split belong to one model's ops: two models never share them."""
    kernels = fused.Kernels(linear_qk_rms_norm_rope="quack", linear_fp32="fp16x3")
    a, b = fused.ops_for(kernels), fused.ops_for(kernels)
    assert a.linear_qk_rms_norm_rope.keywords["tables"] is not b.linear_qk_rms_norm_rope.keywords["tables"]
    assert a.linear_fp32.keywords["weights"] is not b.linear_fp32.keywords["weights"]
    launches = {}
    c = fused.ops_for(kernels, launches)
    assert c.linear_fp32.keywords["launches"] is launches is c.linear_qk_rms_norm_rope.keywords["launches"]


# ---- w_qkv in the quack projection's row order, from the load -------------------------------------------------


def quack_ordered(runtime: Runtime) -> Runtime:
    """`runtime` as resolve makes it where the quack projection runs (its kernels say so)."""
    return dataclasses.replace(runtime, fused=True, kernels=fused.Kernels(linear_qk_rms_norm_rope="quack"))


def load(model: H3VideoDecoder, state: dict) -> H3VideoDecoder:
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


@pytest.mark.parametrize("offload", ["none", "blocks"])
def test_a_quack_decoder_stores_qkv_in_the_kernels_order_and_gives_the_releases(layouts, offload):
    """A decoder whose projection runs on quack holds every block's w_qkv and bias in the GEMM's row order
    (`kernel_rows`: nothing is gathered per call), while `state_dict()` gives, and `load_state_dict()` takes, the
    release's order; run without quack (fused=False) it gathers the release's rows back and decodes exactly as
    a decoder in the release's order does."""
    plain = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", fused=False, offload=offload)
    release = plain.state_dict()
    with torch.device("meta"):
        model = H3VideoDecoder(plain.config, quack_ordered(plain.runtime))
    c = plain.config
    rows = kernel_rows(c.num_heads, c.head_dim, c.rope_dim)
    assert torch.equal(model.qkv_rows, rows) and not torch.equal(rows, torch.arange(len(rows)))
    load(model, dict(release))
    for i, block in enumerate(model.decoder.transformer_blocks):
        key = f"decoder.transformer_blocks.{i}.attn.to_qkv"
        assert torch.equal(block.attn.to_qkv.weight, release[f"{key}.weight"][rows]), "stored in the kernel's order"
        assert torch.equal(block.attn.to_qkv.bias, release[f"{key}.bias"][rows])
    again = model.state_dict()
    assert again.keys() == release.keys() and all(torch.equal(again[k], release[k]) for k in release)
    model.configure(fused=False)
    z = torch.randn(1, c.latent_channels, 2, 3, 4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(model.decode(z), plain.decode(z)), "the eager path sees the release's rows"


def test_a_decoder_in_the_releases_order_stores_it_as_loaded(layouts):
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", fused=False)
    assert decoder.qkv_rows is None
    assert fused.qkv_rows(decoder.runtime.kernels, decoder.config) is None


HOPPER_QUACK = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and fused.quack_installed()


@pytest.mark.skipif(not HOPPER_QUACK, reason="needs a Hopper GPU with the hopper extra")
def test_the_quack_projection_takes_the_stored_rows_as_they_are(layouts):
    """Loaded for quack's projection (gemm="quack", exact=False): w_qkv is stored in the GEMM's order and the
    launcher is told so (it gathers nothing); the decoder's output is bit for bit the launcher's own per-call
    gathering of the release's rows, and switched to the eager path it decodes as an eager decoder does."""
    decoder = H3VideoDecoder.from_pretrained(
        layouts["original"], device="cuda", dtype="fp16", gemm="quack", exact=False
    )
    assert decoder.runtime.kernels.linear_qk_rms_norm_rope == "quack" and decoder.qkv_rows is not None
    assert decoder.ops().linear_qk_rms_norm_rope.keywords["ordered"] is True
    with torch.device("meta"):
        ordinary = H3VideoDecoder(decoder.config)  # built directly: the release's order
    load(ordinary, decoder.state_dict())
    assert ordinary.qkv_rows is None
    gathering = fused.ops_for(decoder.runtime.kernels)  # the same kernels, given the release's rows per call
    assert gathering.linear_qk_rms_norm_rope.keywords["ordered"] is False
    tiles = torch.randn(2, decoder.config.latent_channels, 2, 3, 4, device="cuda")
    with torch.inference_mode():
        assert torch.equal(decoder(tiles, decoder.ops()), ordinary(tiles, gathering)), "the same GEMM, the same bits"
    eager = H3VideoDecoder.from_pretrained(layouts["original"], device="cuda", dtype="fp16", fused=False)
    z = torch.randn(1, decoder.config.latent_channels, 2, 3, 4, device="cuda")
    assert torch.equal(decoder.configure(fused=False).decode(z), eager.decode(z))
