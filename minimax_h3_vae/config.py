"""The checkpoint's configuration: one frozen dataclass, and the mapping from each released config file.

It describes the model only; how a process runs it (fused ops, tile batch, tiling, offload, ranks) is a
`runtime.Runtime`.
The released config files and their fields are in docs/decoder.md section 2.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

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
        for name, least in _INT_FIELDS.items():
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
                raise ConfigError(f"{name} must be a whole number >= {least}, got {value!r}")
        for name, (low, high) in _FLOAT_FIELDS.items():
            value = getattr(self, name)
            if not (_is_real(value) and low < value <= high):
                raise ConfigError(f"{name} must be a number in ({low:g}, {high:g}], got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.head_dim * self.rope_dim_ratio % 6:
            raise ConfigError(
                f"rotary dims {self.head_dim} * {self.rope_dim_ratio} must split into 3 axes x (cos, sin) pairs"
            )
        for name in ("latents_mean", "latents_std"):
            values = getattr(self, name)
            if not isinstance(values, (list, tuple)) or not all(_is_real(v) and math.isfinite(v) for v in values):
                raise ConfigError(f"{name} must be a list of {self.latent_channels} finite numbers, got {values!r}")
            if len(values) != self.latent_channels:
                raise ConfigError(f"{name} has {len(values)} entries, expected {self.latent_channels}")
            object.__setattr__(self, name, tuple(float(v) for v in values))
        if min(self.latents_std) <= 0:
            raise ConfigError(f"latents_std must be positive, got {min(self.latents_std)}")

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

    # ---- mapping from the released config files -------------------------------------------------

    @classmethod
    def from_original(cls, wrapper: dict[str, Any], model: dict[str, Any], **overrides) -> H3DecoderConfig:
        """Original release: `video_vae/config.json` (wrapper) and `video_vae/source/config.json` (model). The
        wrapper's tiling (`vae_tile_size`, `vae_tile_overlap_min`) is a run default, read by loading.py."""
        _expect_object(wrapper, "video_vae/config.json")
        _expect_object(model, "video_vae/source/config.json")
        _expect_object(model.get("vit_decoder_kwargs", {}), "vit_decoder_kwargs")
        _expect(wrapper, "video_vae/config.json", latent_channels=None, vae_decoder_tiling=1)
        _expect(
            model,
            "video_vae/source/config.json",
            pixel_norm_type="imagenet",
            scaling_factor=1.0,
            shift_factor=0.0,
            use_vit_decoder=True,
        )
        vit = dict(model.get("vit_decoder_kwargs", {}))
        _expect(
            vit,
            "vit_decoder_kwargs",
            norm_type="rms_norm",
            norm_affine=True,
            qk_norm_type="rms_norm",
            qk_norm_affine=False,
            ffn_use_gated=True,
            ffn_activation_fn="silu",
        )
        unknown = set(vit) - _ORIGINAL_VIT_KEYS
        if unknown:
            raise ConfigError(f"vit_decoder_kwargs has settings this decoder does not implement: {sorted(unknown)}")
        fields = dict(
            latent_channels=wrapper.get("latent_channels", model.get("z_channels", 24)),
            patch_size=model.get("vae_ratio", 16),
            patch_size_t=model.get("vae_ratio_t", 4),
            num_layers=vit.get("num_layers", 36),
            num_heads=vit.get("heads", 32),
            head_dim=vit.get("dim_head", 64),
            rope_theta=vit.get("rope_theta", 100.0),
            rope_dim_ratio=vit.get("rope_dim_ratio", 0.75),
            clip_length=wrapper.get("vae_clip_length", 17),
            token_drop=wrapper.get("vae_token_drop", 3),
            latents_mean=wrapper.get("latents_mean", RELEASED_LATENTS_MEAN),
            latents_std=wrapper.get("latents_std", RELEASED_LATENTS_STD),
        )
        if model.get("z_channels", fields["latent_channels"]) != fields["latent_channels"]:
            raise ConfigError("video_vae/config.json and source/config.json disagree on the latent channels")
        return cls(**{**fields, **overrides})

    @classmethod
    def from_diffusers(cls, config: dict[str, Any], **overrides) -> H3DecoderConfig:
        """diffusers `vae/config.json` of `AutoencoderKLMiniMaxH3`."""
        _expect_object(config, "vae/config.json")
        name = config.get("_class_name", "AutoencoderKLMiniMaxH3")
        if name != "AutoencoderKLMiniMaxH3":
            raise ConfigError(f"vae/config.json describes {name}, not AutoencoderKLMiniMaxH3")
        unknown = set(config) - _DIFFUSERS_KEYS
        if unknown:
            raise ConfigError(f"vae/config.json has settings this decoder does not implement: {sorted(unknown)}")
        _expect(config, "vae/config.json", out_channels=3)
        spatial = _factor(config, "spatial_downsample_factors", (2, 2, 2, 2, 1, 1))
        temporal = _factor(config, "temporal_downsample_factors", (1, 2, 2, 1, 1, 1))
        fields = dict(
            latent_channels=config.get("latent_channels", 24),
            patch_size=spatial,
            patch_size_t=temporal,
            num_layers=config.get("decoder_num_layers", 36),
            num_heads=config.get("decoder_num_attention_heads", 32),
            head_dim=config.get("decoder_attention_head_dim", 64),
            num_register_tokens=config.get("decoder_num_register_tokens", 4),
            ffn_mult=config.get("decoder_ffn_mult", 4),
            rope_theta=config.get("decoder_rope_theta", 100.0),
            rope_dim_ratio=config.get("decoder_rope_dim_ratio", 0.75),
            norm_eps=config.get("decoder_norm_eps", 1e-5),
            clip_length=config.get("clip_length", 17),
            token_drop=config.get("token_drop", 3),
            latents_mean=config.get("latents_mean", RELEASED_LATENTS_MEAN),
            latents_std=config.get("latents_std", RELEASED_LATENTS_STD),
        )
        return cls(**{**fields, **overrides})


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# Whole-number fields and their least value; the tensors bound the model-sizing ones (loading.py).
_INT_FIELDS = {
    "latent_channels": 1,
    "out_channels": 1,
    "patch_size": 1,
    "patch_size_t": 1,
    "num_layers": 1,
    "num_heads": 1,
    "head_dim": 1,
    "num_register_tokens": 0,
    "ffn_mult": 1,
    "clip_length": 1,
    "token_drop": 0,
}
# Real-valued fields and their range (low, high].
_FLOAT_FIELDS = {"rope_theta": (0.0, math.inf), "rope_dim_ratio": (0.0, 1.0), "norm_eps": (0.0, 1.0)}


def _expect_object(config: Any, where: str) -> None:
    if not isinstance(config, dict):
        kind = {list: "an array", str: "a string", bool: "true/false", type(None): "null"}.get(type(config), "a number")
        raise ConfigError(f"{where} must hold a JSON object ({{...}}), got {kind}")


def _factor(config: dict[str, Any], key: str, default: tuple[int, ...]) -> int:
    """The product of a list of down-sampling factors, each a whole number >= 1."""
    factors = config.get(key, default)
    if not isinstance(factors, (list, tuple)) or not all(
        isinstance(f, int) and not isinstance(f, bool) and f >= 1 for f in factors
    ):
        raise ConfigError(f"vae/config.json: {key} must be a list of whole numbers >= 1, got {factors!r}")
    return math.prod(factors)


def _expect(config: dict[str, Any], where: str, **expected) -> None:
    """Fail on a setting whose value changes the decoder in a way we do not reproduce (None: any value)."""
    for key, value in expected.items():
        if value is not None and key in config and config[key] != value:
            raise ConfigError(f"{where}: {key}={config[key]!r} is not supported (only {value!r})")


# vit_decoder_kwargs keys of the original release; anything else is a decoder variant we do not know.
_ORIGINAL_VIT_KEYS = {
    "dim_head",
    "heads",
    "num_layers",
    "rope_dim_ratio",
    "rope_theta",
    "norm_type",
    "norm_affine",
    "qk_norm_type",
    "qk_norm_affine",
    "ffn_use_gated",
    "ffn_activation_fn",
}

# Every constructor argument of diffusers' AutoencoderKLMiniMaxH3 (0.40-0.42), plus its bookkeeping keys.
# The encoder's arguments are accepted and ignored: the decoder does not depend on them.
_DIFFUSERS_KEYS = {
    "_class_name",
    "_diffusers_version",
    "_name_or_path",
    "_use_default_values",  # kept by an in-memory model's config (the arguments left at their defaults)
    "in_channels",
    "out_channels",
    "latent_channels",
    "block_out_channels",
    "layers_per_block",
    "spatial_downsample_factors",
    "temporal_downsample_factors",
    "norm_num_groups",
    "norm_eps",
    "spatial_padding_mode",
    "decoder_num_layers",
    "decoder_num_attention_heads",
    "decoder_attention_head_dim",
    "decoder_num_register_tokens",
    "decoder_ffn_mult",
    "decoder_rope_theta",
    "decoder_rope_dim_ratio",
    "decoder_norm_eps",
    "clip_length",
    "token_drop",
    "latents_mean",
    "latents_std",
}
