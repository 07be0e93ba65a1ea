"""ComfyUI's single-file video VAE layout: one .safetensors file, the original key names (no key map),
float16 matrices, and no config: the released architecture, with the width, block count and latent channels
read off the tensor shapes and the latent statistics from its `latents_mean` / `latents_std` tensors."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from safetensors import safe_open

from ..config import ConfigError, H3DecoderConfig
from .checkpoint import DECODER_PREFIXES, Checkpoint
from .files import CheckpointError, headers, per_channel_stat


def open_comfyui(path: Path, origin: str) -> Checkpoint:
    """The checkpoint in the single file `path`."""
    where, shapes = headers([path], origin, DECODER_PREFIXES)

    def read_stat(name: str) -> tuple[float, ...]:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return tuple(handle.get_tensor(name).float().flatten().tolist())

    return Checkpoint("comfyui", comfyui_config(shapes, read_stat, origin), where, shapes, origin)


def comfyui_config(
    shapes: dict[str, tuple[int, ...]], read_stat: Callable[[str], tuple[float, ...]] | None, origin: str
) -> H3DecoderConfig:
    """The config of a checkpoint without one (a ComfyUI file, or the weights of a ComfyUI VAE in memory):
    the released architecture, with the width, block count and latent channels read off the tensor shapes
    and the latent statistics from its `latents_mean` / `latents_std` tensors when present (`read_stat`, flattened
    values; None: their shapes are checked and none is read): C values, as (C,) or with size-1 dims around
    them; any other shape is refused (`per_channel_stat`)."""
    if "decoder.x_embedder.weight" not in shapes:
        raise CheckpointError(
            f"{origin}: no decoder.x_embedder.weight: not a MiniMax-H3 video VAE in the original/ComfyUI layout"
        )
    if len(shapes["decoder.x_embedder.weight"]) != 2:
        raise CheckpointError(
            f"{origin}: decoder.x_embedder.weight has shape {list(shapes['decoder.x_embedder.weight'])}, "
            "expected 2-D (width, latent channels): not a MiniMax-H3 video VAE"
        )
    dim, latent_channels = shapes["decoder.x_embedder.weight"]
    blocks = {int(m.group(1)) for k in shapes if (m := re.match(r"decoder\.transformer_blocks\.(\d+)\.", k))}
    run = next(i for i in range(len(blocks) + 1) if i not in blocks)  # blocks 0 .. run - 1 are all there
    if run != len(blocks):  # checked before a config sizes anything by the largest index
        stray = sorted(b for b in blocks if b >= run)[:3]
        raise CheckpointError(
            f"{origin}: transformer_blocks {stray} do not follow on from blocks 0..{run - 1}: a damaged or foreign file"
        )
    default = H3DecoderConfig()
    settings = dict(latent_channels=latent_channels, num_layers=len(blocks), num_heads=dim // default.head_dim)
    present = [
        name for name in ("latents_mean", "latents_std") if per_channel_stat(shapes, name, latent_channels, origin)
    ]
    stats = {name: read_stat(name) for name in present} if read_stat is not None else {}
    try:
        return H3DecoderConfig(**settings, **stats)
    except ConfigError as error:
        raise CheckpointError(f"{origin}: {error}") from None
