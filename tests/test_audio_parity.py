"""Our float32 audio decode against diffusers' AutoencoderKLMiniMaxH3Audio on the CPU: bit for bit, from every
layout.

The same float32 ops run in the same order on the same values: the weight norm folded with torch's own
`torch._weight_norm` (what diffusers' hook computes before every conv), the same convolutions (TF32 plays no
part on the CPU), the same pad / transposed conv / SnakeBeta / strided conv sequence, the same sums in the same
order (`(b0 + b1) + b2`, then `/ 3`). So equality is exact, not within a tolerance.
"""

from __future__ import annotations

import pytest
import torch
from audio_checkpoints import OTHER_GEOMETRY, diffusers_waveform, random_diffusers_audio_vae, write_diffusers

from minimax_h3_vae import H3AudioDecoder

LAYOUTS = ("original", "diffusers", "comfyui")


def latents(vae, frames: int, seed: int = 1) -> torch.Tensor:
    """Normalised (2, channels, frames) audio latents, as the H3 pipeline hands them over."""
    return torch.randn(2, vae.config.latent_channels, frames, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_equals_diffusers_bit_for_bit(audio_layouts, audio_oracle, layout):
    decoder = H3AudioDecoder.from_pretrained(audio_layouts[layout], device="cpu", fused=False)
    z = latents(audio_oracle, 5)
    got = decoder.decode(z)
    expected = diffusers_waveform(audio_oracle, z)
    assert got.shape == (2, 5 * 800) and got.dtype == torch.float32
    assert torch.equal(got, expected)
    # Not a clamped constant: the test weights spread the samples over (-1, 1).
    assert got.std() > 0.1 and (got.abs() < 1).float().mean() > 0.95


def test_a_geometry_unlike_the_release_follows_the_diffusers_config(tmp_path):
    """Every decoder field of diffusers' config is honoured (rates, kernels, AMP kernels and dilations, widths),
    none assumed to be the release's."""
    vae = random_diffusers_audio_vae(seed=3, **OTHER_GEOMETRY)
    decoder = H3AudioDecoder.from_pretrained(write_diffusers(tmp_path / "audio_vae", vae), device="cpu", fused=False)
    assert decoder.hop_length == 6 and decoder.sample_rate == 12000
    z = latents(vae, 7, seed=4)
    got = decoder.decode(z)
    assert got.shape == (2, 42) and torch.equal(got, diffusers_waveform(vae, z))


def test_one_latent_and_one_channel(audio_layouts, audio_oracle):
    """The shortest input (one latent: every activation then runs on rows of 5 to 800 samples, where the
    replicate padding reaches across the whole row) and a mono batch."""
    decoder = H3AudioDecoder.from_pretrained(audio_layouts["original"], device="cpu", fused=False)
    z = latents(audio_oracle, 1, seed=5)[:1]
    assert torch.equal(decoder.decode(z), diffusers_waveform(audio_oracle, z))


def test_the_pipeline_stereo_layout(audio_layouts, audio_oracle):
    """diffusers' H3 decode step returns (1, 2, samples) from (2, 32, N): `decode` gives the same samples as
    (2, samples), channel 0 (left) first."""
    decoder = H3AudioDecoder.from_pretrained(audio_layouts["diffusers"], device="cpu", fused=False)
    z = latents(audio_oracle, 3, seed=6)
    both = decoder.decode(z)
    pipeline = diffusers_waveform(audio_oracle, z).unsqueeze(1).permute(1, 0, 2)  # the pipeline's (1, 2, samples)
    assert torch.equal(both, pipeline[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_decode_equals_diffusers_with_tf32_off(audio_layouts, audio_oracle):
    """On CUDA our eager convolutions pass TF32 off per call; diffusers' follow the process-wide switch, off here.
    cuDNN's deterministic mode (which our convolutions read) keeps both from atomics-based algorithms, so the
    same algorithms on the same values give the same bits."""
    decoder = H3AudioDecoder.from_pretrained(audio_layouts["diffusers"], device="cuda", fused=False)
    from diffusers import AutoencoderKLMiniMaxH3Audio

    # diffusers' own load of the layout it wrote (a deepcopy of a weight-normed module that ran fails)
    vae = AutoencoderKLMiniMaxH3Audio.from_pretrained(audio_layouts["diffusers"]).to("cuda").eval()
    z = latents(audio_oracle, 9, seed=7).cuda()
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=False):
        expected = diffusers_waveform(vae, z)
        got = decoder.decode(z)
    assert torch.equal(got, expected)
