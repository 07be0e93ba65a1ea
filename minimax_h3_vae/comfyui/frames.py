"""Decoding into ComfyUI's frames: its VAE decode contract (frames in [0, 1], into an output buffer) and its IMAGE
layout, one temporal chunk of output on the GPU at a time."""

from __future__ import annotations

import torch

from ..decoding import H3VideoDecoder
from ..frames import NON_FINITE_FRAMES, to_unit_rgb
from ..latents import check_latents, denormalize_latents
from ..tiling import plan_chunks
from .host import progress_bar
from .inputs import describe

# Floating-point dtypes an output buffer may have: ComfyUI preallocates it in its intermediate dtype.
BUFFER_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def decode_into(
    model: H3VideoDecoder,
    z: torch.Tensor,
    tile_batch: int | None,
    output_buffer: torch.Tensor | None = None,
    progress=None,
    channels_last: bool = False,
) -> torch.Tensor:
    """ComfyUI's decode contract: normalised latents (B, 24, T, h, w), any float dtype -> float32 frames
    (B, 3, F, 16h, 16w) in [0, 1], written chunk by chunk into `output_buffer` (a floating-point tensor of
    that shape on any device with data, any strides) when given, else into a new CPU tensor (with
    `channels_last`, a (B, 3, F, H, W) view of a contiguous (B, F, H, W, 3) one: ComfyUI's IMAGE layout).
    Frames holding NaN or Inf are a ValueError, as they are to the command. progress(done, total) as in
    `decode_stream`."""
    c = model.config
    if not isinstance(z, torch.Tensor):
        raise ValueError(f"latents must be a (B, {c.latent_channels}, T, h, w) tensor, got {describe(z)}")
    check_latents(z, c.latent_channels)
    z = denormalize_latents(z.float().to(model.device), c)
    batch, _, latent_frames, height, width = z.shape
    shape = (
        batch,
        c.out_channels,
        plan_chunks(latent_frames, c).out_frames,
        height * c.patch_size,
        width * c.patch_size,
    )
    if output_buffer is None and channels_last:
        output_buffer = torch.empty(shape[0], *shape[2:], shape[1]).permute(0, 4, 1, 2, 3)
    elif output_buffer is None:
        output_buffer = torch.empty(shape)
    elif not isinstance(output_buffer, torch.Tensor) or output_buffer.dtype not in BUFFER_DTYPES:
        got = output_buffer.dtype if isinstance(output_buffer, torch.Tensor) else describe(output_buffer)
        raise ValueError(f"output_buffer must be a float32 (or float16 / bfloat16) tensor, got {got}")
    elif output_buffer.is_meta:
        raise ValueError("output_buffer is on the meta device and holds no data: give a buffer on 'cpu' or 'cuda'")
    elif tuple(output_buffer.shape) != shape:
        raise ValueError(f"output_buffer is {tuple(output_buffer.shape)}, the decode gives {shape}")
    start = 0
    for chunk in model.decode_stream(z, progress, tile_batch=tile_batch):
        if not torch.isfinite(chunk).all():
            raise ValueError(f"MiniMax-H3 decode: {NON_FINITE_FRAMES}")
        count = chunk.shape[2]
        output_buffer[:, :, start : start + count].copy_(to_unit_rgb(chunk))
        start += count
    return output_buffer


def decode_to_images(model: H3VideoDecoder, z: torch.Tensor, tile_batch: int | None) -> torch.Tensor:
    """Normalised latents (B, 24, T, h, w) -> IMAGE (B * F, 16h, 16w, 3) float32 in [0, 1] on the CPU, video
    b's frames at [b * F, (b + 1) * F): `decode_into` one preallocated CPU tensor in ComfyUI's layout, so GPU
    memory holds one temporal chunk of output at a time; ComfyUI's progress bar follows the tiles."""
    video = decode_into(model, z, tile_batch, progress=progress_bar(), channels_last=True)
    return video.permute(0, 2, 3, 4, 1).flatten(0, 1)  # a view: the buffer is (B, F, H, W, 3) already
