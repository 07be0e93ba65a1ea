"""Decoder behaviour beyond the oracle: T = 1 and 2, streaming, batching, conventions, input checks."""

from __future__ import annotations

import pytest
import torch

from minimax_h3_vae import H3VideoDecoder, denormalize_latents, to_uint8_frames, to_unit_rgb

ATOL = 1e-4  # fp32 against fp32 with a different summation order; see test_parity.py


@pytest.fixture(scope="module")
def decoder(layouts):
    return H3VideoDecoder.from_pretrained(layouts["original"], device="cpu")


def latents(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_single_image_is_last_frame_of_the_one_frame_clip(decoder, oracle_vae):
    """T = 1: the release decodes the one latent frame (4 pixel frames) and keeps the last."""
    z = latents(1, 24, 1, 17, 3)
    out = decoder.decode(z)
    with torch.no_grad():
        clip = oracle_vae._decode_clip(z)
    assert out.shape == (1, 3, 1, 272, 48) and clip.shape[2] == 4
    torch.testing.assert_close(out, clip[:, :, -1:], atol=ATOL, rtol=0)


def test_two_frames_decode_as_three_with_last_repeated(decoder, oracle_vae):
    """T = 2 (no release output): 5 frames, those the two latents cover in the T = 3 decode."""
    z = latents(1, 24, 2, 2, 2)
    out = decoder.decode(z)
    with torch.no_grad():
        expected = oracle_vae.decode(torch.cat([z, z[:, :, -1:]], dim=2)).sample[:, :, :5]
    assert out.shape == (1, 3, 5, 32, 32)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("frames", [1, 3, 7, 8, 12, 17, 72])
def test_frame_counts(decoder, frames):
    expected = {1: 1, 3: 9, 7: 22, 8: 26, 12: 39, 17: 56, 72: 243}[frames]
    assert decoder.decode(latents(1, 24, frames, 1, 1)).shape == (1, 3, expected, 16, 16)


def test_stream_concatenates_to_decode(decoder):
    z = latents(1, 24, 13, 2, 3)
    chunks = list(decoder.decode_stream(z))
    assert [c.shape[2] for c in chunks] == [17, 17, 9], "one item per chunk, the padded tail cut"
    torch.testing.assert_close(torch.cat(chunks, dim=2), decoder.decode(z), atol=0, rtol=0)


def test_progress_counts_every_tile(decoder):
    calls = []
    decoder.decode(latents(2, 24, 8, 18, 2), progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (2 * 2 * 2, 2 * 2 * 2), "2 videos x 2 tiles x 2 chunks"
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_tile_batch_does_not_change_the_result(decoder):
    z = latents(1, 24, 3, 18, 20)
    reference = decoder.decode(z)
    decoder.configure(tile_batch=1)
    try:
        out = decoder.decode(z)
    finally:
        decoder.configure(tile_batch=None)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=0)


def test_batch_equals_one_by_one(decoder):
    z = latents(3, 24, 3, 17, 2)
    out = decoder.decode(z)
    for i in range(3):
        torch.testing.assert_close(out[i : i + 1], decoder.decode(z[i : i + 1]), atol=1e-5, rtol=0)


def test_runs_without_autograd(decoder):
    z = latents(1, 24, 3, 1, 1).requires_grad_()
    out = decoder.decode(z)
    assert not out.requires_grad


@pytest.mark.parametrize(
    "z, message",
    [
        (torch.zeros(1, 16, 3, 2, 2), "16 channels"),
        (torch.zeros(24, 3, 2, 2), "must be"),
        (torch.full((1, 24, 3, 2, 2), float("nan")), "NaN"),
        (torch.full((1, 24, 3, 2, 2), float("inf")), "NaN or Inf"),
        (torch.zeros(1, 24, 0, 2, 2), "empty"),
        (torch.zeros(1, 24, 3, 2, 2, dtype=torch.int64), "floating point"),
    ],
)
def test_bad_latents(decoder, z, message):
    with pytest.raises(ValueError, match=message):
        decoder.decode(z)


def test_denormalize_uses_checkpoint_statistics(decoder, oracle_vae):
    z = latents(1, 24, 3, 2, 2)
    mean = torch.tensor(oracle_vae.config.latents_mean).view(1, 24, 1, 1, 1)
    std = torch.tensor(oracle_vae.config.latents_std).view(1, 24, 1, 1, 1)
    torch.testing.assert_close(denormalize_latents(z, decoder.config), z * std + mean)


def test_output_conventions():
    video = torch.stack([torch.full((2, 4, 4), v) for v in (-3.0, 0.0, 10.0)])  # (3, F, H, W)
    rgb = to_unit_rgb(video)
    assert rgb[0].max() == 0.0 and rgb[2].min() == 1.0, "clamped to [0, 1]"
    assert rgb[1, 0, 0, 0].item() == pytest.approx(0.456), "zero maps to the ImageNet mean"
    frames = to_uint8_frames(video[None])
    assert frames.shape == (2, 4, 4, 3) and frames.dtype == torch.uint8 and frames.is_contiguous()
    assert frames[0, 0, 0].tolist() == [0, round(0.456 * 255), 255]


def test_fp16_recipe_close_to_fp32(layouts):
    """On the CPU, the release recipe (fp16 block linears) stays near the fp32 decode; the bound is loose
    (fp16 has 11 bits; random weights amplify) and only catches a broken recipe, not its quality."""
    z = latents(1, 24, 3, 2, 2)
    fp32 = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu").decode(z)
    fp16 = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", dtype="fp16").decode(z)
    assert fp16.dtype == torch.float32
    error = (fp16 - fp32).abs()
    assert 0 < error.max() < 0.05 and error.mean() < 5e-3


def test_fp32_post_quant_conv_is_torchs_conv_with_tf32_off_for_the_call(decoder, monkeypatch):
    """The fp32 recipe runs post_quant_conv as the release does, torch's conv3d, one tile per call, with TF32 off
    for that call alone (passed to the op): no process-wide switch is touched, and each call's output is
    F.conv3d's, bit for bit."""
    import torch.nn.functional as F

    real, calls = torch._convolution, []

    def spy(*args):
        calls.append(args)
        return real(*args)

    switches = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    monkeypatch.setattr(torch, "_convolution", spy)
    decoder.decode(latents(1, 24, 3, 34, 20))  # several tiles of one window
    monkeypatch.undo()
    assert len(calls) > 1 and all(args[0].shape[0] == 1 and args[0].dim() == 5 for args in calls)
    assert all(args[-1] is False for args in calls), "allow_tf32 must be False for the call"
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == switches
    z, weight, bias = calls[0][:3]
    assert torch.equal(real(*calls[0]), F.conv3d(z, weight, bias))
