"""diffusers' video VAE layout: `vae/{config.json, diffusion_pytorch_model-0000N-of-0000M.safetensors,
*.index.json}` (or one weights file), float32, renamed keys: q/k/v split out of the fused projection and the
FFN halves swapped (`KEY_TABLE`)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError, H3DecoderConfig
from ..tiling import check_temporal_plan
from .checkpoint import DECODER_PREFIXES, Checkpoint
from .files import CheckpointError, diffusers_weights, expect, expect_object, fields, headers, read_json

SUBFOLDER = "vae"
CLASS_NAME = "AutoencoderKLMiniMaxH3"


def _interleave_heads(parts: list[torch.Tensor], head_dim: int) -> torch.Tensor:
    """diffusers' all-q, all-k, all-v rows -> the release's per-head [q_h, k_h, v_h] rows."""
    q, k, v = (p.unflatten(0, (-1, head_dim)) for p in parts)
    return torch.stack([q, k, v], dim=1).flatten(0, 2)


def _swap_halves(parts: list[torch.Tensor], head_dim: int) -> torch.Tensor:
    """diffusers' [value; gate] FFN input rows -> the release's [gate; value]."""
    value, gate = parts[0].chunk(2, dim=0)
    return torch.cat([gate, value], dim=0)


# original key pattern -> (diffusers key patterns, how the diffusers tensors combine into the original one).
# Keys that match no row have the same name in both layouts and are copied as they are.
_BLOCK = r"(decoder\.transformer_blocks\.\d+)"
KEY_TABLE: tuple[tuple[str, tuple[str, ...], Callable | None], ...] = (
    (r"decoder\.x_embedder\.(weight|bias)", (r"decoder.proj_in.\1",), None),
    (
        _BLOCK + r"\.attn\.to_qkv\.(weight|bias)",
        (r"\1.attn.to_q.\2", r"\1.attn.to_k.\2", r"\1.attn.to_v.\2"),
        _interleave_heads,
    ),
    (_BLOCK + r"\.attn\.to_out\.(weight|bias)", (r"\1.attn.to_out.0.\2",), None),
    (_BLOCK + r"\.ff\.w1\.(weight|bias)", (r"\1.ff.net.0.proj.\2",), _swap_halves),
    (_BLOCK + r"\.ff\.w2\.(weight|bias)", (r"\1.ff.net.2.\2",), None),
)


def diffusers_sources(key: str) -> tuple[tuple[str, ...], Callable | None]:
    """The diffusers key(s) an original key is made from, and the combining function (None: copy)."""
    for pattern, sources, combine in KEY_TABLE:
        match = re.fullmatch(pattern, key)
        if match:
            return tuple(match.expand(s) for s in sources), combine
    return (key,), None


@dataclass
class DiffusersCheckpoint(Checkpoint):
    """A checkpoint in diffusers' key names, read through `KEY_TABLE`."""

    def sources(self, key: str) -> tuple[tuple[str, ...], Callable | None]:
        return diffusers_sources(key)


# H3DecoderConfig fields in diffusers' vae/config.json (besides the two patch sizes, products of factor lists).
_FIELDS = {
    "latent_channels": "latent_channels",
    "num_layers": "decoder_num_layers",
    "num_heads": "decoder_num_attention_heads",
    "head_dim": "decoder_attention_head_dim",
    "num_register_tokens": "decoder_num_register_tokens",
    "ffn_mult": "decoder_ffn_mult",
    "rope_theta": "decoder_rope_theta",
    "rope_dim_ratio": "decoder_rope_dim_ratio",
    "norm_eps": "decoder_norm_eps",
    "clip_length": "clip_length",
    "token_drop": "token_drop",
    "latents_mean": "latents_mean",
    "latents_std": "latents_std",
}
# Every constructor argument of diffusers' AutoencoderKLMiniMaxH3 (0.40-0.42), plus its bookkeeping keys.
# The encoder's arguments are accepted and ignored: the decoder does not depend on them.
_KEYS = {
    "_class_name",
    "_diffusers_version",
    "_name_or_path",
    "_use_default_values",  # kept by an in-memory model's config (the arguments left at their defaults)
    "in_channels",
    "out_channels",
    "block_out_channels",
    "layers_per_block",
    "spatial_downsample_factors",
    "temporal_downsample_factors",
    "norm_num_groups",
    "norm_eps",
    "spatial_padding_mode",
    *_FIELDS.values(),
}


def _factor(config: dict[str, Any], key: str, default: tuple[int, ...]) -> int:
    """The product of a list of down-sampling factors, each a whole number >= 1."""
    factors = config.get(key, default)
    if not isinstance(factors, (list, tuple)) or not all(
        isinstance(f, int) and not isinstance(f, bool) and f >= 1 for f in factors
    ):
        raise ConfigError(f"vae/config.json: {key} must be a list of whole numbers >= 1, got {factors!r}")
    return math.prod(factors)


def diffusers_config(config: dict[str, Any]) -> H3DecoderConfig:
    """diffusers `vae/config.json` of `AutoencoderKLMiniMaxH3`."""
    expect_object(config, "vae/config.json")
    name = config.get("_class_name", CLASS_NAME)
    if name != CLASS_NAME:
        raise ConfigError(f"vae/config.json describes {name}, not {CLASS_NAME}")
    unknown = set(config) - _KEYS
    if unknown:
        raise ConfigError(f"vae/config.json has settings this decoder does not implement: {sorted(unknown)}")
    expect(config, "vae/config.json", out_channels=3)
    return H3DecoderConfig(
        **fields(config, _FIELDS),
        patch_size=_factor(config, "spatial_downsample_factors", (2, 2, 2, 2, 1, 1)),
        patch_size_t=_factor(config, "temporal_downsample_factors", (1, 2, 2, 1, 1, 1)),
    )


def open_diffusers(folder: Path, origin: str) -> DiffusersCheckpoint:
    """The checkpoint in `folder` (a vae/ folder: config.json and the weights)."""
    try:
        config = diffusers_config(read_json(folder / "config.json", origin))
        check_temporal_plan(config)
    except ValueError as error:  # ConfigError, or a temporal plan that does not work out
        raise CheckpointError(f"{origin}: {error}") from None
    where, shapes = headers(diffusers_weights(folder, origin, DECODER_PREFIXES), origin, DECODER_PREFIXES)
    checkpoint = DiffusersCheckpoint("diffusers", config, where, shapes, origin)
    checkpoint.check_config()
    return checkpoint
