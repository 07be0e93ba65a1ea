"""The decoder's input: checking latents, undoing the pipeline's per-channel normalisation, and the latents
file of the command line (written by `save_latents`; read by `load_latents`, and by the command through
`read_latents_header` and `read_latents`)."""

from __future__ import annotations

import numbers
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from . import output
from .config import H3DecoderConfig
from .reader import NotSafetensors, read_header, read_tensor
from .text import parse_number, shown

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
            f"(shape {tuple(z.shape)}; expected {layout}){swapped_axes(z.shape[1:], channels)}"
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


def swapped_axes(shape: tuple[int, ...], channels: int) -> str:
    """A hint for latents `shape` = (C, T, h, w) whose channel count is wrong: when the frame axis holds
    `channels`, the latents are most likely stored frames first, (T, C, h, w)."""
    if len(shape) == 4 and shape[0] != channels and shape[1] == channels:
        return (
            f"; the first two axes look swapped (the second has {channels}, as in (T, C, h, w)): "
            "store them as (C, T, h, w)"
        )
    return ""


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
            f"{swapped_axes(z.shape[axis:], channels)}"
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
    tensor `latents` ((24, T, h, w) or (1, 24, T, h, w), saved float32 on the CPU) and `fps` (any real number
    the command takes: 0.01 to 1000) in its metadata. An existing file is replaced only by the complete new
    one, and keeps its permission bits; a new one gets those of a new file. Returns the path written."""
    shape = tuple(latents.shape) if isinstance(latents, torch.Tensor) else None
    if shape is None or len(shape) not in (4, 5) or (len(shape) == 5 and shape[0] != 1):
        raise ValueError(f"save_latents writes one video, (C, T, h, w) or (1, C, T, h, w); got shape {shape}")
    check_latents(latents.reshape(1, *shape[-4:]), channels=None)
    metadata = None
    if fps is not None:
        if not isinstance(fps, numbers.Real) or isinstance(fps, bool):  # numpy's scalars are Real too
            raise ValueError(f"fps must be a number (a frame rate), got {type(fps).__name__} {str(fps)[:20]}")
        try:
            value = float(fps)
        except OverflowError:  # an int too large for a float
            value = float("inf")
        output.check_fps(value, "fps")
        metadata = {"fps": repr(value)}
    path = output.resolve_output(Path(os.fspath(path)))  # a symbolic link is written through
    if path.is_dir():
        raise ValueError(f"{shown(path)}: is a folder; give a file name")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask  # what open() gives a new file (the library writes its files 0600)
    temp = output.create_temp(path)
    try:
        save_file({"latents": latents.detach().float().cpu().contiguous()}, str(temp), metadata=metadata)
        os.chmod(temp, mode)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return path


def load_latents(path: str | os.PathLike) -> tuple[torch.Tensor, float | None]:
    """The latents of a file the command reads (`save_latents`'s, a ComfyUI `.latent`, a file with one
    tensor): (latents (1, C, T, h, w) float32 as stored, normalised unless they were saved raw; the `fps` of
    its metadata, or None). ValueError naming the problem, as the command reports it."""
    source = read_latents_header(Path(os.fspath(path)))
    return read_latents(source), source.fps


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
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ValueError(f"{shown(path)}: no such file") from None
    except OSError as error:  # a name too long, a loop of links, no permission
        raise ValueError(f"{shown(path)}: cannot read it ({error.strerror})") from None
    if stat.S_ISDIR(mode):
        raise ValueError(f"{shown(path)}: is a folder; give the latents .safetensors file")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{shown(path)}: is not a regular file (a FIFO, socket or device); give a .safetensors file")


def read_latents_header(path: Path) -> LatentsFile:
    """The latents' tensor name (`latents`; `latent_tensor` of a ComfyUI `.latent` file; or the file's only
    tensor), shape and fps metadata, from the header alone; ValueError naming the problem if the decoder
    cannot take them. The file's other tensors are not looked at beyond their header entries."""
    check_latents_path(path)
    name = shown(path)
    try:
        header = read_header(path)
    except OSError as error:
        raise ValueError(f"{name}: cannot read it ({error.strerror})") from None
    except NotSafetensors as error:
        raise ValueError(f"{name}: {error}; give a latents .safetensors file") from None
    except ValueError as error:
        raise ValueError(f"{name}: not a readable .safetensors file ({error})") from None
    keys = [key for key in header.tensors if key != COMFYUI_VERSION_KEY]
    if "latents" in keys:
        key = "latents"
    elif COMFYUI_KEY in keys:
        key = COMFYUI_KEY
    elif len(keys) == 1:
        key = keys[0]
    else:
        raise ValueError(f"{name}: no tensor named 'latents' among {keys[:8]}; name it 'latents'")
    if key == COMFYUI_KEY and COMFYUI_VERSION_KEY not in header.tensors:
        # ComfyUI's Load Latent scales such a file by 1 / 0.18215 (its format before the version marker, an
        # SD 1.x convention): whether these latents meant that cannot be told, so they are not guessed at.
        raise ValueError(
            f"{name}: holds {COMFYUI_KEY!r} without ComfyUI's {COMFYUI_VERSION_KEY!r} marker, a file that "
            "ComfyUI's Load Latent scales by 1/0.18215 as an old format; save H3 latents with ComfyUI's Save "
            "Latent (which writes the marker) or store them under the name 'latents'"
        )
    entry = header.tensors[key]
    shape = entry.shape[1:] if len(entry.shape) == 5 and entry.shape[0] == 1 else entry.shape
    if len(entry.shape) == 5 and entry.shape[0] > 1:
        raise ValueError(f"{name}: holds a batch of {entry.shape[0]} videos {entry.shape}; the command decodes one")
    if len(shape) != 4:
        raise ValueError(f"{name}: latents must be shaped (24, T, h, w) or (1, 24, T, h, w), got {shape}")
    if min(shape) == 0:
        raise ValueError(f"{name}: latents are empty: shape {shape}")
    dtype = entry.torch_dtype
    if dtype is None or not dtype.is_floating_point:
        got = str(dtype).removeprefix("torch.") if dtype is not None else entry.dtype
        raise ValueError(f"{name}: latents must be floating point, got {got} (tensor {key!r})")
    try:
        check_dtype(dtype)
    except ValueError as error:
        raise ValueError(f"{name}: {error} (tensor {key!r})") from None
    fps = None
    if "fps" in header.metadata:
        try:
            fps = parse_number(header.metadata["fps"])
        except ValueError:
            fps = None
        if fps is None or not 0 < fps < float("inf"):
            raise ValueError(
                f"{name}: metadata fps={header.metadata['fps']!r} is not a positive number written in digits; "
                "fix it or pass --fps"
            )
    return LatentsFile(path, key, shape, fps)


def read_latents(source: LatentsFile) -> torch.Tensor:
    """The latents (1, C, T, h, w) as float32; ValueError for an unreadable file, NaN or Inf. Only the
    latents' own bytes are read (the header read again: the file may have changed since)."""
    name = shown(source.path)
    try:
        header = read_header(source.path)
        entry = header.tensors.get(source.key)
        if entry is None or entry.torch_dtype is None or entry.shape[-4:] != source.shape:
            raise ValueError("it changed since its header was read")
        latents = read_tensor(source.path, header, source.key)
    except (OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or error
        raise ValueError(f"{name}: not a readable .safetensors file ({reason})") from None
    latents = latents.reshape(1, *source.shape)
    try:
        check_latents(latents, channels=None)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    return latents.float()
