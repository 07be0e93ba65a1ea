"""The audio VAE's checkpoint layouts, and reading the decoder's tensors from any of them.

Three layouts hold the same weights; each has one section below with its detection and its config mapping onto
`H3AudioDecoderConfig` (docs/audio.md section 2):
- original release: `FL2VA/audio_vae/{config.json, metadata.json, model.safetensors}` (config.yaml beside them is
  not read); the release's key names, each weight-normed conv as `weight_g` / `weight_v`;
- diffusers: `audio_vae/{config.json, diffusion_pytorch_model.safetensors (or shards and an index)}`, written by
  `AutoencoderKLMiniMaxH3Audio.save_pretrained`: the same key names as the original;
- ComfyUI single file (`minimax_h3_audio_vae_fp32.safetensors`): the same names with the weight norm folded into
  plain `weight` tensors, plus `latents_mean` / `latents_std`; no config (the released architecture, its widths
  read off the tensors).
Only `dec_in_proj.*` and `decoder.*` are read; the encoder side (`encoder.*`, `pre_block.*`, `mean_proj.*`,
`logs_proj.*`) is skipped without being read. Every weight-normed conv is folded once, at load, on the device
the decoder runs on: `weight = torch._weight_norm(weight_v, weight_g, 0)`, the computation of torch's
`weight_norm`, which diffusers' modules repeat at every call.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ..checkpoints.files import (
    CheckpointError,
    diffusers_weights,
    expect,
    expect_object,
    fields,
    first_folder,
    headers,
    inside,
    per_channel_stat,
    read_json,
    single_file,
)
from ..checkpoints.hub import DEFAULT_REPO, diffusers_locator, hub_snapshot, local_or_fetched
from ..checkpoints.stored import StoredCheckpoint
from ..config import ConfigError
from .config import (
    RELEASED_RESBLOCK_DILATIONS,
    RELEASED_RESBLOCK_KERNEL_SIZES,
    RELEASED_UPSAMPLE_KERNEL_SIZES,
    RELEASED_UPSAMPLE_RATES,
    H3AudioDecoderConfig,
)
from .model import AudioDecoder, kaiser_sinc_filter

ORIGINAL_SUBFOLDERS = ("FL2VA/audio_vae", "Ref2VA/audio_vae", "audio_vae")
DIFFUSERS_SUBFOLDER = "audio_vae"
DIFFUSERS_CLASS = "AutoencoderKLMiniMaxH3Audio"
# Prefixes of the tensors the decoder owns; any other key belongs to the encoder side or is metadata.
DECODER_PREFIXES = ("dec_in_proj.", "decoder.")
# The latent statistics a ComfyUI file holds as tensors (its config lives in no file).
STATS = ("latents_mean", "latents_std")
# The sample rate the release's code builds its H3 BigVGAN for (from `sample_rate` alone; see original_config).
RELEASED_SAMPLE_RATE = 32000


@dataclass
class AudioCheckpoint(StoredCheckpoint):
    """A located audio checkpoint: its layout, decoder config, and which file holds each stored key."""

    config: H3AudioDecoderConfig

    prefixes = DECODER_PREFIXES

    def sources(self, key: str) -> tuple[str, ...]:
        """The stored key(s) of one of the decoder's keys: (g, v) for a weight-normed conv's `weight` outside the
        ComfyUI layout (every `decoder.*.weight` is one; `dec_in_proj` is a plain conv), else the key itself.
        The spelling of torch's newer `parametrizations.weight_norm` is read as well, where a file has it."""
        if self.layout == "comfyui" or not (key.startswith("decoder.") and key.endswith(".weight")):
            return (key,)
        conv = key.removesuffix(".weight")
        newer = (f"{conv}.parametrizations.weight.original0", f"{conv}.parametrizations.weight.original1")
        return newer if newer[0] in self.shapes else (f"{conv}.weight_g", f"{conv}.weight_v")

    def computed(self, key: str) -> bool:
        """Whether `key` is a resampling filter that this file leaves out (ComfyUI files only) and that is
        therefore computed (`kaiser_sinc_filter`): it is fixed by the architecture."""
        return self.layout == "comfyui" and key.endswith(".filter") and key not in self.shapes

    def stored_shapes(self, key: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
        """The stored tensor itself, or weight norm's (g, v), with g one value per slice of dim 0 (torch's
        weight_norm with dim=0, for a conv and a transposed conv alike); none for a computed filter."""
        if self.computed(key):
            return []
        stored = self.sources(key)
        shapes = [shape] if len(stored) == 1 else [(shape[0], *[1] * (len(shape) - 1)), shape]
        return list(zip(stored, shapes))

    def stray_hint(self) -> str:
        return "not in a decoder of this config"

    def tensors(self, expected: dict[str, tuple[int, ...]], device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
        """(decoder key, float32 tensor on `device`) for every expected key, read one at a time from disk; a
        weight-normed conv's weight folded on the device."""
        self.check(expected)
        handles = {}
        try:
            for key in expected:
                if self.computed(key):
                    yield key, kaiser_sinc_filter().to(device)
                    continue
                parts = [self.read(handles, name).to(device=device, dtype=torch.float32) for name in self.sources(key)]
                yield key, parts[0] if len(parts) == 1 else torch._weight_norm(parts[1], parts[0], 0)
        finally:
            handles.clear()


def load_checkpoint(source: str | os.PathLike = DEFAULT_REPO, revision: str | None = None) -> AudioCheckpoint:
    """Locate an audio checkpoint (local path or hub repo id) and read its config and tensor headers."""
    path, fetched = local_or_fetched(source, revision, download)
    return (_open_folder if fetched else _open_local)(path, str(source))


def _open_local(path: Path, origin: str) -> AudioCheckpoint:
    if single_file(path, origin):
        return _open_comfyui(path, origin)
    if (folder := first_folder(path, ORIGINAL_SUBFOLDERS)) is not None:
        return _open_folder(folder, origin)
    if (path / "config.json").is_file():
        return _open_folder(path, origin)
    raise CheckpointError(
        f"{origin}: not an audio VAE checkpoint folder: expected an audio_vae/ folder (original: config.json, "
        "metadata.json, model.safetensors; or diffusers: config.json and its weights), or a repo root holding "
        "FL2VA/audio_vae/ or audio_vae/"
    )


def _open_folder(folder: Path, origin: str) -> AudioCheckpoint:
    """An audio_vae/ folder: diffusers' when its config.json names diffusers' class, else the original."""
    config = read_json(folder / "config.json", origin)
    name = config.get("_class_name")
    if name == DIFFUSERS_CLASS:
        return _open_diffusers(folder, config, origin)
    if isinstance(name, str) and name.startswith("AutoencoderKL"):
        raise CheckpointError(
            f"{origin}: {folder / 'config.json'} describes {name}, not the audio VAE ({DIFFUSERS_CLASS})"
        )
    return _open_original(folder, config, origin)


def _check_against_tensors(
    config: H3AudioDecoderConfig, checkpoint: AudioCheckpoint, expected: dict[str, tuple[int, ...]]
) -> None:
    """The config's sizes against the file headers, before any tensor is checked one by one: a config that does
    not describe these weights fails with one message naming each field that disagrees."""
    shapes = checkpoint.shapes
    proj = shapes.get("dec_in_proj.weight")
    pre = shapes.get(checkpoint.sources("decoder.conv_pre.weight")[-1])
    stages = len({m.group(1) for k in shapes if (m := re.match(r"decoder\.ups\.(\d+)\.", k))})
    blocks = len({m.group(1) for k in shapes if (m := re.match(r"decoder\.resblocks\.(\d+)\.", k))})
    if proj is None or len(proj) != 3:
        raise CheckpointError(
            f"{checkpoint.origin}: no 3-D dec_in_proj.weight: not a MiniMax-H3 audio VAE ({checkpoint.layout} layout)"
        )
    found = {
        "latent_dim": (config.latent_dim, proj[0]),
        "latent_channels": (config.latent_channels, proj[1]),
        "upsampling stages": (len(config.upsample_rates), stages),
        "AMP blocks": (len(config.upsample_rates) * len(config.resblock_kernel_sizes), blocks),
    }
    if pre is not None and len(pre) == 3:
        found["decoder_dim"] = (config.decoder_dim, pre[0])
    wrong = [f"{name} {want} (the tensors say {have})" for name, (want, have) in found.items() if want != have]
    if wrong:
        raise CheckpointError(
            f"{checkpoint.origin}: the config does not match the weights: {'; '.join(wrong)}; fix the config or use "
            "the one that came with these weights"
        )
    checkpoint.check(expected)


def expected_shapes(config: H3AudioDecoderConfig) -> dict[str, tuple[int, ...]]:
    """The decoder's stored tensors and their shapes (built on the meta device: nothing is allocated)."""
    return dict(_expected_shapes(config))


@functools.lru_cache(maxsize=8)
def _expected_shapes(config: H3AudioDecoderConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    # Once per config: building the ~1,700 modules, even on the meta device, is about half of a load's CPU time.
    with torch.device("meta"):
        return tuple((key, tuple(value.shape)) for key, value in AudioDecoder(config).state_dict().items())


def _located(layout: str, config: H3AudioDecoderConfig, files: list[Path], origin: str) -> AudioCheckpoint:
    where, shapes = headers(files, origin, DECODER_PREFIXES)
    checkpoint = AudioCheckpoint(layout, config, where, shapes, origin)
    _check_against_tensors(config, checkpoint, expected_shapes(config))
    return checkpoint


# ---- original layout: FL2VA/audio_vae/{config.json, metadata.json, model.safetensors} -------------------------

# The constructor arguments of the release's audio VAE, which metadata.json's `metadata.kwargs` holds.
_ORIGINAL_KWARGS = {
    "encoder_dim",
    "encoder_rates",
    "latent_dim",
    "decoder_dim",
    "decoder_rates",
    "sample_rate",
    "vae_latent_channels",
    "attn_proj",
    "decoder_type",
}


def original_config(wrapper: dict[str, Any], metadata: dict[str, Any]) -> H3AudioDecoderConfig:
    """Original release: `audio_vae/config.json` (wrapper: the latent statistics) and `audio_vae/metadata.json`
    (`metadata.kwargs`: the constructor arguments).

    The release builds its BigVGAN from `sample_rate` alone (rates 5 5 2 2 2 2 2, kernels 9 9 4 4 4 4 4, AMP
    kernels 3 7 11 with dilations 1 3 5 at 32 kHz); `decoder_rates` must agree with it. `latent_dim` is the
    encoder's width, `encoder_dim * 2 ** len(encoder_rates)` (2048), which a stated `latent_dim` must equal.
    """
    expect_object(wrapper, "audio_vae/config.json")
    expect_object(metadata, "audio_vae/metadata.json")
    kwargs = metadata.get("metadata", {})
    expect_object(kwargs, "metadata.json: metadata")
    kwargs = kwargs.get("kwargs", {})
    expect_object(kwargs, "metadata.json: metadata.kwargs")
    unknown = set(kwargs) - _ORIGINAL_KWARGS
    if unknown:
        raise ConfigError(f"metadata.json kwargs has settings this decoder does not implement: {sorted(unknown)}")
    expect(kwargs, "metadata.json kwargs", decoder_type="bigvgan", sample_rate=RELEASED_SAMPLE_RATE)
    expect(kwargs, "metadata.json kwargs", decoder_rates=list(RELEASED_UPSAMPLE_RATES))
    expect(wrapper, "audio_vae/config.json", sample_rate=RELEASED_SAMPLE_RATE)
    encoder_dim, encoder_rates = kwargs.get("encoder_dim", 64), kwargs.get("encoder_rates", [2, 4, 4, 5, 5])
    if not (type(encoder_dim) is int and isinstance(encoder_rates, list) and 1 <= encoder_dim <= 2**16):
        raise ConfigError(
            "metadata.json kwargs: encoder_dim must be a whole number from 1 to 65536 and encoder_rates a list (they "
            f"give latent_dim), got {encoder_dim!r} and {encoder_rates!r}"
        )
    latent_dim = encoder_dim * 2 ** min(len(encoder_rates), 32)
    expect(kwargs, "metadata.json kwargs", latent_dim=latent_dim)
    channels = kwargs.get("vae_latent_channels", 32)
    if wrapper.get("latent_channels", channels) != channels:
        raise ConfigError("audio_vae/config.json and metadata.json disagree on the latent channels")
    return H3AudioDecoderConfig(
        latent_channels=channels,
        latent_dim=latent_dim,
        decoder_dim=kwargs.get("decoder_dim", 1024),
        upsample_rates=RELEASED_UPSAMPLE_RATES,
        upsample_kernel_sizes=RELEASED_UPSAMPLE_KERNEL_SIZES,
        resblock_kernel_sizes=RELEASED_RESBLOCK_KERNEL_SIZES,
        resblock_dilations=RELEASED_RESBLOCK_DILATIONS,
        sample_rate=RELEASED_SAMPLE_RATE,
        **fields(wrapper, {name: name for name in STATS}),
    )


def _original_files(folder: Path, wrapper: dict[str, Any], origin: str) -> tuple[Path, Path]:
    """metadata.json and the weights file, as the wrapper config names them (inside the folder)."""
    names = []
    for key, default in (("source_metadata_path", "metadata.json"), ("source_safetensors_path", "model.safetensors")):
        value = wrapper.get(key, default)
        if not isinstance(value, str) or not value:
            raise CheckpointError(f"{origin}: {folder / 'config.json'}: {key} must be a file name, got {value!r}")
        names.append(inside(folder, value, origin))
    return names[0], names[1]


def _open_original(folder: Path, wrapper: dict[str, Any], origin: str) -> AudioCheckpoint:
    metadata_path, weights = _original_files(folder, wrapper, origin)
    if not metadata_path.exists():
        raise CheckpointError(
            f"{origin}: missing file {metadata_path}: an original audio_vae/ folder holds config.json, metadata.json "
            "and model.safetensors (is this the audio VAE's folder?)"
        )
    try:
        config = original_config(wrapper, read_json(metadata_path, origin))
    except ConfigError as error:
        raise CheckpointError(f"{origin}: {error}") from None
    return _located("original", config, [weights], origin)


# ---- diffusers layout: audio_vae/{config.json, weights} ----------------------------------------------------------

# H3AudioDecoderConfig fields in diffusers' audio_vae/config.json.
_DIFFUSERS_FIELDS = {
    "latent_channels": "latent_channels",
    "latent_dim": "latent_dim",
    "decoder_dim": "decoder_dim",
    "upsample_rates": "decoder_rates",
    "upsample_kernel_sizes": "decoder_kernel_sizes",
    "resblock_kernel_sizes": "resblock_kernel_sizes",
    "resblock_dilations": "resblock_dilation_sizes",
    "sample_rate": "sampling_rate",
    "latents_mean": "latents_mean",
    "latents_std": "latents_std",
}
# Every constructor argument of diffusers' AutoencoderKLMiniMaxH3Audio (0.42), its bookkeeping keys, and the
# `sample_rate` the released file carries beside `sampling_rate` (diffusers ignores it). The encoder's
# arguments are accepted and ignored: the decoder does not depend on them.
_DIFFUSERS_KEYS = {
    "_class_name",
    "_diffusers_version",
    "_name_or_path",
    "_use_default_values",
    "encoder_dim",
    "encoder_rates",
    "num_attention_heads",
    "sample_rate",
    *_DIFFUSERS_FIELDS.values(),
}


def diffusers_config(config: dict[str, Any]) -> H3AudioDecoderConfig:
    """diffusers `audio_vae/config.json` of `AutoencoderKLMiniMaxH3Audio`; a field it leaves out keeps diffusers'
    default, which is the released value."""
    expect_object(config, "audio_vae/config.json")
    unknown = set(config) - _DIFFUSERS_KEYS
    if unknown:
        raise ConfigError(f"audio_vae/config.json has settings this decoder does not implement: {sorted(unknown)}")
    if "sample_rate" in config and config["sample_rate"] != config.get("sampling_rate", RELEASED_SAMPLE_RATE):
        raise ConfigError("audio_vae/config.json: sample_rate and sampling_rate disagree")
    return H3AudioDecoderConfig(**fields(config, _DIFFUSERS_FIELDS))


def _open_diffusers(folder: Path, config: dict[str, Any], origin: str) -> AudioCheckpoint:
    try:
        decoder_config = diffusers_config(config)
    except ConfigError as error:
        raise CheckpointError(f"{origin}: {error}") from None
    return _located("diffusers", decoder_config, diffusers_weights(folder, origin, DECODER_PREFIXES), origin)


# ---- ComfyUI layout: one .safetensors file, weight norm folded, no config -----------------------------------------


def _open_comfyui(path: Path, origin: str) -> AudioCheckpoint:
    where, shapes = headers([path], origin, DECODER_PREFIXES)
    for name in ("dec_in_proj.weight", "decoder.conv_pre.weight"):
        if name not in shapes:
            raise CheckpointError(f"{origin}: no {name}: not a MiniMax-H3 audio VAE file")
        if len(shapes[name]) != 3:
            raise CheckpointError(
                f"{origin}: {name} has shape {list(shapes[name])}, not a conv's (out, in, kernel): not a MiniMax-H3 "
                "audio VAE file"
            )
    proj, pre = shapes["dec_in_proj.weight"], shapes["decoder.conv_pre.weight"]
    stats = {}
    for name in STATS:
        if per_channel_stat(shapes, name, proj[1], origin):
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                stats[name] = tuple(handle.get_tensor(name).double().flatten().tolist())
    try:
        config = H3AudioDecoderConfig(latent_channels=proj[1], latent_dim=proj[0], decoder_dim=pre[0], **stats)
    except ConfigError as error:
        raise CheckpointError(f"{origin}: {error}") from None
    checkpoint = AudioCheckpoint("comfyui", config, where, shapes, origin)
    _check_against_tensors(config, checkpoint, expected_shapes(config))
    return checkpoint


# ---- the hub -----------------------------------------------------------------------------------------------------


def download(repo_id: str, revision: str | None) -> Path:
    """Fetch only the audio VAE's files (original layout, else diffusers) into the HF cache, by the video
    loader's policy (`checkpoints.hub.hub_snapshot`: the cache first for no revision or a commit)."""
    return hub_snapshot(
        repo_id,
        revision,
        (_locate_original, diffusers_locator(DIFFUSERS_SUBFOLDER, DECODER_PREFIXES)),
        f"neither {ORIGINAL_SUBFOLDERS[0]}/ nor {DIFFUSERS_SUBFOLDER}/ with an audio VAE",
    )


def _locate_original(repo_id: str, fetch: Callable[[str], Path], local_only: bool) -> Path:
    """`FL2VA/audio_vae/`: config.json, then the metadata and weights files it names; returns the folder."""
    sub = ORIGINAL_SUBFOLDERS[0]
    config = fetch(f"{sub}/config.json")
    metadata, weights = _original_files(config.parent, read_json(config, repo_id), repo_id)
    for path in (metadata, weights):
        fetch(f"{sub}/{path.relative_to(config.parent).as_posix()}")
    return config.parent


# ---- the load policy -----------------------------------------------------------------------------------------------


def load_weights(model: AudioDecoder, checkpoint: AudioCheckpoint, device: torch.device) -> None:
    """Fill `model` (built on the meta device) with the checkpoint's weights, float32 on `device`, each weight norm
    folded there and each in storage of its own (`StoredCheckpoint.owned`: no view of the file)."""
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    state_dict = {key: checkpoint.owned(tensor) for key, tensor in checkpoint.tensors(expected, device)}
    model.load_state_dict(state_dict, strict=True, assign=True)
    model.eval().requires_grad_(False)
