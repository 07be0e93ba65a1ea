"""What ffmpeg is run with: its binary (imageio-ffmpeg's), the mp4 encoder's command line and the sound file
it reads, the FLAC encoder's command line and samples. The preflight's trial encode (checks.py) and the
writers (mux.py, sinks.py) build ffmpeg's commands here alone, so the trial tries what the writer will run."""

from __future__ import annotations

import os
import tempfile
from fractions import Fraction
from pathlib import Path

import torch

from .formats import WITHOUT_FFMPEG, SoundFormat, Soundtrack, tensor_bytes

# How to get ffmpeg: the package is installed from a checkout (it is not on the package index).
VIDEO_INSTALL = 'pip install imageio-ffmpeg, or in the checkout pip install -e ".[video]"'
# What the yuv420p frames sent to ffmpeg are (colour.py), said to ffmpeg twice. On the input: ffmpeg
# negotiates colour spaces in its filter graph (imageio-ffmpeg's 9.0 does), and untagged planes would be
# converted by swscale to the tagged output (BT.601 read as BT.709: red's Y' 63 became 58); tagged, nothing
# is converted and the frames carry the tags to the encoder. On the output: for an ffmpeg that takes them
# from the encoder's options (9.0 takes primaries and transfer from the frames only). libx264 writes them
# into the H.264 VUI, the mp4 muxer into its colr box. Left siting is H.264's default (x264 signals no
# chroma location for it; decoders assume it), so naming it changes no byte; it says what the planes hold.
BT709_TAGS = ["-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709", "-color_range", "tv"]
BT709_TAGS += ["-chroma_sample_location", "left"]
# The mp4's sound: AAC-LC by ffmpeg's own encoder at the decoder's rate (32 kHz is one of AAC's sampling rates,
# so nothing is resampled), 192 kb/s for the two channels. An AAC frame holds 1024 samples per channel.
AAC_BITRATE = "192k"
AAC_FRAME = 1024
# The sound reaches ffmpeg as raw little-endian float32 samples, interleaved (left, right, left, ...): the mp4's
# second input, from a file written before ffmpeg starts (`sound_file`).
SOUND_INPUT = ["-f", "f32le"]
# A .flac holds 24-bit samples: the float samples are rounded in torch (`flac_samples`), so ffmpeg converts
# nothing.
FLAC_BITS = 24


def ffmpeg_exe(suffix: str = ".mp4") -> str:
    """The ffmpeg binary of imageio-ffmpeg; ValueError naming the install command, and the format to write
    instead of `suffix` (".mp4" or ".flac"), when it is missing."""
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except Exception:  # ImportError, or an install whose binary is gone (imageio-ffmpeg raises RuntimeError)
        raise ValueError(
            f"{suffix} output needs ffmpeg, from imageio-ffmpeg: {VIDEO_INSTALL}; or {WITHOUT_FFMPEG[suffix]}"
        ) from None


def encoder_command(
    width: int,
    height: int,
    fps: float,
    crf: int,
    preset: str,
    sound: SoundFormat | None = None,
    files: tuple = (),
) -> list[str]:
    """ffmpeg reading raw frames from stdin and encoding H.264 (see mux.Mp4Sink). crf 1-51: BT.709
    limited-range yuv420p planes in (colour.py), encoded by libx264 as they are (the same pix_fmt in and out,
    the same tags: no conversion), the stream tagged bt709 / tv. crf 0: rgb24 in, libx264rgb, RGB 4:4:4,
    lossless. With `sound`, its samples are the second input, read from `files[0]` (`sound_file`, inherited
    by ffmpeg under its own descriptor number), and encoded to AAC."""
    codec, pix_fmt, tags = ("libx264rgb", "rgb24", []) if crf == 0 else ("libx264", "yuv420p", BT709_TAGS)
    command = [ffmpeg_exe(), "-y", "-f", "rawvideo", "-vcodec", "rawvideo", "-s", f"{width}x{height}"]
    command += ["-pix_fmt", pix_fmt, *tags, "-r", str(Fraction(fps).limit_denominator()), "-i", "-"]
    if sound is None:
        command += ["-an"]
    else:
        rate, channels = str(sound.sample_rate), str(sound.channels)
        command += [*SOUND_INPUT, "-ar", rate, "-ac", channels, "-i", f"pipe:{files[0].fileno()}"]
        command += ["-map", "0:v:0", "-map", "1:a:0", "-c:a", "aac", "-b:a", AAC_BITRATE]
    command += ["-vcodec", codec, "-pix_fmt", pix_fmt, *tags, "-v", "error", "-crf", str(crf)]
    return command + ["-preset", preset]


def sound_file(sound: Soundtrack, folder: Path):
    """The sound's interleaved samples in an unnamed file, read from its start: in memory (memfd), else an
    unnamed file in `folder`. ffmpeg reads it as its second input while the frames come through its stdin,
    so neither input waits on the other, and nothing is left behind whatever happens."""
    if hasattr(os, "memfd_create"):
        file = os.fdopen(os.memfd_create("minimax-h3-sound"), "w+b")
    else:
        file = tempfile.TemporaryFile(dir=folder)
    try:
        data = sound.interleaved()
        file.write(tensor_bytes(data))
        file.flush()
        file.seek(0)
    except BaseException:
        file.close()
        raise
    return file


def flac_command(sound: Soundtrack) -> list[str]:
    """ffmpeg reading `flac_samples` from stdin and writing FLAC of FLAC_BITS bits (to the path appended)."""
    rate, channels = str(sound.sample_rate), str(sound.samples.shape[0])
    command = [ffmpeg_exe(".flac"), "-y", "-f", "s32le", "-ar", rate, "-ac", channels, "-i", "-", "-c:a", "flac"]
    return command + ["-sample_fmt", "s32", "-bits_per_raw_sample", str(FLAC_BITS), "-v", "error"]


def flac_samples(sound: Soundtrack) -> bytes:
    """The samples as FLAC_BITS-bit integers in the top bits of 32-bit ones (what ffmpeg's FLAC encoder keeps of
    s32 input), interleaved, little-endian."""
    top = 2 ** (FLAC_BITS - 1)
    levels = torch.round(sound.samples.double() * top).clamp(-top, top - 1).to(torch.int32) * 2 ** (32 - FLAC_BITS)
    return levels.T.contiguous().numpy().tobytes()
