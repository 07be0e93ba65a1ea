"""The decoder's input: checking latents, undoing the pipeline's per-channel normalisation, and the latents
file of the command line (written by `save_latents`, read by `read_latents_header` and `read_latents`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import H3DecoderConfig
from .reader import read_header

# The largest magnitude taken in latents, normalised or not: H3 latents are about N(0, 1) normalised and within
# a few times that denormalised; far larger values overflow the decoder's norms into NaN frames.
LATENT_LIMIT = 1e4
# Floating-point dtypes the decoder computes from (it upcasts to float32); float8 and complex are refused.
LATENT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_dtype(dtype: torch.dtype) -> None:
    """Raise ValueError for a latent dtype the decoder does not take."""
    if dtype not in LATENT_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in LATENT_DTYPES)
        raise ValueError(f"latents must be floating point ({names}), got {str(dtype).removeprefix('torch.')}")


def check_latents(z: torch.Tensor, channels: int | None) -> None:
    """Raise ValueError naming the problem for latents the decoder cannot take.

    z: (B, C, T, h, w), float32/float16/bfloat16/float64, on a device that holds data (not `meta`), finite
    and within +-LATENT_LIMIT; `channels`: the decoder's C, or None to leave the channel count unchecked.
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
    if not (z.abs() <= LATENT_LIMIT).all():  # one pass, one wait: NaN compares False, Inf is above the limit
        if not torch.isfinite(z).all():
            raise ValueError("latents contain NaN or Inf")
        raise ValueError(
            f"latents hold values up to {z.abs().max().item():.3g}, beyond +-{LATENT_LIMIT:g}: not H3 latents "
            "(normalised ones are about N(0, 1), denormalised ones a few times that); the decoder would return NaN"
        )


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
        try:
            value = float(fps) if isinstance(fps, (int, float)) and not isinstance(fps, bool) else math.nan
        except OverflowError:  # an int too large for a float
            value = math.inf
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"fps must be a positive number, got {str(fps)[:20]}")
        metadata = {"fps": repr(value)}
    path = Path(os.fspath(path))
    save_file({"latents": latents.detach().float().cpu().contiguous()}, str(path), metadata=metadata)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # what open() would give a new file (the library writes it 0600)
    return path


# ComfyUI's SaveLatent writes `.latent` files: the LATENT's samples under this key (H3's normalised latents,
# as ComfyUI holds them), beside an empty marker tensor for its format version.
COMFYUI_KEY = "latent_tensor"
COMFYUI_VERSION_KEY = "latent_format_version_0"


@dataclass(frozen=True)
class LatentsFile:
    """What the header of a latents file says, before any tensor data is read."""

    path: Path
    key: str
    shape: tuple[int, ...]  # (C, T, h, w)
    fps: float | None


def check_latents_path(path: Path) -> None:
    """ValueError unless `path` is an existing regular file."""
    if path.is_dir():
        raise ValueError(f"{path}: is a folder; give the latents .safetensors file")
    if path.exists() and not path.is_file():
        raise ValueError(f"{path}: is not a regular file (a FIFO, socket or device); give a .safetensors file")
    if not path.exists():
        raise ValueError(f"{path}: no such file")


def read_latents_header(path: Path) -> LatentsFile:
    """The latents' tensor name (`latents`; `latent_tensor` of a ComfyUI `.latent` file; or the file's only
    tensor), shape and fps metadata, from the header alone; ValueError naming the problem if the decoder
    cannot take them."""
    check_latents_path(path)
    try:
        header = read_header(path)
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error.strerror})") from None
    except ValueError as error:
        raise ValueError(f"{path}: not a readable .safetensors file ({error})") from None
    keys = [key for key in header.tensors if key != COMFYUI_VERSION_KEY]
    if "latents" in keys:
        key = "latents"
    elif COMFYUI_KEY in keys:
        key = COMFYUI_KEY
    elif len(keys) == 1:
        key = keys[0]
    else:
        raise ValueError(f"{path}: no tensor named 'latents' among {keys[:8]}; name it 'latents'")
    entry = header.tensors[key]
    shape = entry.shape[1:] if len(entry.shape) == 5 and entry.shape[0] == 1 else entry.shape
    if len(entry.shape) == 5 and entry.shape[0] > 1:
        raise ValueError(f"{path}: holds a batch of {entry.shape[0]} videos {entry.shape}; the command decodes one")
    if len(shape) != 4:
        raise ValueError(f"{path}: latents must be shaped (24, T, h, w) or (1, 24, T, h, w), got {shape}")
    if min(shape) == 0:
        raise ValueError(f"{path}: latents are empty: shape {shape}")
    dtype = entry.torch_dtype
    if dtype is None or not dtype.is_floating_point:
        got = str(dtype).removeprefix("torch.") if dtype is not None else entry.dtype
        raise ValueError(f"{path}: latents must be floating point, got {got}")
    try:
        check_dtype(dtype)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    fps = None
    if "fps" in header.metadata:
        try:
            fps = float(header.metadata["fps"])
        except ValueError:
            fps = math.nan
        if not (fps > 0 and math.isfinite(fps)):
            raise ValueError(
                f"{path}: metadata fps={header.metadata['fps']!r} is not a positive number; fix it or pass --fps"
            )
    return LatentsFile(path, key, shape, fps)


def read_latents(source: LatentsFile) -> torch.Tensor:
    """The latents (1, C, T, h, w) as float32; ValueError for an unreadable file, NaN or Inf."""
    try:
        with safe_open(str(source.path), framework="pt", device="cpu") as handle:
            latents = handle.get_tensor(source.key)
    except Exception as error:  # safetensors' own error types; their text says what is wrong
        raise ValueError(f"{source.path}: not a readable .safetensors file ({error})") from None
    latents = latents.reshape(1, *source.shape)
    try:
        check_latents(latents, channels=None)
    except ValueError as error:
        raise ValueError(f"{source.path}: {error}") from None
    return latents.float()
