"""Every writer of OUT except the mp4's (mux.py): `Sink`, the base of every writer that takes the frames as they
are decoded; `SafetensorsSink`, the frames and the sound in a .safetensors file; `WavSink` and `FlacSink`, the
sound alone. A writer of frames is given the sound whole before the first frame: when it opens, or, where the sound
is still being decoded beside the video (command/sound.py), by `Sink.begin` once it is."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

from ..frames import to_uint8_frames
from ..text import shown
from . import readback
from .commit import OutputFile, WriteError
from .encoder import flac_command, flac_samples
from .formats import SoundFormat, Soundtrack, raw_bytes, tensor_bytes


class Sink(OutputFile):
    """An OutputFile that receives `frames` frames of height x width, as uint8 tensors (f, *frame_shape): RGB
    (f, H, W, 3) unless a subclass takes another format (see `convert`), and the clip's sound: a `Soundtrack`
    (or None for no sound) when it opens, or a `SoundFormat` that announces a sound still being decoded, handed
    over by `begin` before the first frame. Each kind defines `start`, which writes what goes before the frames
    (the sound), and `write_bytes`, which writes the bytes of frames `write` has checked."""

    def __init__(
        self, output: Path, frames: int, height: int, width: int, sound: Soundtrack | SoundFormat | None = None
    ):
        self.frames, self.height, self.width = frames, height, width
        self.frame_shape = (height, width, 3)
        self.written = 0
        self.sound_format: SoundFormat | None = sound.format if isinstance(sound, Soundtrack) else sound
        self.begun = False
        super().__init__(output)

    def opened(self, sound: Soundtrack | SoundFormat | None) -> None:
        """The end of a kind's __init__: `begin` at once with a decoded sound (or None); with a SoundFormat the
        sink waits for `begin`. A sink that fails to begin here removes its temporary file."""
        if isinstance(sound, SoundFormat):
            return
        try:
            self.begin(sound)
        except WriteError:
            self.discard()
            raise

    def begin(self, sound: Soundtrack | None) -> None:
        """Hand over the decoded sound (None for a clip without one) before the first frame. WriteError if it is
        not the sound announced when the sink opened, or if writing it fails."""
        got = None if sound is None else sound.format
        if got != self.sound_format:
            raise WriteError(
                f"{shown(self.output)}: the decoded sound has {_samples(got)}, the output was opened for "
                f"{_samples(self.sound_format)}"
            )
        self.start(sound)
        self.begun = True

    def start(self, sound: Soundtrack | None) -> None:
        raise NotImplementedError

    def convert(self, video: torch.Tensor) -> torch.Tensor:
        """Decoder output of one chunk, (1, 3, f, H, W) or (3, f, H, W), ImageNet-normalised, on any device
        -> the frames `write` takes, on the same device (so a CUDA chunk is converted before it is copied):
        here uint8 RGB (f, H, W, 3), rounded."""
        return to_uint8_frames(video)

    def write(self, frames: torch.Tensor) -> None:
        """frames: uint8 (f, *frame_shape) on the CPU, as `convert` makes them."""
        if not self.begun:
            raise ValueError("the sink takes frames once `begin` has handed it the sound")
        if frames.dtype != torch.uint8 or tuple(frames.shape[1:]) != self.frame_shape:
            expected = ", ".join(str(size) for size in ("f", *self.frame_shape))
            raise ValueError(f"frames must be uint8 ({expected}), got {frames.dtype} {tuple(frames.shape)}")
        if self.written + frames.shape[0] > self.frames:
            raise WriteError(f"{shown(self.output)}: more frames than the {self.frames} announced")
        frames = frames.contiguous()
        try:
            self.write_bytes(tensor_bytes(frames))
        except OSError as error:
            raise WriteError(self.failure(error)) from None
        self.written += frames.shape[0]

    def commit(self) -> None:
        if self.written != self.frames:
            raise WriteError(f"{shown(self.output)}: {self.written} of {self.frames} frames were written")
        super().commit()

    def write_bytes(self, data: memoryview) -> None:
        raise NotImplementedError


def _samples(sound: SoundFormat | None) -> str:
    return "no sound" if sound is None else f"{sound.channels} x {sound.samples} samples at {sound.sample_rate} Hz"


class SafetensorsSink(Sink):
    """`{"video": uint8 (F, H, W, 3)}` in the safetensors format, with `sound` also `"audio"`: float32 (C, S)
    and `audio_sample_rate` in the metadata; byte for byte what `save_file` writes: the header is known from
    the frame count and the sound's format, so it is written when the sink opens, the sound goes first (at
    `begin`) and the frames go to disk as they arrive (host memory flat in the clip's length).

    Each chunk is synced to disk as it is written (in the writer thread, beside the decode), so the fsync
    before the rename has almost nothing left to do. The temporary file is opened without truncating it:
    on ext4 a truncated file is flushed whole when it is closed, which cost 0.3 s per 750 MB on the H200's
    disk at the end of the run.
    """

    def __init__(
        self, output: Path, frames: int, height: int, width: int, sound: Soundtrack | SoundFormat | None = None
    ):
        super().__init__(output, frames, height, width, sound)
        size, announced = raw_bytes(frames, height, width), self.sound_format
        # save_file's layout: the metadata first, then the tensors by dtype, widest first (audio before video).
        entries, start, self.shapes = {}, 0, {"video": [frames, height, width, 3]}
        if announced is not None:
            self.shapes["audio"] = [announced.channels, announced.samples]
            start = announced.channels * announced.samples * 4
            entries["__metadata__"] = {"audio_sample_rate": str(announced.sample_rate)}
            entries["audio"] = {"dtype": "F32", "shape": self.shapes["audio"], "data_offsets": [0, start]}
        entries["video"] = {"dtype": "U8", "shape": self.shapes["video"], "data_offsets": [start, start + size]}
        header = json.dumps(entries, separators=(",", ":")).encode()
        header += b" " * (-len(header) % 8)  # safetensors pads the header to 8 bytes with spaces
        self.size = 8 + len(header) + start + size
        self.handle = None
        try:
            self.handle = open(self.temp, "r+b")  # created empty by Sink; see above for why not "wb"
            self.handle.write(len(header).to_bytes(8, "little") + header)
        except OSError as error:
            self.discard()
            raise WriteError(self.failure(error)) from None
        self.opened(sound)

    def start(self, sound: Soundtrack | None) -> None:
        if sound is not None:
            samples = sound.samples.contiguous().view(torch.uint8).flatten()  # alive while its bytes are written
            try:
                self.write_bytes(tensor_bytes(samples))
            except OSError as error:
                raise WriteError(self.failure(error)) from None

    def write_bytes(self, data: memoryview) -> None:
        self.handle.write(data)
        self.handle.flush()
        os.fdatasync(self.handle.fileno())

    def finish(self) -> None:
        self.handle.close()
        if self.temp.stat().st_size != self.size:
            raise WriteError(f"{shown(self.output)}: wrote {self.temp.stat().st_size} bytes, expected {self.size}")
        from ..reader import read_header

        try:
            tensors = read_header(self.temp).tensors
        except ValueError as error:
            raise WriteError(f"{shown(self.output)}: the written file does not read back ({error})") from None
        for name, expected in self.shapes.items():
            shape = list(tensors[name].shape) if name in tensors else None
            if shape != expected:
                raise WriteError(f"{shown(self.output)}: the written header reads back {name} as shape {shape}")

    def abort(self) -> None:
        if self.handle is not None:
            self.handle.close()


# The WAV header of WavSink: RIFF, `fmt ` (18 bytes, IEEE float), `fact` (the sample count), `data`.
WAV_HEADER_BYTES = 12 + 8 + 18 + 8 + 4 + 8
WAV_IEEE_FLOAT = 3
WAV_MAX_DATA = 2**32 - 1 - (WAV_HEADER_BYTES - 8)  # RIFF sizes are 32-bit


class WavSink(OutputFile):
    """The sound alone, as a WAV file of 32-bit float samples (WAVE_FORMAT_IEEE_FLOAT, interleaved): exactly the
    decoded samples. The whole file is written at `commit`, then verified by its size."""

    def __init__(self, output: Path, sound: Soundtrack):
        self.sound, self.handle = sound, None  # at most WAV_MAX_DATA bytes of samples (checks.check_encoder)
        super().__init__(output)

    def header(self) -> bytes:
        channels, samples = self.sound.samples.shape
        rate, data = self.sound.sample_rate, self.sound.samples.numel() * 4
        fmt = b"".join(
            [
                WAV_IEEE_FLOAT.to_bytes(2, "little"),
                channels.to_bytes(2, "little"),
                rate.to_bytes(4, "little"),
                (rate * channels * 4).to_bytes(4, "little"),  # bytes per second
                (channels * 4).to_bytes(2, "little"),  # bytes per sample frame
                (32).to_bytes(2, "little"),  # bits per sample
                (0).to_bytes(2, "little"),  # no extension
            ]
        )
        chunks = b"".join(
            [
                b"fmt " + len(fmt).to_bytes(4, "little") + fmt,
                b"fact" + (4).to_bytes(4, "little") + samples.to_bytes(4, "little"),
                b"data" + data.to_bytes(4, "little"),
            ]
        )
        return b"RIFF" + (4 + len(chunks) + data).to_bytes(4, "little") + b"WAVE" + chunks

    def finish(self) -> None:
        data = self.sound.interleaved()
        with open(self.temp, "r+b") as self.handle:
            self.handle.write(self.header())
            self.handle.write(tensor_bytes(data))
        size = WAV_HEADER_BYTES + data.numel()
        if self.temp.stat().st_size != size:
            raise WriteError(f"{shown(self.output)}: wrote {self.temp.stat().st_size} bytes, expected {size}")

    def abort(self) -> None:
        if self.handle is not None:
            self.handle.close()


class FlacSink(OutputFile):
    """The sound alone, as FLAC (lossless) of 24-bit samples, encoded by ffmpeg at `commit`: the float samples
    are rounded to 24 bits here (nearest, halves to even; +1.0 becomes the largest 24-bit value), so the file
    decodes to them within 2^-24 (2^-23 at +1.0). Verified by ffmpeg's exit status and the samples read back."""

    def __init__(self, output: Path, sound: Soundtrack):
        self.sound = sound
        super().__init__(output)

    def finish(self) -> None:
        result = subprocess.run(
            [*flac_command(self.sound), str(self.temp)],
            input=flac_samples(self.sound),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        if result.returncode:
            raise WriteError(self.ffmpeg_failure(result.returncode, result.stderr))
        samples = readback.read_back(self.temp)[1]
        if samples != self.sound.samples.shape[1]:
            raise WriteError(
                f"{shown(self.output)}: the encoded file reads back {samples} of {self.sound.samples.shape[1]} "
                "samples per channel"
            )

    def abort(self) -> None:
        pass  # subprocess.run has ended ffmpeg, whatever stopped it
