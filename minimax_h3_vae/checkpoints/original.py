"""The original release's video VAE layout: `video_vae/{config.json, source/config.json,
source/model.safetensors}`, float32, the key names of this package's modules (no key map).

`config.json` (the wrapper) names the source folder and the weights file, and holds the latent statistics and
the release's tiling; `source/config.json` holds the model's settings (`vit_decoder_kwargs`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import ConfigError, H3DecoderConfig
from ..text import shown
from ..tiling import Tiling, check_temporal_plan
from .checkpoint import DECODER_PREFIXES, Checkpoint
from .files import CheckpointError, expect, expect_object, fields, headers, inside, read_json

# Where a repo root holds the layout, in the order looked for (the hub fetches the first).
SUBFOLDERS = ("FL2VA/video_vae", "Ref2VA/video_vae", "video_vae")

# H3DecoderConfig fields in the release's files: source/config.json, its vit_decoder_kwargs, config.json.
_MODEL_FIELDS = {"patch_size": "vae_ratio", "patch_size_t": "vae_ratio_t"}
_VIT_FIELDS = {
    "num_layers": "num_layers",
    "num_heads": "heads",
    "head_dim": "dim_head",
    "rope_theta": "rope_theta",
    "rope_dim_ratio": "rope_dim_ratio",
}
_WRAPPER_FIELDS = {
    "clip_length": "vae_clip_length",
    "token_drop": "vae_token_drop",
    "latents_mean": "latents_mean",
    "latents_std": "latents_std",
}
# The vit_decoder_kwargs this decoder reproduces only with the release's value.
_VIT_FIXED = dict(
    norm_type="rms_norm",
    norm_affine=True,
    qk_norm_type="rms_norm",
    qk_norm_affine=False,
    ffn_use_gated=True,
    ffn_activation_fn="silu",
)
# vit_decoder_kwargs keys of the original release; anything else is a decoder variant we do not know.
_VIT_KEYS = {*_VIT_FIELDS.values(), *_VIT_FIXED}


def original_config(wrapper: dict[str, Any], model: dict[str, Any]) -> H3DecoderConfig:
    """Original release: `video_vae/config.json` (wrapper) and `video_vae/source/config.json` (model). The
    wrapper's tiling (`vae_tile_size`, `vae_tile_overlap_min`) is a run default, read by `open_original`."""
    expect_object(wrapper, "video_vae/config.json")
    expect_object(model, "video_vae/source/config.json")
    expect_object(model.get("vit_decoder_kwargs", {}), "vit_decoder_kwargs")
    expect(wrapper, "video_vae/config.json", latent_channels=None, vae_decoder_tiling=1)
    expect(
        model,
        "video_vae/source/config.json",
        pixel_norm_type="imagenet",
        scaling_factor=1.0,
        shift_factor=0.0,
        use_vit_decoder=True,
    )
    vit = dict(model.get("vit_decoder_kwargs", {}))
    expect(vit, "vit_decoder_kwargs", **_VIT_FIXED)
    unknown = set(vit) - _VIT_KEYS
    if unknown:
        raise ConfigError(f"vit_decoder_kwargs has settings this decoder does not implement: {sorted(unknown)}")
    settings = {
        **fields(model, _MODEL_FIELDS),
        **fields(vit, _VIT_FIELDS),
        **fields(wrapper, _WRAPPER_FIELDS),
        # The wrapper's latent_channels, else source's z_channels; the two must agree.
        **fields(model, {"latent_channels": "z_channels"}),
        **fields(wrapper, {"latent_channels": "latent_channels"}),
    }
    if "z_channels" in model and model["z_channels"] != settings["latent_channels"]:
        raise ConfigError("video_vae/config.json and source/config.json disagree on the latent channels")
    return H3DecoderConfig(**settings)


def open_original(folder: Path, origin: str) -> Checkpoint:
    """The checkpoint in `folder` (a video_vae/ folder: config.json and source/)."""
    wrapper = read_json(folder / "config.json", origin)
    if "vit_decoder_kwargs" in wrapper:  # the model's own config.json: this is the source/ folder itself
        raise CheckpointError(
            f"{origin}: is the source/ folder inside an original-layout checkpoint; give the folder that holds "
            f"it, {shown(folder.parent)} (video_vae/, with config.json and source/)"
        )
    paths = {
        key: wrapper.get(key, default)
        for key, default in (("source_path", "source"), ("source_safetensors_path", "model.safetensors"))
    }
    for key, value in paths.items():
        if not isinstance(value, str) or not value:
            raise CheckpointError(f"{origin}: {folder / 'config.json'}: {key} must be a file name, got {value!r}")
    source_dir = inside(folder, paths["source_path"], origin)
    model = read_json(source_dir / "config.json", origin)
    weights = inside(folder, Path(paths["source_path"]) / paths["source_safetensors_path"], origin)
    try:
        config = original_config(wrapper, model)
        check_temporal_plan(config)
    except ValueError as error:  # ConfigError, or a temporal plan that does not work out
        raise CheckpointError(f"{origin}: {error}") from None
    try:
        tiling = Tiling(wrapper.get("vae_tile_size", 256), wrapper.get("vae_tile_overlap_min", 64)).check(config)
    except ValueError as error:
        raise CheckpointError(f"{origin}: {folder / 'config.json'}: {error}") from None
    where, shapes = headers([weights], origin, DECODER_PREFIXES)
    checkpoint = Checkpoint("original", config, where, shapes, origin, tiling=tiling)
    checkpoint.check_config()
    return checkpoint


def locate_original(repo_id: str, fetch: Callable[[str], Path], local_only: bool) -> Path:
    """A `hub.hub_snapshot` locator: the layout's three files (`FL2VA/video_vae/`); returns the folder."""
    sub = SUBFOLDERS[0]
    wrapper = read_json(fetch(f"{sub}/config.json"), repo_id)  # a broken cached copy: CheckpointError
    source, weights_name = wrapper.get("source_path", "source"), wrapper.get("source_safetensors_path")
    if not isinstance(source, str) or not isinstance(weights_name or "", str):
        raise CheckpointError(f"{repo_id}: {sub}/config.json names its files with non-strings")
    fetch(f"{sub}/{source}/config.json")
    weights = fetch(f"{sub}/{source}/{weights_name or 'model.safetensors'}")
    return weights.parents[len(Path(source).parts)]
