"""Checkpoint layouts and reading the decoder's tensors from any of them.

Three layouts hold the same weights; each has one section below with its detection, its config mapping
onto `H3DecoderConfig` and its key map:
- original release: `video_vae/{config.json, source/config.json, source/model.safetensors}`, fp32,
  original key names (those of this package's modules: an identity map);
- diffusers: `vae/{config.json, diffusion_pytorch_model-0000N-of-0000M.safetensors, *.index.json}`, fp32,
  renamed keys, q/k/v split out of the fused projection and the FFN halves swapped (DIFFUSERS_KEY_TABLE);
- ComfyUI single file: original key names, fp16 matrices, no config (the released architecture, with the
  block count and width read off the tensors).
Only decoder tensors and `post_quant_conv` are read; the encoder is skipped without being read.

Where each tensor then goes (the load policy) is `weights.load_weights`.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from .config import ConfigError, H3DecoderConfig
from .reader import DTYPES, DeviceReader, NotSafetensors, read_header
from .text import shown
from .tiling import RELEASE_TILING, Tiling, check_temporal_plan

DEFAULT_REPO = "MiniMaxAI/MiniMax-H3"
ORIGINAL_SUBFOLDERS = ("FL2VA/video_vae", "Ref2VA/video_vae", "video_vae")
DIFFUSERS_SUBFOLDER = "vae"
DIFFUSERS_INDEX = "diffusion_pytorch_model.safetensors.index.json"
DIFFUSERS_SINGLE = "diffusion_pytorch_model.safetensors"

# Keys of the release that the decoder does not use: the masked-autoencoding token of training.
IGNORED_KEYS = {"decoder.mask_token"}
# Prefixes of the tensors this decoder owns; any other key belongs to the encoder or is metadata.
DECODER_PREFIXES = ("decoder.", "post_quant_conv.")
# The largest config or index file read (the diffusers index of the released VAE is about 100 KB).
MAX_JSON_BYTES = 16 * 2**20


class CheckpointError(Exception):
    """A checkpoint that cannot be found, read or matched to the decoder; the message says which and why."""


@dataclass
class Checkpoint:
    """A located checkpoint: its layout, decoder config, and which file holds each stored key."""

    layout: str  # "original", "diffusers" or "comfyui"
    config: H3DecoderConfig
    files: dict[str, Path]  # stored key -> safetensors file
    shapes: dict[str, tuple[int, ...]]  # stored key -> shape, from the file headers
    origin: str  # what the user gave, for messages
    in_memory: dict[str, torch.Tensor] | None = None  # stored key -> tensor, for a checkpoint held in memory
    tiling: Tiling = RELEASE_TILING  # the tiling it was released with: the run default (original: its config.json)

    def sources(self, key: str) -> tuple[tuple[str, ...], Callable | None]:
        return diffusers_sources(key) if self.layout == "diffusers" else ((key,), None)

    def check(self, expected: dict[str, tuple[int, ...]]) -> None:
        """Fail, naming the tensor, on a missing, unexpected or mis-shaped decoder tensor. Reads no data."""
        used = set(IGNORED_KEYS)
        for key, shape in expected.items():
            stored, combine = self.sources(key)
            parts = len(stored)
            part_shape = (shape[0] // parts, *shape[1:]) if combine is _interleave_heads else shape
            for name in stored:
                if name not in self.shapes:
                    raise CheckpointError(f"{self.origin}: missing tensor {name!r} ({self.layout} layout)")
                if self.shapes[name] != part_shape:
                    raise CheckpointError(
                        f"{self.origin}: tensor {name!r} has shape {list(self.shapes[name])}, "
                        f"this config expects {list(part_shape)}"
                    )
                used.add(name)
        unexpected = sorted(k for k in self.shapes if k.startswith(DECODER_PREFIXES) and k not in used)
        if unexpected:
            raise CheckpointError(
                f"{self.origin}: unexpected decoder tensor(s) {unexpected[:5]}"
                f"{' ...' if len(unexpected) > 5 else ''} (not in a {self.config.num_layers}-block"
                f" decoder; is this a different model?)"
            )

    def tensors(
        self, expected: dict[str, tuple[int, ...]], device: torch.device | None = None, host_keys=frozenset()
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """(original key, tensor) for every expected key, in stored dtype, read one at a time from disk.

        With a CUDA `device`, files are read straight onto it (reader.DeviceReader), except the keys in
        `host_keys`, which are read straight into pinned host memory; else everything goes to the CPU.
        """
        self.check(expected)
        handles = {}
        direct = device is not None and device.type == "cuda" and self.in_memory is None
        reader = DeviceReader(device) if direct else None
        try:
            for key in expected:
                stored, combine = self.sources(key)
                parts = [self._read(handles, name, reader, key in host_keys) for name in stored]
                yield key, parts[0] if combine is None else combine(parts, self.config.head_dim)
        finally:
            handles.clear()
            if reader is not None:
                reader.close()

    def _read(self, handles: dict, name: str, reader: DeviceReader | None = None, pinned: bool = False) -> torch.Tensor:
        if self.in_memory is not None:
            return self.in_memory[name]
        path = self.files[name]
        try:
            if reader is not None and reader.can_read(path, name):
                return reader.read(path, name, pinned)
            if path not in handles:
                handles[path] = safe_open(str(path), framework="pt", device="cpu")
            return handles[path].get_tensor(name)
        except Exception as error:  # safetensors raises its own error types for truncated or corrupt files
            raise CheckpointError(
                f"{path}: cannot read tensor {name!r} ({error}); the file may be truncated "
                "or corrupt: download it again"
            ) from error


def checkpoint_in_memory(
    state_dict: dict[str, torch.Tensor], config: H3DecoderConfig, layout: str, origin: str = "state dict"
) -> Checkpoint:
    """A checkpoint whose tensors are already in memory (e.g. a loaded diffusers VAE's `state_dict()`), in
    the key names of `layout` ("original" / "comfyui" or "diffusers"); converted like a file of that layout."""
    if layout not in ("original", "comfyui", "diffusers"):
        raise CheckpointError(f"{origin}: unknown layout {layout!r}")
    shapes = {key: tuple(tensor.shape) for key, tensor in state_dict.items()}
    return Checkpoint(layout, config, {}, shapes, origin, in_memory=dict(state_dict))


def load_checkpoint(source: str | os.PathLike = DEFAULT_REPO, revision: str | None = None) -> Checkpoint:
    """Locate a checkpoint (local path or hub repo id) and read its config and tensor headers."""
    path = Path(os.fspath(source)).expanduser()
    try:
        exists = path.exists()
    except OSError as error:  # a name too long for the filesystem, a folder that may not be searched
        raise CheckpointError(f"{shown(source)}: cannot look there ({error.strerror})") from None
    if exists:
        if revision is not None:
            raise CheckpointError(f"{source}: is a local path; a revision ({revision!r}) applies to hub repo ids only")
        return _open_local(path, str(source))
    if _looks_like_repo_id(str(source)):
        return _open_local(_download(str(source), revision), str(source))
    raise CheckpointError(f"{source}: no such file or folder, and not a hub repo id (like {DEFAULT_REPO})")


def _looks_like_repo_id(text: str) -> bool:
    return re.fullmatch(r"[\w.-]+/[\w.-]+", text) is not None and not text.startswith((".", "/"))


def _open_local(path: Path, origin: str) -> Checkpoint:
    if path.is_file():
        if path.suffix != ".safetensors":
            raise CheckpointError(f"{origin}: a single-file checkpoint must be a .safetensors file")
        return _open_comfyui(path, origin)
    for sub in ORIGINAL_SUBFOLDERS:
        if (path / sub / "config.json").is_file():
            return _open_original(path / sub, origin)
    if (path / DIFFUSERS_SUBFOLDER / "config.json").is_file():
        return _open_diffusers(path / DIFFUSERS_SUBFOLDER, origin)
    config = path / "config.json"
    if config.is_file():
        if (path / DIFFUSERS_INDEX).is_file() or (path / DIFFUSERS_SINGLE).is_file():
            return _open_diffusers(path, origin)
        return _open_original(path, origin)
    raise CheckpointError(
        f"{origin}: not a checkpoint folder: expected a video_vae/ folder (config.json + "
        f"source/), a diffusers vae/ folder, or a repo root holding one of them"
    )


# ---- shared by the layouts ------------------------------------------------------------------------


def _read_json(path: Path, origin: str) -> dict:
    """A JSON file that must hold an object: a regular file (not a FIFO or a device, which could hang or
    never end) of at most MAX_JSON_BYTES."""
    if not path.exists():
        raise CheckpointError(f"{origin}: missing file {path}")
    if not path.is_file():
        raise CheckpointError(f"{origin}: {path} is not a regular file; replace it with the checkpoint's JSON file")
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise CheckpointError(f"{origin}: {path} is {size} bytes, not a config ({MAX_JSON_BYTES} at most)")
        data = json.loads(path.read_text())
    except (ValueError, RecursionError) as error:  # JSONDecodeError, bad UTF-8, a 5000-digit number, deep nesting
        reason = "nested too deeply" if isinstance(error, RecursionError) else error
        raise CheckpointError(f"{origin}: {path} is not valid JSON ({reason})") from None
    except OSError as error:
        raise CheckpointError(f"{origin}: cannot read {path} ({error.strerror})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{origin}: {path} must hold a JSON object ({{...}})")
    return data


def _inside(folder: Path, name: str | Path, origin: str) -> Path:
    """folder / name, which a checkpoint's own files may name only inside the checkpoint's folder: no absolute
    name, no `..` out of it, no folder on the way that links out of it. The file itself may be a link: the
    Hugging Face cache links each snapshot file to its blob, outside the snapshot."""
    path = folder / name
    root, parent = os.path.realpath(folder), os.path.realpath(path.parent)
    escapes = Path(name).is_absolute() or Path(os.path.normpath(name)).parts[:1] == ("..",)
    if escapes or not (parent == root or parent.startswith(root + os.sep)):
        raise CheckpointError(
            f"{origin}: names {str(name)!r}, outside its folder {folder}; a checkpoint's files stay in it"
        )
    return path


def _check_against_tensors(config: H3DecoderConfig, shapes: dict[str, tuple[int, ...]], layout: str, origin: str):
    """The config's model-sizing fields against the tensor shapes of the file headers, before anything is
    allocated: a config that does not describe these weights (e.g. num_layers 10**6) fails here, and one
    that passes sizes the model by tensors that exist on disk. `Checkpoint.check` then checks every tensor."""
    diffusers = layout == "diffusers"
    embed = "decoder.proj_in.weight" if diffusers else "decoder.x_embedder.weight"
    w1 = "decoder.transformer_blocks.0." + ("ff.net.0.proj.weight" if diffusers else "ff.w1.weight")
    blocks = len({m.group(1) for k in shapes if (m := re.match(r"decoder\.transformer_blocks\.(\d+)\.", k))})
    if embed not in shapes:
        raise CheckpointError(f"{origin}: missing tensor {embed!r} ({layout} layout)")
    dim = shapes[embed][0]
    found = {
        "latent_channels": (config.latent_channels, shapes[embed][-1]),
        "num_heads x head_dim": (config.dim, dim),
    }
    if w1 in shapes:
        found["ffn_mult"] = (config.ffn_mult, shapes[w1][0] // (2 * dim) if dim else 0)
    if "decoder.register_tokens" in shapes:
        found["num_register_tokens"] = (config.num_register_tokens, shapes["decoder.register_tokens"][1])
    if "decoder.proj_out.weight" in shapes:
        found["out_channels x patch_size_t x patch_size^2"] = (config.patch_dim, shapes["decoder.proj_out.weight"][0])
    wrong = [f"{name} {want} (the tensors say {have})" for name, (want, have) in found.items() if want != have]
    if config.num_layers > blocks:  # fewer: Checkpoint.check names the tensors of the blocks left over
        wrong.insert(0, f"num_layers {config.num_layers} (the tensors hold {blocks} blocks)")
    if wrong:
        raise CheckpointError(
            f"{origin}: the config does not match the weights: {'; '.join(wrong)}; fix config.json or use the "
            "config that came with these weights"
        )


def _headers(
    files: list[Path], origin: str, prefixes: tuple[str, ...] = DECODER_PREFIXES
) -> tuple[dict[str, Path], dict[str, tuple[int, ...]]]:
    """Which file holds each key, and its shape, from the safetensors headers alone; a key of the decoder
    (starting with one of `prefixes`) must be floating point."""
    where, shapes = {}, {}
    for path in files:
        if not path.is_file():
            raise CheckpointError(f"{origin}: missing weights file {path}")
        try:
            header = read_header(path)
        except OSError as error:
            raise CheckpointError(f"{path}: cannot read it ({error.strerror})") from None
        except NotSafetensors as error:
            raise CheckpointError(f"{path}: {error}; replace it with the checkpoint's own file") from None
        except ValueError as error:
            raise CheckpointError(
                f"{path}: not a readable safetensors file ({error}); it may be truncated or corrupt: download it again"
            ) from None
        for key, entry in header.tensors.items():
            if key.startswith(prefixes) and entry.dtype not in DTYPES:  # int8, bool: not this model's
                raise CheckpointError(
                    f"{path}: tensor {key!r} is {entry.dtype}, not floating point: not this model's weights "
                    "(a quantised file?); use a float16 or float32 checkpoint"
                )
            where[key] = path
            shapes[key] = entry.shape
    return where, shapes


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


def _fields(source: dict[str, Any], keys: dict[str, str]) -> dict[str, Any]:
    """The H3DecoderConfig fields a config file sets, through its table `keys` (field -> the file's key). A
    field the file leaves out keeps H3DecoderConfig's default, the released value."""
    return {field: source[key] for field, key in keys.items() if key in source}


# ---- original layout: video_vae/{config.json, source/config.json, source/model.safetensors} -----------------

# H3DecoderConfig fields in the release's files: source/config.json, its vit_decoder_kwargs, config.json.
_ORIGINAL_MODEL_FIELDS = {"patch_size": "vae_ratio", "patch_size_t": "vae_ratio_t"}
_ORIGINAL_VIT_FIELDS = {
    "num_layers": "num_layers",
    "num_heads": "heads",
    "head_dim": "dim_head",
    "rope_theta": "rope_theta",
    "rope_dim_ratio": "rope_dim_ratio",
}
_ORIGINAL_WRAPPER_FIELDS = {
    "clip_length": "vae_clip_length",
    "token_drop": "vae_token_drop",
    "latents_mean": "latents_mean",
    "latents_std": "latents_std",
}
# The vit_decoder_kwargs this decoder reproduces only with the release's value.
_ORIGINAL_VIT_FIXED = dict(
    norm_type="rms_norm",
    norm_affine=True,
    qk_norm_type="rms_norm",
    qk_norm_affine=False,
    ffn_use_gated=True,
    ffn_activation_fn="silu",
)
# vit_decoder_kwargs keys of the original release; anything else is a decoder variant we do not know.
_ORIGINAL_VIT_KEYS = {*_ORIGINAL_VIT_FIELDS.values(), *_ORIGINAL_VIT_FIXED}


def original_config(wrapper: dict[str, Any], model: dict[str, Any]) -> H3DecoderConfig:
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
    _expect(vit, "vit_decoder_kwargs", **_ORIGINAL_VIT_FIXED)
    unknown = set(vit) - _ORIGINAL_VIT_KEYS
    if unknown:
        raise ConfigError(f"vit_decoder_kwargs has settings this decoder does not implement: {sorted(unknown)}")
    fields = {
        **_fields(model, _ORIGINAL_MODEL_FIELDS),
        **_fields(vit, _ORIGINAL_VIT_FIELDS),
        **_fields(wrapper, _ORIGINAL_WRAPPER_FIELDS),
        # The wrapper's latent_channels, else source's z_channels; the two must agree.
        **_fields(model, {"latent_channels": "z_channels"}),
        **_fields(wrapper, {"latent_channels": "latent_channels"}),
    }
    if "z_channels" in model and model["z_channels"] != fields["latent_channels"]:
        raise ConfigError("video_vae/config.json and source/config.json disagree on the latent channels")
    return H3DecoderConfig(**fields)


def _open_original(folder: Path, origin: str) -> Checkpoint:
    wrapper = _read_json(folder / "config.json", origin)
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
    source_dir = _inside(folder, paths["source_path"], origin)
    model = _read_json(source_dir / "config.json", origin)
    weights = _inside(folder, Path(paths["source_path"]) / paths["source_safetensors_path"], origin)
    try:
        config = original_config(wrapper, model)
        check_temporal_plan(config)
    except ValueError as error:  # ConfigError, or a temporal plan that does not work out
        raise CheckpointError(f"{origin}: {error}") from None
    try:
        tiling = Tiling(wrapper.get("vae_tile_size", 256), wrapper.get("vae_tile_overlap_min", 64)).check(config)
    except ValueError as error:
        raise CheckpointError(f"{origin}: {folder / 'config.json'}: {error}") from None
    where, shapes = _headers([weights], origin)
    _check_against_tensors(config, shapes, "original", origin)
    return Checkpoint("original", config, where, shapes, origin, tiling=tiling)


# ---- diffusers layout: vae/{config.json, sharded safetensors, index} ----------------------------------------


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
DIFFUSERS_KEY_TABLE: tuple[tuple[str, tuple[str, ...], Callable | None], ...] = (
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
    for pattern, sources, combine in DIFFUSERS_KEY_TABLE:
        match = re.fullmatch(pattern, key)
        if match:
            return tuple(match.expand(s) for s in sources), combine
    return (key,), None


# H3DecoderConfig fields in diffusers' vae/config.json (besides the two patch sizes, products of factor lists).
_DIFFUSERS_FIELDS = {
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
_DIFFUSERS_KEYS = {
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
    *_DIFFUSERS_FIELDS.values(),
}


def diffusers_config(config: dict[str, Any]) -> H3DecoderConfig:
    """diffusers `vae/config.json` of `AutoencoderKLMiniMaxH3`."""
    _expect_object(config, "vae/config.json")
    name = config.get("_class_name", "AutoencoderKLMiniMaxH3")
    if name != "AutoencoderKLMiniMaxH3":
        raise ConfigError(f"vae/config.json describes {name}, not AutoencoderKLMiniMaxH3")
    unknown = set(config) - _DIFFUSERS_KEYS
    if unknown:
        raise ConfigError(f"vae/config.json has settings this decoder does not implement: {sorted(unknown)}")
    _expect(config, "vae/config.json", out_channels=3)
    return H3DecoderConfig(
        **_fields(config, _DIFFUSERS_FIELDS),
        patch_size=_factor(config, "spatial_downsample_factors", (2, 2, 2, 2, 1, 1)),
        patch_size_t=_factor(config, "temporal_downsample_factors", (1, 2, 2, 1, 1, 1)),
    )


def _decoder_shards(index: Path, origin: str, prefixes: tuple[str, ...] = DECODER_PREFIXES) -> list[str]:
    """The shard files a diffusers index names for the decoder's tensors (those starting with one of
    `prefixes`), sorted (the encoder's are not read)."""
    weight_map = _read_json(index, origin).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
        raise CheckpointError(f"{origin}: {index}: weight_map must map tensor names to file names")
    return sorted({name for key, name in weight_map.items() if key.startswith(prefixes)})


def _open_diffusers(folder: Path, origin: str) -> Checkpoint:
    try:
        config = diffusers_config(_read_json(folder / "config.json", origin))
        check_temporal_plan(config)
    except ValueError as error:  # ConfigError, or a temporal plan that does not work out
        raise CheckpointError(f"{origin}: {error}") from None
    index = folder / DIFFUSERS_INDEX
    if index.is_file():
        files = [_inside(folder, name, origin) for name in _decoder_shards(index, origin)]
    else:
        files = [folder / DIFFUSERS_SINGLE]
    where, shapes = _headers(files, origin)
    _check_against_tensors(config, shapes, "diffusers", origin)
    return Checkpoint("diffusers", config, where, shapes, origin)


# ---- ComfyUI layout: one .safetensors file, original key names, no config ---------------------------------


def _open_comfyui(path: Path, origin: str) -> Checkpoint:
    where, shapes = _headers([path], origin)

    def read_stat(name: str) -> tuple[float, ...]:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return tuple(handle.get_tensor(name).float().tolist())

    return Checkpoint("comfyui", comfyui_config(shapes, read_stat, origin), where, shapes, origin)


def comfyui_config(
    shapes: dict[str, tuple[int, ...]], read_stat: Callable[[str], tuple[float, ...]], origin: str
) -> H3DecoderConfig:
    """The config of a checkpoint without one (a ComfyUI file, or the weights of a ComfyUI VAE in memory):
    the released architecture, with the width, block count and latent channels read off the tensor shapes
    and the latent statistics from its `latents_mean` / `latents_std` tensors when present (`read_stat`)."""
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
    fields = dict(latent_channels=latent_channels, num_layers=len(blocks), num_heads=dim // default.head_dim)
    stats = {
        name: read_stat(name) for name in ("latents_mean", "latents_std") if shapes.get(name) == (latent_channels,)
    }
    try:
        return H3DecoderConfig(**fields, **stats)
    except ConfigError as error:
        raise CheckpointError(f"{origin}: {error}") from None


# ---- the hub ------------------------------------------------------------------------------------------------


def _download(repo_id: str, revision: str | None) -> Path:
    """Fetch only the files the decoder needs (original layout, else diffusers) into the HF cache, by
    `hub_snapshot`'s policy."""
    return hub_snapshot(
        repo_id,
        revision,
        (_locate_original, diffusers_locator(DIFFUSERS_SUBFOLDER, DECODER_PREFIXES)),
        f"neither {ORIGINAL_SUBFOLDERS[0]}/ nor {DIFFUSERS_SUBFOLDER}/ with a video VAE",
    )


def _locate_original(repo_id: str, fetch: Callable[[str], Path], local_only: bool) -> Path:
    """The original layout's three files (`FL2VA/video_vae/`); returns the folder."""
    sub = ORIGINAL_SUBFOLDERS[0]
    wrapper = _read_json(fetch(f"{sub}/config.json"), repo_id)  # a broken cached copy: CheckpointError
    source, weights_name = wrapper.get("source_path", "source"), wrapper.get("source_safetensors_path")
    if not isinstance(source, str) or not isinstance(weights_name or "", str):
        raise CheckpointError(f"{repo_id}: {sub}/config.json names its files with non-strings")
    fetch(f"{sub}/{source}/config.json")
    weights = fetch(f"{sub}/{source}/{weights_name or 'model.safetensors'}")
    return weights.parents[len(Path(source).parts)]


def diffusers_locator(subfolder: str, prefixes: tuple[str, ...]) -> Callable[[str, Callable, bool], Path]:
    """A `hub_snapshot` locator of a diffusers folder: its config.json, and the index's shards that hold keys
    starting with `prefixes` (else the single weights file); returns the folder."""

    def locate(repo_id: str, fetch: Callable[[str], Path], local_only: bool) -> Path:
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

        config = fetch(f"{subfolder}/config.json")
        try:
            for name in _decoder_shards(fetch(f"{subfolder}/{DIFFUSERS_INDEX}"), repo_id, prefixes):
                fetch(f"{subfolder}/{name}")
        except LocalEntryNotFoundError:
            if not local_only:
                raise
            fetch(f"{subfolder}/{DIFFUSERS_SINGLE}")
        except EntryNotFoundError:
            fetch(f"{subfolder}/{DIFFUSERS_SINGLE}")
        return config.parent

    return locate


def hub_snapshot(repo_id: str, revision: str | None, locators: tuple[Callable, ...], missing: str) -> Path:
    """Fetch one component's files into the HF cache; returns its folder there. Shared by the video and the
    audio loader.

    Each locator, `locate(repo_id, fetch, local_only)`, fetches one layout's files through `fetch(filename)`
    and returns the folder; they are tried in order, the next when the hub says a file of this one is not
    there (or, looking in the cache only, when the cache lacks one). `missing` says what a repo that holds
    none of them lacks ("neither X/ nor Y/ with a video VAE").

    With no revision, or a commit hash, the local cache is looked at first, with no network at all: a repo
    cached once loads offline at once (without a revision: the commit cached as `main`). A branch or tag
    name asks the hub for its newest commit first, and falls back to the cache only when the hub cannot be
    reached; `revision="main"` is how a cached repo is brought up to date. Otherwise the hub is asked once;
    a hub that cannot be reached is an error at the first file (no fallback to the other layout, which
    would only retry the same unreachable host).
    """
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    def locate(local_only: bool) -> Path:
        def fetch(filename: str) -> Path:
            return Path(hf_hub_download(repo_id, filename, revision=revision, local_files_only=local_only))

        *fallbacks, final = locators
        for locator in fallbacks:
            try:
                return locator(repo_id, fetch, local_only)
            except LocalEntryNotFoundError:
                if not local_only:  # the hub was not reached: the other layout would not be either
                    raise
            except EntryNotFoundError:  # the hub says this layout is not there
                pass
        return final(repo_id, fetch, local_only)

    named = revision is not None and re.fullmatch(r"[0-9a-f]{40}", revision) is None  # a branch or a tag
    try:
        if not named:
            try:
                return locate(local_only=True)
            except (LocalEntryNotFoundError, OfflineModeIsEnabled, EntryNotFoundError):
                pass
        online = not constants.HF_HUB_OFFLINE and _hub_reachable(constants.ENDPOINT)
        if not online and not named:
            raise LocalEntryNotFoundError("offline")
        return locate(local_only=not online)
    except (LocalEntryNotFoundError, OfflineModeIsEnabled):
        raise CheckpointError(
            f"{repo_id}: no such local path, and not in the local Hugging Face cache while "
            "the hub cannot be reached (HF_HUB_OFFLINE set, or no network): check the path, "
            "download the repo once online, or pass a local path"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise CheckpointError(
            f"{repo_id}: not found on the Hugging Face hub: check the repo id and revision, or log in for a gated repo"
        ) from None
    except EntryNotFoundError:
        raise CheckpointError(f"{repo_id}: holds {missing}") from None


def _hub_reachable(endpoint: str) -> bool:
    """One request to the hub, through its client's session (proxies and certificates honoured), without
    the client's retries: hf_hub_download retries an unreachable host for ~25 s per file."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=10)
    except Exception:  # any transport error (DNS, refused, timeout, TLS): the hub cannot be reached
        return False
    return True
