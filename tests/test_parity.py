"""Parity with the external oracle, diffusers 0.42.1 `AutoencoderKLMiniMaxH3`, in fp32 on the CPU: equal bit for bit.

Both sides compute the same fp32 function in the same op order, the release's (docs/decoder.md section 10): one
post_quant_conv per tile, the release's RoPE exponents, one tile per decoder call in diffusers and the same
per-tile arithmetic here whatever the grouping. So the outputs are equal, bit for bit; a wrong key mapping (q/k/v
head interleave, FFN halves), a dropped layer scale or one op rounded otherwise moves them by 1e-7 to 1. Two
videos decoded together are compared on one thread: with more, the CPU conv of diffusers' two-video batch rounds
otherwise than one video at a time, which is how this package decodes each video.
"""

from __future__ import annotations

import pytest
import torch

from minimax_h3_vae import H3VideoDecoder


def assert_equal(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert out.shape == expected.shape
    assert torch.equal(out, expected), f"max abs difference {(out - expected).abs().max().item():.3g}"


@pytest.fixture(scope="module")
def latents():
    """T = 13: three temporal chunks and a padded tail. 288 x 464 px: 2 x 3 tiles, and 464 px puts
    three tiles over some columns (overlaps 160 and 144)."""
    return torch.randn(1, 24, 13, 18, 29, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def oracle_output(oracle_vae, latents):
    with torch.no_grad():
        return oracle_vae.decode(latents).sample


def test_matches_diffusers(layouts, latents, oracle_output):
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", dtype=torch.float32)
    out = decoder.decode(latents)
    assert out.shape == oracle_output.shape == (1, 3, 43, 288, 464)
    assert out.dtype == torch.float32
    assert oracle_output.std() > 0.1, "the oracle output is degenerate; the comparison would prove nothing"
    assert_equal(out, oracle_output)


@pytest.mark.parametrize("where", ["diffusers", "comfyui", "repo root"])
def test_every_layout_decodes_as_diffusers(layouts, release_repo, oracle_vae, where):
    """The other layouts, and a repo root, load the original layout's config and its tensors bit for bit
    (test_loading.py), so the tiling and chunking above are theirs too: one tile of 3 frames checks the door."""
    z = torch.randn(1, 24, 3, 2, 3, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = oracle_vae.decode(z).sample
    path = release_repo if where == "repo root" else layouts[where]
    decoder = H3VideoDecoder.from_pretrained(path, device="cpu", dtype=torch.float32)
    assert decoder.config == H3VideoDecoder.from_pretrained(layouts["original"], device="cpu").config
    out = decoder.decode(z)
    assert out.shape == expected.shape == (1, 3, 9, 32, 48) and expected.std() > 0.1
    assert_equal(out, expected)


def test_every_block_contributes(layouts, latents, oracle_output):
    """The comparison is sensitive to the blocks: silencing one layer scale moves the output far from the
    reference (exact equality would also catch far less)."""
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu")
    with torch.no_grad():
        decoder.decoder.transformer_blocks[1].scale2.zero_()
    out = decoder.decode(latents[:, :, :3, :16, :16])
    with torch.no_grad():
        reference = decoder.__class__.from_pretrained(layouts["original"], device="cpu").decode(
            latents[:, :, :3, :16, :16]
        )
    assert (out - reference).abs().max() > 1e-2


@pytest.mark.parametrize("frames", [3, 4, 7, 8, 9, 12, 13])
def test_frame_geometry_matches_diffusers(oracle_vae, layouts, frames):
    """Every T >= 3 the oracle decodes: same frames, same values (one 32 x 48 px tile keeps it cheap)."""
    z = torch.randn(1, 24, frames, 2, 3, generator=torch.Generator().manual_seed(frames))
    with torch.no_grad():
        expected = oracle_vae.decode(z).sample
    assert_equal(H3VideoDecoder.from_pretrained(layouts["original"], device="cpu").decode(z), expected)


def test_batch_matches_diffusers(oracle_vae, layouts, one_thread):
    z = torch.randn(2, 24, 8, 17, 5, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = oracle_vae.decode(z).sample
    assert_equal(H3VideoDecoder.from_pretrained(layouts["diffusers"], device="cpu").decode(z), expected)
