"""The library helpers take exactly their documented layouts and refuse others with a ValueError that says
which: never a broadcast on the wrong axis."""

from __future__ import annotations

import pytest
import torch
from repo import TINY

from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder, denormalize_latents, to_uint8_frames, to_unit_rgb

CONFIG = H3DecoderConfig()


def reference(z: torch.Tensor, axis: int) -> torch.Tensor:
    shape = [1] * z.ndim
    shape[axis] = -1
    std = torch.tensor(CONFIG.latents_std).view(shape)
    return z.float() * std + torch.tensor(CONFIG.latents_mean).view(shape)


@pytest.mark.parametrize("frames", [3, 24])  # T == 24 == C: a wrong axis would go unnoticed by broadcasting
def test_denormalize_both_layouts(frames):
    z = torch.randn(24, frames, 2, 3, generator=torch.Generator().manual_seed(frames))
    assert torch.equal(denormalize_latents(z, CONFIG), reference(z, 0))
    assert torch.equal(denormalize_latents(z[None], CONFIG), reference(z[None], 1))
    assert torch.equal(denormalize_latents(z[None], CONFIG)[0], denormalize_latents(z, CONFIG))


@pytest.mark.parametrize(
    "shape", [(24, 2, 2), (1, 1, 24, 3, 2, 2), (3, 24, 2, 2), (1, 16, 24, 2, 2), (2, 24, 3, 2, 2, 1), (24,)]
)
def test_denormalize_rejects_other_layouts(shape):
    with pytest.raises(ValueError, match=r"\(B, C, T, h, w\) or \(C, T, h, w\)|channels"):
        denormalize_latents(torch.zeros(shape), CONFIG)


def test_denormalize_rejects_float8_and_overflow():
    with pytest.raises(ValueError, match="floating point"):
        denormalize_latents(torch.zeros(24, 3, 2, 2).to(torch.float8_e4m3fn), CONFIG)
    with pytest.raises(ValueError, match="overflow"):
        denormalize_latents(torch.full((24, 3, 2, 2), 3e38), CONFIG)


@pytest.mark.parametrize("shape", [(3, 2, 2), (1, 4, 2, 2, 2), (4, 2, 2, 2), (1, 1, 3, 2, 2, 2)])
def test_output_helpers_reject_other_layouts(shape):
    for helper in (to_unit_rgb, to_uint8_frames):
        with pytest.raises(ValueError, match=r"\(B, 3, F, H, W\) or \(3, F, H, W\)"):
            helper(torch.zeros(shape))


def test_output_helpers_reject_integer_frames():
    for helper in (to_unit_rgb, to_uint8_frames):
        with pytest.raises(ValueError, match="floating-point"):
            helper(torch.zeros(3, 2, 2, 2, dtype=torch.uint8))


@pytest.fixture(scope="module")
def tiny():
    return H3VideoDecoder.from_pretrained(TINY, device="cpu", fused=False)


def test_decode_rejects_meta_latents(tiny):
    with pytest.raises(ValueError, match="meta device"):
        tiny.decode(torch.empty(1, 24, 3, 2, 2, device="meta"))


def test_decode_rejects_float8_latents(tiny):
    with pytest.raises(ValueError, match="floating point"):
        tiny.decode(torch.zeros(1, 24, 3, 2, 2).to(torch.float8_e4m3fn))


def test_decode_refuses_one_video_without_its_batch_dimension_and_says_how_to_add_it(tiny):
    """(24, T, h, w), which denormalize_latents, save_latents and the command take, is refused by decode, whose
    output always has the batch axis (B, 3, F, H, W): the message gives the fix."""
    z = torch.zeros(24, 3, 2, 2)
    with pytest.raises(ValueError, match=r"add the batch dimension: z\[None\] / z\.unsqueeze\(0\)"):
        tiny.decode(z)
    with pytest.raises(ValueError, match=r"add the batch dimension"):
        next(tiny.decode_stream(z))
    assert tiny.decode(z[None]).shape == (1, 3, 9, 32, 32)


@pytest.mark.parametrize("value", [0, 1.5])
def test_tile_batch_through_the_api(value, tiny):
    """Already validated by Runtime (tests/test_runtime.py); pinned here as part of the issue's list."""
    with pytest.raises(ValueError, match="tile_batch"):
        H3VideoDecoder.from_pretrained(TINY, device="cpu", tile_batch=value)
    with pytest.raises(ValueError, match="tile_batch"):
        tiny.configure(tile_batch=value)
