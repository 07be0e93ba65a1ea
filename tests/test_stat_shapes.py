"""Latent statistics stored as tensors (ComfyUI files, ComfyUI's VAE): C values as (C,) or with size-1 dims
around them are read; any other shape is refused naming the shape expected, never replaced by the release's."""

from __future__ import annotations

import comfy_stand_in
import pytest
import torch
from safetensors.torch import load_file, save_file

from minimax_h3_vae import H3AudioDecoder, H3VideoDecoder
from minimax_h3_vae.checkpoints import CheckpointError
from minimax_h3_vae.comfyui.vae import decoder_for_vae, h3_state, structure
from minimax_h3_vae.runtime import DecodeOptions

# Shapes as functions of the channel count C, and their test ids.
READ = {"1,C,1": lambda c: (1, c, 1), "1,C,1,1,1": lambda c: (1, c, 1, 1, 1), "C,1": lambda c: (c, 1)}
REFUSED = {
    "2,C": lambda c: (2, c),
    "C+1": lambda c: (c + 1,),
    "1,C-1,1": lambda c: (1, c - 1, 1),
    "scalar": lambda c: (),
}


def _file_with_stats(tmp_path, source, shape) -> tuple[str, torch.Tensor, torch.Tensor]:
    """A copy of the single file `source` with its statistics reshaped (or replaced by zeros of a shape
    that holds other than one value per channel); the (C,) values it holds."""
    tensors = load_file(str(source))
    mean, std = tensors["latents_mean"], tensors["latents_std"]
    channels = mean.numel()
    for name, values in (("latents_mean", mean), ("latents_std", std)):
        size = torch.Size(shape(channels)).numel()
        tensors[name] = values.reshape(shape(channels)) if size == channels else torch.ones(shape(channels))
    path = tmp_path / "stats.safetensors"
    save_file(tensors, str(path))
    return str(path), mean, std


def _load(kind, path):
    if kind == "video":
        return H3VideoDecoder.from_pretrained(path, device="cpu", fused=False)
    return H3AudioDecoder.from_pretrained(path, device="cpu", fused=False)


@pytest.mark.parametrize("kind", ["video", "audio"])
@pytest.mark.parametrize("shape", READ.values(), ids=READ)
def test_single_file_stats_with_size_one_dims_are_read(kind, shape, tmp_path, layouts, audio_layouts):
    source = layouts["comfyui"] if kind == "video" else audio_layouts["comfyui"]
    path, mean, std = _file_with_stats(tmp_path, source, shape)
    config = _load(kind, path).config
    dtype = torch.float64 if kind == "audio" else torch.float32
    assert torch.equal(torch.tensor(config.latents_mean, dtype=dtype), mean.to(dtype))
    assert torch.equal(torch.tensor(config.latents_std, dtype=dtype), std.to(dtype))


@pytest.mark.parametrize("kind", ["video", "audio"])
@pytest.mark.parametrize("shape", REFUSED.values(), ids=REFUSED)
def test_single_file_stats_of_another_shape_are_refused(kind, shape, tmp_path, layouts, audio_layouts):
    source = layouts["comfyui"] if kind == "video" else audio_layouts["comfyui"]
    path, mean, _ = _file_with_stats(tmp_path, source, shape)
    with pytest.raises(CheckpointError) as caught:
        _load(kind, path)
    message = str(caught.value)
    assert f"latents_mean has shape {list(shape(mean.numel()))}, expected [{mean.numel()}]" in message
    assert "\n" not in message and "Error" not in message


def _vae_with_stats(shape):
    """The tiny ComfyUI VAE with statistics of their own, reshaped (or ones of a shape that holds other than
    one value per channel)."""
    vae = comfy_stand_in.tiny_vae()
    stage = vae.first_stage_model
    channels = stage.latents_mean.numel()
    for name in ("latents_mean", "latents_std"):
        values = getattr(stage, name) + 0.25  # not the release's (the tiny checkpoint holds those)
        size = torch.Size(shape(channels)).numel()
        setattr(stage, name, values.reshape(shape(channels)) if size == channels else torch.ones(shape(channels)))
    return vae


@pytest.mark.parametrize("shape", READ.values(), ids=READ)
def test_a_comfyui_vaes_stats_with_size_one_dims_are_read(shape):
    vae = _vae_with_stats(shape)
    stage = vae.first_stage_model
    decoder = decoder_for_vae(vae, DecodeOptions(device="cpu", fused=False))
    assert torch.equal(torch.tensor(decoder.config.latents_mean), stage.latents_mean.flatten().float())
    assert torch.equal(torch.tensor(decoder.config.latents_std), stage.latents_std.flatten().float())


@pytest.mark.parametrize("shape", REFUSED.values(), ids=REFUSED)
def test_a_comfyui_vaes_stats_of_another_shape_are_refused(shape):
    vae = _vae_with_stats(shape)
    channels = 24
    with pytest.raises(ValueError, match=rf"latents_mean has shape \[[0-9, ]*\], expected \[{channels}\]"):
        structure(h3_state(vae))
