"""A finished file read back by ffmpeg, to verify it before it may replace OUT: its video frames and the samples
its sound covers, counted from the packets in one pass (a stream copy, nothing decoded)."""

from __future__ import annotations

import subprocess
from fractions import Fraction
from pathlib import Path

from .encoder import ffmpeg_exe


def _packets(path: Path) -> list[bytes] | None:
    """ffmpeg's framecrc of a finished file's first video and first audio stream (each if it has one), by stream
    copy (no decode): its header lines (`#`) and one line per packet, whatever ffmpeg prints as progress; None if
    it cannot be read."""
    maps = ["-map", "0:v:0?", "-map", "0:a:0?"]
    result = subprocess.run(
        [ffmpeg_exe(), "-nostdin", "-v", "error", "-i", str(path), *maps, "-c", "copy", "-f", "framecrc", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    if result.returncode:
        return None
    return [line for line in result.stdout.splitlines() if line.strip()]


def read_back(path: Path) -> tuple[int | None, int | None]:
    """(video frames, samples per channel of the sound) of a finished file, each None where the file has no such
    stream or cannot be read. The frames are counted from the video packets; the samples are the end of the
    last audio packet (pts + duration, in the stream's time base, which is 1 / its sample rate in mp4 and FLAC)
    counted from 0, the start of the sound (the encoder's priming packets sit before it)."""
    lines = _packets(path) or []
    headers = [line[1:].split(b":", 1) for line in lines if line.startswith(b"#") and b":" in line]
    fields = {}  # (name, stream index) -> value, e.g. (b"media_type", b"1") -> b"audio"
    for key, value in headers:
        name, _, index = key.partition(b" ")
        fields[name, index] = value.strip()
    streams = {fields[key]: key[1] for key in fields if key[0] == b"media_type"}
    packets = [line.split(b",") for line in lines if not line.startswith(b"#")]
    frames = samples = None
    if b"video" in streams:
        frames = sum(1 for packet in packets if packet[0].strip() == streams[b"video"])
    audio = streams.get(b"audio")
    ours = [packet for packet in packets if packet[0].strip() == audio]
    if ours and (b"tb", audio) in fields and (b"sample_rate", audio) in fields:
        end = (int(ours[-1][2]) + int(ours[-1][3])) * Fraction(fields[b"tb", audio].decode())  # seconds
        samples = round(end * int(fields[b"sample_rate", audio]))
    return frames, samples
