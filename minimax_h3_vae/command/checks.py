"""OUT checked before any work (preflight.py calls these, cheapest first): its name and format, its folder
takes a file, it is not one of the inputs, the disk has room, and the encoder takes the settings. Each
refusal is a ValueError whose message is the command's `error:` line."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import torch

from ..files import check_length, create_temp
from ..text import shown
from .colour import yuv420p_bytes
from .encoder import AAC_FRAME, encoder_command, ffmpeg_exe, flac_command, flac_samples, sound_file
from .formats import OUTPUT_FORMATS, WITHOUT_FFMPEG, SoundFormat, Soundtrack, raw_bytes
from .sinks import WAV_HEADER_BYTES, WAV_MAX_DATA

# The least space an mp4 of F frames can take, as a share of its raw RGB size: for the preflight only, so
# a full disk is found in a second; a disk that fills up while writing is still caught by the writer.
MP4_MIN_SHARE = 1 / 50


def check_output_name(output: Path) -> None:
    """ValueError for an output this command cannot write (format, length, folder), before anything is read."""
    name = shown(output)
    formats = f"{', '.join(OUTPUT_FORMATS[:-1])} or {OUTPUT_FORMATS[-1]}"
    if _is_folder(output):
        example = shown(output / "video.mp4")
        raise ValueError(f"{name}: is a folder; give a file name ending in {formats} (like {example})")
    if output.suffix == "" and output.name.lower() in OUTPUT_FORMATS:
        raise ValueError(f"{name}: has no name before its extension; give one, like video{output.name.lower()}")
    if output.suffix == "":
        raise ValueError(f"{name}: has no extension, which says the output format; give a name ending in {formats}")
    if output.suffix.lower() not in OUTPUT_FORMATS:
        raise ValueError(f"{name}: unknown output format {output.suffix!r}; use one of {formats}")
    check_length(output)
    if not output.parent.is_dir():
        raise ValueError(f"{shown(output.parent)}: output folder does not exist; create it first")
    if output.exists() and not output.is_file():
        raise ValueError(f"{name}: exists and is not a regular file; give a file name")
    if output.suffix.lower() in WITHOUT_FFMPEG:
        ffmpeg_exe(output.suffix.lower())


def _is_folder(path: Path) -> bool:
    """Whether `path` is a folder (or a link to one); False for a path that cannot be looked up (too long, say),
    which the later checks name."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


def same_file(a: Path, b: Path) -> bool:
    """Whether `a` and `b` are one file (links included); False when either cannot be looked up."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def checkpoint_files(model: str, checkpoint) -> list[Path]:
    """Every file the checkpoint is read from: its weights and, for a local path, everything under it."""
    files = list(checkpoint.files.values())
    path = Path(model).expanduser()
    if path.is_file():
        files.append(path)
    elif path.is_dir():
        files += [Path(root) / name for root, _, names in os.walk(path) for name in names]
    return files


def probe_folder(output: Path) -> None:
    """ValueError when OUT's folder does not take a new file (a real create-and-remove, not a permission
    guess: root, read-only mounts and ACLs all answer here), or when an existing OUT could not be replaced:
    another user's file in a sticky folder such as /tmp."""
    try:
        os.unlink(create_temp(output))
    except OSError as error:
        raise ValueError(
            f"{shown(output.parent)}: cannot create the output there ({error.strerror}); choose a writable folder"
        ) from None
    try:
        folder, existing = os.stat(output.parent), os.stat(output)
    except OSError:
        return
    uid = os.geteuid()
    if folder.st_mode & stat.S_ISVTX and uid not in (0, folder.st_uid, existing.st_uid):
        raise ValueError(
            f"{shown(output)}: belongs to another user in a sticky folder, so it cannot be replaced; "
            "choose another name"
        )


def least_bytes(output: Path, frames: int, height: int, width: int, sound: SoundFormat | None = None) -> int:
    """The least free space the output needs: exact for .safetensors and .wav, a lower bound for mp4 (its
    video's; AAC adds to it) and none for .flac (silence packs into almost nothing)."""
    raw = raw_bytes(frames, height, width)
    samples = 0 if sound is None else sound.channels * sound.samples * 4
    suffix = output.suffix.lower()
    if suffix == ".safetensors":
        return raw + samples + 512  # the header, at most
    if suffix == ".wav":
        return WAV_HEADER_BYTES + samples
    return 0 if suffix == ".flac" else int(raw * MP4_MIN_SHARE)


def check_free_space(output: Path, needed: int) -> None:
    """ValueError when OUT's folder has less than `needed` bytes free."""
    from ..memory import format_size

    free = shutil.disk_usage(output.parent).free
    if free < needed:
        raise ValueError(
            f"{shown(output.parent)}: {format_size(free)} free, the output needs at least {format_size(needed)}; "
            "free some space or write elsewhere"
        )


def check_encoder(
    output: Path, width: int, height: int, fps: float, crf: int, preset: str, sound: SoundFormat | None = None
) -> None:
    """For mp4 and .flac output, ValueError with ffmpeg's own reason when the encoder refuses these settings (a
    frame size libx264 does not take, a sample rate the audio encoder does not): one black frame and one AAC
    frame of silence (or the FLAC encoder alone) are encoded to nowhere, before any decoding. For .wav, a
    ValueError for more sound than a WAV file's 32-bit sizes hold."""
    suffix = output.suffix.lower()
    if suffix == ".wav" and sound is not None and sound.channels * sound.samples * 4 > WAV_MAX_DATA:
        raise ValueError(f"{shown(output)}: {sound.seconds:.0f} s of sound exceed a WAV file's 4 GiB; write a .flac")
    if suffix not in (".mp4", ".flac"):
        return
    silence = None if sound is None else Soundtrack(torch.zeros(sound.channels, AAC_FRAME), sound.sample_rate)
    files = ()
    if suffix == ".flac":
        command, data = flac_command(silence), flac_samples(silence)
        what = f"{sound.sample_rate} Hz sound of {sound.channels} channels"
    else:
        files = (sound_file(silence, output.parent),) if silence is not None else ()
        command = [*encoder_command(width, height, fps, crf, preset, sound, files), "-frames:v", "1"]
        data = bytes(width * height * 3 if crf == 0 else yuv420p_bytes(height, width))
        what = f"{width}x{height} frames" + (f" and {sound.sample_rate} Hz sound" if sound is not None else "")
    try:
        result = subprocess.run(
            [*command, "-f", "null", "-"],
            input=data,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=[file.fileno() for file in files],
        )
    finally:
        for file in files:
            file.close()
    if result.returncode:
        lines = [line.strip() for line in result.stderr.decode(errors="replace").splitlines() if line.strip()]
        reasons = "; ".join(lines[-2:]) or f"exit status {result.returncode}"
        raise ValueError(f"{shown(output)}: ffmpeg cannot encode {what} with these settings ({reasons})")
