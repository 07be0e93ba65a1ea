"""Reading a checkpoint's own files, the same way for every layout and for both decoders: its JSON files, the
safetensors headers, the names its files give (which must stay inside its folder), diffusers' shard index, and
the settings of its config files (checked before they reach a config dataclass)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..reader import DTYPES, read_checked_header

# diffusers' weights: one file, or shards named by an index.
DIFFUSERS_INDEX = "diffusion_pytorch_model.safetensors.index.json"
DIFFUSERS_SINGLE = "diffusion_pytorch_model.safetensors"
# The largest config or index file read (the diffusers index of the released VAE is about 100 KB).
MAX_JSON_BYTES = 16 * 2**20


class CheckpointError(Exception):
    """A checkpoint that cannot be found, read or matched to the decoder; the message says which and why."""


def read_json(path: Path, origin: str) -> dict:
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


def inside(folder: Path, name: str | Path, origin: str) -> Path:
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


def headers(
    files: list[Path], origin: str, prefixes: tuple[str, ...]
) -> tuple[dict[str, Path], dict[str, tuple[int, ...]]]:
    """Which file holds each key, and its shape, from the safetensors headers alone; a key of the decoder
    (starting with one of `prefixes`) must be floating point."""
    where, shapes = {}, {}
    for path in files:
        if not path.is_file():
            raise CheckpointError(f"{origin}: missing weights file {path}")
        header = read_checked_header(
            path,
            str(path),
            CheckpointError,
            "replace it with the checkpoint's own file",
            "; it may be truncated or corrupt: download it again",
        )
        for key, entry in header.tensors.items():
            if key.startswith(prefixes) and entry.dtype not in DTYPES:  # int8, bool: not this model's
                raise CheckpointError(
                    f"{path}: tensor {key!r} is {entry.dtype}, not floating point: not this model's weights "
                    "(a quantised file?); use a float16 or float32 checkpoint"
                )
            where[key] = path
            shapes[key] = entry.shape
    return where, shapes


def decoder_shards(index: Path, origin: str, prefixes: tuple[str, ...]) -> list[str]:
    """The shard files a diffusers index names for the decoder's tensors (those starting with one of
    `prefixes`), sorted (the encoder's are not read)."""
    weight_map = read_json(index, origin).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
        raise CheckpointError(f"{origin}: {index}: weight_map must map tensor names to file names")
    return sorted({name for key, name in weight_map.items() if key.startswith(prefixes)})


def diffusers_weights(folder: Path, origin: str, prefixes: tuple[str, ...]) -> list[Path]:
    """A diffusers folder's weights files that hold the decoder's tensors: the index's shards, else the one
    file."""
    index = folder / DIFFUSERS_INDEX
    if index.is_file():
        return [inside(folder, name, origin) for name in decoder_shards(index, origin, prefixes)]
    return [folder / DIFFUSERS_SINGLE]


def single_file(path: Path, origin: str) -> bool:
    """Whether `path` is a single-file checkpoint: a file, which must then be a .safetensors one."""
    if not path.is_file():
        return False
    if path.suffix != ".safetensors":
        raise CheckpointError(f"{origin}: a single-file checkpoint must be a .safetensors file")
    return True


def first_folder(root: Path, subfolders: tuple[str, ...]) -> Path | None:
    """The first of `subfolders` of `root` that holds a config.json, if any."""
    return next((root / sub for sub in subfolders if (root / sub / "config.json").is_file()), None)


# ---- the settings of a config file --------------------------------------------------------------------------


def expect_object(config: Any, where: str) -> None:
    if not isinstance(config, dict):
        kind = {list: "an array", str: "a string", bool: "true/false", type(None): "null"}.get(type(config), "a number")
        raise ConfigError(f"{where} must hold a JSON object ({{...}}), got {kind}")


def expect(config: dict[str, Any], where: str, **expected) -> None:
    """Fail on a setting whose value changes the decoder in a way we do not reproduce (None: any value)."""
    for key, value in expected.items():
        if value is not None and key in config and config[key] != value:
            raise ConfigError(f"{where}: {key}={config[key]!r} is not supported (only {value!r})")


def fields(source: dict[str, Any], keys: dict[str, str]) -> dict[str, Any]:
    """The config fields a config file sets, through its table `keys` (field -> the file's key). A field the
    file leaves out keeps the config dataclass's default, the released value."""
    return {field: source[key] for field, key in keys.items() if key in source}


def per_channel_stat(shapes: dict[str, tuple[int, ...]], name: str, channels: int, origin: str) -> bool:
    """Whether a file without a config holds latent statistic `name` (`latents_mean` / `latents_std`): one
    value per latent channel, stored as ({channels},) or with size-1 dims around it ((1, C, 1), (1, C, 1, 1, 1)),
    which are read flattened. Any other shape is a CheckpointError naming the shape expected: statistics that
    cannot be read are never replaced by the release's in silence."""
    if name not in shapes:
        return False
    shape = shapes[name]
    if [size for size in shape if size != 1] == [channels] or (channels == 1 and all(size == 1 for size in shape)):
        return True
    raise CheckpointError(
        f"{origin}: {name} has shape {list(shape)}, expected [{channels}] (one value per latent channel); fix or "
        "remove the tensor (without it the release's statistics are used)"
    )
