"""The decoder's input: checking latents, undoing the pipeline's per-channel normalisation, saving them for
the command line."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from .config import H3DecoderConfig

# Floating-point dtypes the decoder computes from (it upcasts to float32); float8 and complex are refused.
LATENT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_dtype(dtype: torch.dtype) -> None:
    """Raise ValueError for a latent dtype the decoder does not take."""
    if dtype not in LATENT_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in LATENT_DTYPES)
        raise ValueError(f"latents must be floating point ({names}), got {str(dtype).removeprefix('torch.')}")


def check_latents(z: torch.Tensor, channels: int | None) -> None:
    """Raise ValueError naming the problem for latents the decoder cannot take.

    z: (B, C, T, h, w), float32/float16/bfloat16/float64, on a device that holds data (not `meta`);
    `channels`: the decoder's C, or None to leave the channel count unchecked.
    """
    layout = f"(B, {channels or 'C'}, T, h, w)"
    if not isinstance(z, torch.Tensor):
        raise ValueError(f"latents must be a torch.Tensor, got {type(z).__name__}")
    if z.ndim != 5:
        raise ValueError(f"latents must be {layout}, got shape {tuple(z.shape)}")
    if channels is not None and z.shape[1] != channels:
        raise ValueError(
            f"latents have {z.shape[1]} channels, the decoder takes {channels} "
            f"(shape {tuple(z.shape)}; expected {layout})"
        )
    if min(z.shape) == 0:
        raise ValueError(f"latents are empty: shape {tuple(z.shape)}")
    check_dtype(z.dtype)
    if z.is_meta:
        raise ValueError("latents are on the meta device and hold no values; move real latents to 'cpu' or 'cuda'")
    if not torch.isfinite(z).all():
        raise ValueError("latents contain NaN or Inf")


def denormalize_latents(z: torch.Tensor, config: H3DecoderConfig) -> torch.Tensor:
    """Pipeline latents -> decoder input: `z * latents_std + latents_mean` per channel, float32.

    z: (B, C, T, h, w) or (C, T, h, w), C = config.latent_channels: the channel axis is dim 1 of a 5-D
    tensor and dim 0 of a 4-D one; any other layout is a ValueError (it is never broadcast on a guess).
    Raises ValueError when finite latents overflow float32 here (they are then not normalised latents).
    """
    if not isinstance(z, torch.Tensor) or z.ndim not in (4, 5):
        shape = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        raise ValueError(f"denormalize_latents takes (B, C, T, h, w) or (C, T, h, w) latents, got {shape}")
    axis = z.ndim - 4
    channels = config.latent_channels
    if z.shape[axis] != channels:
        raise ValueError(
            f"latents {tuple(z.shape)} have {z.shape[axis]} channels on dim {axis}, the checkpoint's statistics "
            f"{channels}: expected (B, {channels}, T, h, w) or ({channels}, T, h, w)"
        )
    check_dtype(z.dtype)
    shape = (-1, 1, 1, 1)
    mean = torch.tensor(config.latents_mean, dtype=torch.float32, device=z.device).view(shape)
    std = torch.tensor(config.latents_std, dtype=torch.float32, device=z.device).view(shape)
    out = z.float() * std + mean
    if not z.is_meta and not torch.isfinite(out).all() and torch.isfinite(z).all():
        raise ValueError(
            f"latents overflow float32 when denormalised (largest |z| is {z.abs().max().item():.3g}): they are not "
            "normalised pipeline latents; if they are already denormalised, pass them as they are (--raw-latents)"
        )
    return out


def save_latents(path: str | os.PathLike, latents: torch.Tensor, fps: float | None = None) -> Path:
    """Write a pipeline's normalised latents where `minimax-h3-decode` reads them: a `.safetensors` file with the
    tensor `latents` ((24, T, h, w) or (1, 24, T, h, w), saved float32 on the CPU) and `fps` in its metadata.
    Returns the path written."""
    shape = tuple(latents.shape) if isinstance(latents, torch.Tensor) else None
    if shape is None or len(shape) not in (4, 5) or (len(shape) == 5 and shape[0] != 1):
        raise ValueError(f"save_latents writes one video, (C, T, h, w) or (1, C, T, h, w); got shape {shape}")
    check_latents(latents.reshape(1, *shape[-4:]), channels=None)
    metadata = None
    if fps is not None:
        if isinstance(fps, bool) or not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
            raise ValueError(f"fps must be a positive number, got {fps!r}")
        metadata = {"fps": repr(float(fps))}
    path = Path(os.fspath(path))
    save_file({"latents": latents.detach().float().cpu().contiguous()}, str(path), metadata=metadata)
    return path
