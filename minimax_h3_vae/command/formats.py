"""What OUT can be, and what the rest of the output code is handed: the formats and their limits, the video's
and the sound's descriptions (`VideoFormat`, `SoundFormat`, `Soundtrack`), and their bytes as written."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

OUTPUT_FORMATS = (".mp4", ".safetensors", ".wav", ".flac")
AUDIO_FORMATS = (".wav", ".flac")  # the sound alone: the video is not decoded
CRF_RANGE = (0, 51)  # libx264, 8 bit; 0 is lossless (written as RGB, see mux.Mp4Sink)
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
# x264's "faster" rather than ffmpeg's "medium": at crf 17 on generated video it encodes 1.7-1.8x as fast, for a
# PSNR 0.2 dB lower and a file no larger (benchmarks/LOG.md, 2026-12-04-x264-presets), which takes the encoder
# off the decode's critical path on a GPU machine's host.
DEFAULT_PRESET = "faster"
# The formats that need ffmpeg, and what to write instead when it is missing.
WITHOUT_FFMPEG = {
    ".mp4": "write a .safetensors file (the frames and the sound, no ffmpeg needed)",
    ".flac": "write a .wav (no ffmpeg needed)",
}


@dataclass(frozen=True)
class VideoFormat:
    """What OUT takes of the video: `frames` frames of height x width at `fps`, and for an mp4 the encoder's
    crf and x264 preset."""

    frames: int
    height: int
    width: int
    fps: float
    crf: int = 17
    preset: str = DEFAULT_PRESET


@dataclass(frozen=True)
class SoundFormat:
    """What the preflight knows of the sound before it is decoded: `channels` x `samples` at `sample_rate` Hz."""

    channels: int
    samples: int
    sample_rate: int

    @property
    def seconds(self) -> float:
        return self.samples / self.sample_rate


@dataclass(frozen=True)
class Soundtrack:
    """Decoded sound for an output: `samples` float32 (C, S) on the CPU, values in [-1, 1], the channels in
    order (H3: left, right), at `sample_rate` Hz."""

    samples: torch.Tensor
    sample_rate: int

    @property
    def format(self) -> SoundFormat:
        return SoundFormat(self.samples.shape[0], self.samples.shape[1], self.sample_rate)

    def interleaved(self) -> torch.Tensor:
        """The samples as bytes, uint8 (S * C * 4,): float32, little-endian, one sample of every channel
        after the other (what ffmpeg's f32le and WAV's data chunk hold)."""
        return self.samples.T.contiguous().view(torch.uint8).flatten()


def raw_bytes(frames: int, height: int, width: int) -> int:
    """The size of `frames` uint8 RGB frames of height x width."""
    return frames * height * width * 3


def tensor_bytes(frames: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU uint8 tensor, without a copy and without numpy (the caller keeps
    `frames` alive while the view is used)."""
    return memoryview((ctypes.c_uint8 * frames.numel()).from_address(frames.data_ptr())).cast("B")
