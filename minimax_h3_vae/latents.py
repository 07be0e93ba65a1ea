"""The decoder's input: checking latents and undoing the pipeline's per-channel normalisation."""

from __future__ import annotations

import torch

from .config import H3DecoderConfig


def check_latents(z: torch.Tensor, channels: int | None) -> None:
    """Raise ValueError naming the problem for latents the decoder cannot take.

    z: (B, C, T, h, w); `channels`: the decoder's C, or None to leave the channel count unchecked.
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
    if not z.is_floating_point():
        raise ValueError(f"latents must be floating point, got {z.dtype}")
    if not torch.isfinite(z).all():
        raise ValueError("latents contain NaN or Inf")


def denormalize_latents(z: torch.Tensor, config: H3DecoderConfig) -> torch.Tensor:
    """Pipeline latents -> decoder input: `z * latents_std + latents_mean`, per channel (dim 1), float32."""
    shape = (1, -1) + (1,) * (z.ndim - 2)
    mean = torch.tensor(config.latents_mean, dtype=torch.float32, device=z.device).view(shape)
    std = torch.tensor(config.latents_std, dtype=torch.float32, device=z.device).view(shape)
    return z.float() * std + mean
