"""The decoders' input: checking latents, undoing the pipeline's per-channel normalisation, the durations rule
between a clip's video and audio latents, and the latents file of the command line (written by `save_latents`;
read by `load_latents`, and by the command through `read_latents_header`, `read_latents` and
`read_audio_latents`)."""

from __future__ import annotations

import math
import numbers
import os
import stat
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import torch
from safetensors.torch import save_file

from .audio.config import H3AudioDecoderConfig
from .config import H3DecoderConfig
from .files import create_temp, new_file_mode, resolve_output
from .reader import read_checked_header, read_header, read_tensor
from .text import parse_number, parse_whole, shown
from .tiling import plan_chunks

# The largest magnitude taken in latents, normalised or not: H3 latents are about N(0, 1) normalised and within
# a few times that denormalised; far larger values overflow the decoder's norms into NaN frames.
LATENT_LIMIT = 1e4
# Floating-point dtypes the decoder computes from (it upcasts to float32); float8 and complex are refused.
LATENT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# H3's audio latents as its pipeline makes them: (2, 32, N), the two stereo channels (each decoded as one batch
# item of the mono audio VAE), 32 latent channels, N latents at 40 per second (800 samples each at 32 kHz).
# A latents file holds them under AUDIO_KEY, with the sample rate they decode to in its metadata.
RELEASED_AUDIO = H3AudioDecoderConfig()
STEREO = 2
AUDIO_KEY = "audio_latents"
AUDIO_RATE_KEY = "audio_sample_rate"
DEFAULT_FPS = 24.0  # H3's frame rate: latents without fps metadata
# Frame rates ffmpeg's mp4 muxer takes (it fails below ~1e-4 fps); a range that covers any real video.
FPS_RANGE = (0.01, 1000.0)


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
        # One video (C, T, h, w), as denormalize_latents and save_latents take it, still needs its batch axis
        # here: the decoders' output always has one.
        hint = "; add the batch dimension: z[None] / z.unsqueeze(0)" if z.ndim == 4 else ""
        raise ValueError(f"latents must be {layout}, got shape {tuple(z.shape)}{hint}")
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


def check_audio_latents(z: torch.Tensor, channels: int | None) -> None:
    """Raise ValueError naming the problem for audio latents the audio decoder cannot take.

    z: (C, channels, N), C stereo channels (2 in H3), N >= 1 latents (40 per second), float32/float16/bfloat16/
    float64, on a device that holds data, finite and within +-LATENT_LIMIT; `channels`: the decoder's latent
    channels, or None to leave them unchecked.
    """
    channels_shown = channels or RELEASED_AUDIO.latent_channels
    layout = f"(2, {channels_shown}, N): the stereo channels, {channels_shown} latent channels, N latents"
    if not isinstance(z, torch.Tensor):
        raise ValueError(f"audio latents must be a torch.Tensor, got {type(z).__name__}")
    if z.ndim != 3 or (channels is not None and z.shape[1] != channels):
        raise ValueError(f"audio latents must be {layout}; got shape {tuple(z.shape)}{swapped_audio_axes(z.shape)}")
    if min(z.shape) == 0:
        raise ValueError(f"audio latents are empty: shape {tuple(z.shape)}")
    check_dtype(z.dtype)
    if z.is_meta:
        raise ValueError(
            "audio latents are on the meta device and hold no values; move real latents to 'cpu' or 'cuda'"
        )
    if not (z.abs() <= LATENT_LIMIT).all():  # one pass: NaN compares False, Inf is above the limit
        if not torch.isfinite(z).all():
            raise ValueError("audio latents contain NaN or Inf")
        raise ValueError(
            f"audio latents hold values up to {z.abs().max().item():.3g}, beyond +-{LATENT_LIMIT:g}: not H3 audio "
            "latents (normalised ones are about N(0, 1))"
        )


def swapped_audio_axes(shape: tuple[int, ...]) -> str:
    """A hint for audio latents stored as ComfyUI holds them, (B, 32, 2, N) or (32, 2, N)."""
    if tuple(shape[-3:-1]) == (RELEASED_AUDIO.latent_channels, STEREO) and len(shape) in (3, 4):
        take = "[0]" if len(shape) == 4 else ""
        return (
            f"; this looks like ComfyUI's audio layout (B, {RELEASED_AUDIO.latent_channels}, 2, N): pass "
            f"latents{take}.transpose(0, 1)"
        )
    return ""


def check_durations(frames: int, fps: float, audio_latents: int, latents_per_second: Fraction) -> None:
    """ValueError unless `audio_latents` audio latents go with `frames` video frames at `fps`, as the release
    pairs them: H3's pipeline makes round(frames / fps * latents_per_second) audio latents for a clip of
    `frames` frames, so the audio may differ from the video by at most half a latent (12.5 ms at 40 per second;
    at 24 fps it is never more than a third). Exact arithmetic: a rate on the boundary passes."""
    rate = Fraction(fps)
    video = Fraction(frames) / rate
    audio = Fraction(audio_latents) / latents_per_second
    if 2 * abs(audio - video) * latents_per_second <= 1:
        return
    expected = round(video * latents_per_second)
    matching = Fraction(frames) * latents_per_second / audio_latents
    raise ValueError(
        f"the audio lasts {float(audio):.4g} s ({audio_latents} latents at {float(latents_per_second):g} per second) "
        f"and the video {float(video):.4g} s ({frames} frames at {fps:g} fps): not one clip; {frames} frames at "
        f"{fps:g} fps go with {expected} audio latents (the nearest whole number; audio and video of one clip "
        f"differ by at most half a latent), and {audio_latents} audio latents with {frames} frames at "
        f"{float(matching):.6g} fps"
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


def check_fps(fps: float, where: str) -> None:
    """ValueError naming `where` for a frame rate outside FPS_RANGE (or not finite)."""
    low, high = FPS_RANGE
    if not (math.isfinite(fps) and low <= fps <= high):
        raise ValueError(f"{where} must be a frame rate between {low:g} and {high:g}, got {fps!r}")


def save_latents(
    path: str | os.PathLike, latents: torch.Tensor, fps: float | None = None, audio_latents: torch.Tensor | None = None
) -> Path:
    """Write a pipeline's normalised latents where `minimax-h3-decode` reads them: a `.safetensors` file with the
    tensor `latents` ((24, T, h, w) or (1, 24, T, h, w), saved float32 on the CPU) and `fps` (any real number
    the command takes: 0.01 to 1000) in its metadata.

    audio_latents: the clip's normalised audio latents exactly as H3's pipeline makes them, (2, 32, N) (the two
    stereo channels, left then right; 32 latent channels; N latents at 40 per second), saved float32 under
    `audio_latents`, with `audio_sample_rate` (32000) in the metadata. Their duration must be the video's
    (docs/audio.md, "Latents files"): N = round(F / fps * 40) for the F frames of T latents at `fps` (24 when
    None), as the release makes them. Any other layout is a ValueError naming the expected shape.

    path: a name ending in `.safetensors`, in a folder that exists. The latents must have H3's 24 channels.
    An existing file is replaced only by the complete new one, and keeps its permission bits; a new one gets
    those of a new file. Returns the path written."""
    shape = tuple(latents.shape) if isinstance(latents, torch.Tensor) else None
    if shape is None or len(shape) not in (4, 5) or (len(shape) == 5 and shape[0] != 1):
        raise ValueError(f"save_latents writes one video, (C, T, h, w) or (1, C, T, h, w); got shape {shape}")
    check_latents(latents.reshape(1, *shape[-4:]), channels=H3DecoderConfig().latent_channels)
    metadata = {}
    if fps is not None:
        if not isinstance(fps, numbers.Real) or isinstance(fps, bool):  # numpy's scalars are Real too
            raise ValueError(f"fps must be a number (a frame rate), got {type(fps).__name__} {str(fps)[:20]}")
        try:
            value = float(fps)
        except OverflowError:  # an int too large for a float
            value = float("inf")
        check_fps(value, "fps")
        metadata["fps"] = repr(value)
    tensors = {"latents": latents.detach().float().cpu().contiguous()}
    if audio_latents is not None:
        tensors[AUDIO_KEY] = _checked_audio(audio_latents, shape[-3], float(metadata.get("fps", DEFAULT_FPS)))
        metadata[AUDIO_RATE_KEY] = str(RELEASED_AUDIO.sample_rate)
    path = Path(os.fspath(path))
    if path.suffix.lower() != ".safetensors":
        raise ValueError(
            f"{shown(path)}: save_latents writes a .safetensors file, what minimax-h3-decode reads; give a name "
            f"ending in .safetensors, like {shown(path.with_suffix('.safetensors'))}"
        )
    path = resolve_output(path)  # a symbolic link is written through
    if path.is_dir():
        raise ValueError(f"{shown(path)}: is a folder; give a file name")
    if not path.parent.is_dir():
        there = "is not a folder" if path.parent.exists() else "the folder does not exist; create it first"
        raise ValueError(f"{shown(path.parent)}: {there}")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = None
    try:
        if mode is None:
            mode = new_file_mode(path.parent)  # what open() gives a new file (the library writes its files 0600)
        temp = create_temp(path)
    except OSError as error:
        raise ValueError(
            f"{shown(path.parent)}: cannot create a file there ({error.strerror}); choose a writable folder"
        ) from None
    try:
        save_file(tensors, str(temp), metadata=metadata or None)
        os.chmod(temp, mode)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return path


def _checked_audio(audio_latents: torch.Tensor, video_latents: int, fps: float) -> torch.Tensor:
    """save_latents' audio latents, float32 on the CPU, after the checks its docstring names."""
    expected = (STEREO, RELEASED_AUDIO.latent_channels)
    shape = tuple(audio_latents.shape) if isinstance(audio_latents, torch.Tensor) else None
    if shape is None or len(shape) != 3 or shape[:2] != expected:
        hint = swapped_audio_axes(shape) if shape is not None else ""
        raise ValueError(
            f"audio_latents must be (2, {expected[1]}, N) as H3's pipeline makes them (the two stereo channels, "
            f"{expected[1]} latent channels, N latents at 40 per second); got "
            f"{'shape ' + str(shape) if shape is not None else type(audio_latents).__name__}{hint}"
        )
    check_audio_latents(audio_latents, expected[1])
    frames = plan_chunks(video_latents, H3DecoderConfig()).out_frames
    check_durations(frames, fps, shape[2], Fraction(RELEASED_AUDIO.sample_rate, RELEASED_AUDIO.hop_length))
    return audio_latents.detach().float().cpu().contiguous()


def load_latents(path: str | os.PathLike) -> tuple[torch.Tensor, float | None, torch.Tensor | None]:
    """The latents of a file the command reads (`save_latents`'s, a ComfyUI `.latent`, a file with one
    tensor): (latents (1, C, T, h, w) float32 as stored, normalised unless they were saved raw; the `fps` of
    its metadata, or None; the audio latents (2, 32, N) float32 as stored, normalised, or None when the file
    holds none). ValueError naming the problem, as the command reports it."""
    source = read_latents_header(Path(os.fspath(path)))
    audio = read_audio_latents(source) if source.audio is not None else None
    return read_latents(source), source.fps, audio


# ComfyUI's SaveLatent writes `.latent` files: the LATENT's samples under this key (H3's normalised latents,
# as ComfyUI holds them), beside an empty marker tensor for its format version.
COMFYUI_KEY = "latent_tensor"
COMFYUI_VERSION_KEY = "latent_format_version_0"


@dataclass(frozen=True)
class AudioEntry:
    """What the header of a latents file says of its audio latents."""

    shape: tuple[int, ...]  # (2, C, N)
    sample_rate: int | None  # the metadata's audio_sample_rate: what they decode to, in Hz


@dataclass(frozen=True)
class LatentsFile:
    """What the header of a latents file says, before any tensor data is read."""

    path: Path
    key: str | None  # None: the file holds audio latents alone (read with video=False)
    shape: tuple[int, ...] | None  # (C, T, h, w); None with key
    fps: float | None
    audio: AudioEntry | None = None  # the audio latents (key AUDIO_KEY), when they were asked for and are there


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


def read_latents_header(path: Path, audio: bool = True, video: bool = True) -> LatentsFile:
    """The latents' tensor name (`latents`; `latent_tensor` of a ComfyUI `.latent` file; or the file's only
    tensor besides the audio latents), shape and fps metadata, and with `audio` the audio latents' entry
    (`audio_latents`, if any), from the header alone; ValueError naming the problem if the decoders cannot take
    them. The file's other tensors are not looked at beyond their header entries.

    With `video` False (the sound alone is wanted) a file that holds audio latents and no other tensor is
    taken too: its LatentsFile has key and shape None. With `video` True such a file is a ValueError."""
    check_latents_path(path)
    name = shown(path)
    header = read_checked_header(path, name, ValueError, "give a latents .safetensors file")
    keys = [key for key in header.tensors if key not in (COMFYUI_VERSION_KEY, AUDIO_KEY)]
    if not keys and AUDIO_KEY in header.tensors:
        if video:
            raise ValueError(
                f"{name}: holds audio latents ({AUDIO_KEY!r}) and no video latents ('latents') to decode; write "
                "the sound alone to a .wav or .flac, or give a file that holds the video latents too"
            )
        return LatentsFile(path, None, None, _fps(name, header), _audio_entry(name, header) if audio else None)
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
    entry = _audio_entry(name, header) if audio and AUDIO_KEY in header.tensors else None
    return LatentsFile(path, key, shape, _fps(name, header), entry)


def _fps(name: str, header) -> float | None:
    """The metadata's fps, or None when there is none; ValueError for one that is not a frame rate."""
    if "fps" not in header.metadata:
        return None
    try:
        fps = parse_number(header.metadata["fps"])
    except ValueError:
        fps = None
    if fps is None or not 0 < fps < float("inf"):
        raise ValueError(
            f"{name}: metadata fps={header.metadata['fps']!r} is not a positive number written in digits; "
            "fix it or pass --fps"
        )
    return fps


def _audio_entry(name: str, header) -> AudioEntry:
    """The header's `audio_latents` entry and `audio_sample_rate`, checked as far as a header tells."""
    entry = header.tensors[AUDIO_KEY]
    shape = tuple(entry.shape)
    if len(shape) != 3 or shape[0] != STEREO:
        raise ValueError(
            f"{name}: {AUDIO_KEY} must be (2, {RELEASED_AUDIO.latent_channels}, N) as H3's pipeline makes them (the "
            f"two stereo channels, the latent channels, N latents), got {shape}{swapped_audio_axes(shape)}; pass "
            "--no-audio to decode the video alone"
        )
    if min(shape) == 0:
        raise ValueError(f"{name}: {AUDIO_KEY} are empty: shape {shape}; pass --no-audio to decode the video alone")
    dtype = entry.torch_dtype
    try:
        if dtype is None:
            raise ValueError(f"audio latents must be floating point, got {entry.dtype}")
        check_dtype(dtype)
    except ValueError as error:
        raise ValueError(f"{name}: {error} (tensor {AUDIO_KEY!r})") from None
    rate = None
    if AUDIO_RATE_KEY in header.metadata:
        try:
            rate = parse_whole(header.metadata[AUDIO_RATE_KEY])
        except ValueError:
            rate = None
        if rate is None or not 1 <= rate <= 10**6:
            raise ValueError(
                f"{name}: metadata {AUDIO_RATE_KEY}={header.metadata[AUDIO_RATE_KEY]!r} is not a sample rate in Hz "
                f"(a whole number from 1 to 1000000, {RELEASED_AUDIO.sample_rate} for H3); fix it, or pass "
                "--no-audio to decode the video alone"
            )
    return AudioEntry(shape, rate)


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


def read_audio_latents(source: LatentsFile) -> torch.Tensor:
    """The audio latents (2, C, N) as float32; ValueError for an unreadable file, NaN or Inf. Only their own bytes
    are read (the header read again: the file may have changed since)."""
    name = shown(source.path)
    try:
        header = read_header(source.path)
        entry = header.tensors.get(AUDIO_KEY)
        if entry is None or entry.torch_dtype is None or tuple(entry.shape) != source.audio.shape:
            raise ValueError("it changed since its header was read")
        audio = read_tensor(source.path, header, AUDIO_KEY)
    except (OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or error
        raise ValueError(f"{name}: not a readable .safetensors file ({reason})") from None
    try:
        check_audio_latents(audio, channels=None)
    except ValueError as error:
        raise ValueError(f"{name}: {error}; pass --no-audio to decode the video alone") from None
    return audio.float()
