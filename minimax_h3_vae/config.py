"""The checkpoint's configuration: one frozen dataclass, and the mapping from each released config file.

It describes the model only; how a process runs it (fused ops, tile batch, tiling, offload, ranks) is a
`runtime.Runtime`.
Each released config file is mapped onto it by its layout's module in checkpoints/, beside the layout's
detection and key map (docs/decoder.md section 2 lists the files and their fields). The checks of fields
that the audio decoder's config shares are at the end.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# Per-channel statistics of the released latents (video_vae/config.json). A diffusion pipeline's latents
# are normalised with them; the decoder consumes `z * std + mean`.
RELEASED_LATENTS_MEAN = (
    0.858090341091156,
    -0.9606591463088989,
    1.0661640167236328,
    -0.5090325474739075,
    -0.2727581858634949,
    -1.3675414323806763,
    -0.2553254961967468,
    -0.26907554268836975,
    -0.5376840829849243,
    -0.0464097298681736,
    0.6657370328903198,
    0.19690127670764923,
    -0.5460608005523682,
    -0.4035342037677765,
    -0.23683024942874908,
    0.25928452610969543,
    -0.30133944749832153,
    0.211341992020607,
    -1.1206848621368408,
    0.3581933379173279,
    -0.04225143790245056,
    0.2604829967021942,
    0.22864092886447906,
    0.7056031823158264,
)
RELEASED_LATENTS_STD = (
    1.2223774194717407,
    1.2767263650894165,
    1.6831774711608887,
    1.7549455165863037,
    1.5636216402053833,
    2.194143533706665,
    0.9653137922286987,
    1.0569885969161987,
    0.841948926448822,
    0.7729952931404114,
    1.8955937623977661,
    0.946841835975647,
    0.7996809482574463,
    0.44988900423049927,
    0.7197399735450745,
    0.6936293244361877,
    2.961095094680786,
    2.7694199085235596,
    3.0496184825897217,
    2.1088054180145264,
    3.276226282119751,
    3.1627357006073,
    2.2816812992095947,
    2.6127843856811523,
)


class ConfigError(ValueError):
    """A checkpoint config this decoder does not understand or cannot reproduce."""


@dataclass(frozen=True)
class H3DecoderConfig:
    """Everything that shapes the decoder and its temporal chunks. Defaults are the released model."""

    latent_channels: int = 24  # z channels; also post_quant_conv width
    out_channels: int = 3  # RGB
    patch_size: int = 16  # spatial compression: one latent voxel -> 16x16 pixels
    patch_size_t: int = 4  # temporal compression: one latent frame -> 4 pixel frames
    num_layers: int = 36  # ViT blocks
    num_heads: int = 32
    head_dim: int = 64
    num_register_tokens: int = 4  # learned tokens appended after the patch tokens (then one zero token)
    ffn_mult: int = 4  # hidden width of each gated-FFN half, as a multiple of `dim`
    rope_theta: float = 100.0
    rope_dim_ratio: float = 0.75  # share of each head's dims that RoPE rotates (48 of 64)
    norm_eps: float = 1e-5  # RMSNorm, QK-norm and the final LayerNorm
    clip_length: int = 17  # pixel frames per encoder chunk; fixes the temporal chunk geometry
    token_drop: int = 3  # latent frames the encoder dropped per chunk; fixes the temporal overlap
    latents_mean: tuple[float, ...] = RELEASED_LATENTS_MEAN
    latents_std: tuple[float, ...] = RELEASED_LATENTS_STD

    def __post_init__(self):
        for name, (least, most) in _INT_FIELDS.items():
            check_whole_number(name, getattr(self, name), least, most)
        for name, (low, high) in _FLOAT_FIELDS.items():
            value = getattr(self, name)
            if not (is_real(value) and low < value <= high):
                raise ConfigError(f"{name} must be a number in ({low:g}, {high:g}], got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.head_dim * self.rope_dim_ratio % 6:
            raise ConfigError(
                f"rotary dims {self.head_dim} * {self.rope_dim_ratio} must split into 3 axes x (cos, sin) pairs"
            )
        set_latent_statistics(self)

    @property
    def dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def ffn_dim(self) -> int:
        return self.ffn_mult * self.dim

    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.rope_dim_ratio)

    @property
    def patch_dim(self) -> int:
        """Pixels one token expands to: channels x frames x rows x columns."""
        return self.out_channels * self.patch_size_t * self.patch_size * self.patch_size

    @property
    def chunk_latents(self) -> int:
        """Latent frames that advance per temporal chunk (5)."""
        return math.ceil(self.clip_length / self.patch_size_t)

    @property
    def chunk_overlap_latents(self) -> int:
        """Extra latent frames each chunk reads past its advance (2)."""
        return (-self.token_drop) % self.chunk_latents

    @property
    def frame_pre_padding(self) -> int:
        """Leading pixel frames of a chunk that the encoder padded in and the decoder drops (3)."""
        return (-self.clip_length) % self.patch_size_t

    @property
    def frame_overlap(self) -> int:
        """Pixel frames cross-faded between consecutive chunks (5)."""
        return max(self.chunk_overlap_latents * self.patch_size_t - self.frame_pre_padding, 0)

    def replace(self, **changes) -> H3DecoderConfig:
        return dataclasses.replace(self, **changes)


# ---- the checks of fields, shared with the audio decoder's config ---------------------------------------


def is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_whole_number(name: str, value, least: int, most: int) -> None:
    """ConfigError unless `value` is an int (not a bool) in [least, most]; a huge one is shown shortened."""
    if not (isinstance(value, int) and not isinstance(value, bool) and least <= value <= most):
        shown = (
            value
            if not isinstance(value, int) or abs(value) < 10**12
            else f"{str(value)[:6]}... ({len(str(value))} digits)"
        )
        raise ConfigError(f"{name} must be a whole number from {least} to {most}, got {shown}")


def set_latent_statistics(config) -> None:
    """Check a frozen config's `latents_mean` / `latents_std` (one finite number per latent channel, the std
    positive) and store them as tuples of floats."""
    for name in ("latents_mean", "latents_std"):
        values = getattr(config, name)
        if not isinstance(values, (list, tuple)) or not all(is_real(v) and math.isfinite(v) for v in values):
            raise ConfigError(f"{name} must be a list of {config.latent_channels} finite numbers, got {values!r}")
        if len(values) != config.latent_channels:
            raise ConfigError(f"{name} has {len(values)} entries, expected {config.latent_channels}")
        object.__setattr__(config, name, tuple(float(v) for v in values))
    if min(config.latents_std) <= 0:
        raise ConfigError(f"latents_std must be positive, got {min(config.latents_std)}")


# Whole-number fields and their range [least, most]: far beyond the released model (24 channels, 36 blocks,
# 32 x 64 heads, 17-frame clips), and small enough that nothing is ever sized by an absurd number read from
# a file; the tensors bound the model-sizing ones further (checkpoints/checkpoint.py).
_INT_FIELDS = {
    "latent_channels": (1, 1024),
    "out_channels": (1, 16),
    "patch_size": (1, 64),
    "patch_size_t": (1, 16),
    "num_layers": (1, 1024),
    "num_heads": (1, 1024),
    "head_dim": (1, 1024),
    "num_register_tokens": (0, 1024),
    "ffn_mult": (1, 64),
    "clip_length": (1, 1024),
    "token_drop": (0, 1024),
}
# Real-valued fields and their range (low, high].
_FLOAT_FIELDS = {"rope_theta": (0.0, math.inf), "rope_dim_ratio": (0.0, 1.0), "norm_eps": (0.0, 1.0)}
