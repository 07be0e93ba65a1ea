"""A finished file read back by ffmpeg, to verify it before it may replace OUT: its video frames and the
samples its sound covers, counted from the packets (a stream copy, nothing decoded)."""

from __future__ import annotations

import subprocess
from fractions import Fraction
from pathlib import Path

from .encoder import ffmpeg_exe


def _packets(path: Path, stream: str) -> list[bytes] | None:
    """ffmpeg's framecrc of one stream of a finished file, by stream copy (no decode): its header lines (`#`)
    and one line per packet, whatever ffmpeg prints as progress; None if it cannot be read."""
    result = subprocess.run(
        [ffmpeg_exe(), "-nostdin", "-v", "error", "-i", str(path), "-map", stream, "-c", "copy", "-f", "framecrc", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    if result.returncode:
        return None
    return [line for line in result.stdout.splitlines() if line.strip()]


def count_mp4_frames(path: Path) -> int | None:
    """Video frames of a finished mp4, counted from its packets; None if it cannot be read."""
    lines = _packets(path, "0:v:0")
    return None if lines is None else sum(1 for line in lines if not line.startswith(b"#"))


def count_audio_samples(path: Path) -> int | None:
    """Samples per channel that the first audio stream of a finished file covers: the end of its last packet
    (pts + duration, in the stream's time base, which is 1 / its sample rate in mp4 and FLAC) counted from 0,
    the start of the sound (the encoder's priming packets sit before it); None without an audio stream."""
    lines = _packets(path, "0:a:0?") or []
    packets = [line.split(b",") for line in lines if not line.startswith(b"#")]
    base = [line.split(b":")[1] for line in lines if line.startswith(b"#tb 0:")]
    rate = [line.split(b":")[1] for line in lines if line.startswith(b"#sample_rate 0:")]
    if not packets or not base or not rate:
        return None
    end = (int(packets[-1][2]) + int(packets[-1][3])) * Fraction(base[0].strip().decode())  # seconds
    return round(end * int(rate[0]))
