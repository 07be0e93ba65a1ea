"""The mp4 writer: H.264 and, with sound, AAC, muxed by one ffmpeg process that runs beside the decode, then
read back before it may replace OUT."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from ..text import shown
from . import readback
from .colour import to_yuv420p_frames, yuv420p_bytes
from .commit import WriteError
from .encoder import AAC_FRAME, VIDEO_INSTALL, encoder_command, sound_file
from .formats import SoundFormat, Soundtrack, VideoFormat
from .sinks import Sink


class Mp4Sink(Sink):
    """H.264 in mp4, frames piped to ffmpeg; with `sound`, an AAC track beside it, from the same ffmpeg
    process, started at `begin` (the samples are its second input, a file written before it starts:
    encoder.sound_file). ffmpeg
    runs in its own session, so a Ctrl-C in the terminal reaches this process alone and the cleanup decides
    what happens to ffmpeg. Its exit status is checked, and the frame count and the sound's length read back
    from the finished file, before it may replace OUT.

    crf 1-51: libx264, yuv420p (plays everywhere): `convert` makes BT.709 limited-range 4:2:0 planes
    (colour.py) on the chunk's device, frames (f, H * W * 3 // 2), and ffmpeg encodes them as they are, the
    stream tagged bt709 / tv. crf 0: libx264rgb, RGB 4:4:4 from uint8 RGB frames, lossless (the frames read
    back are exactly the decoded ones; many players cannot play it). The sound is AAC either way.
    """

    def __init__(self, output: Path, video: VideoFormat, sound: Soundtrack | SoundFormat | None = None):
        self.process = self.log = self.sound_file = None
        super().__init__(output, video.frames, video.height, video.width, sound)
        self.video = video
        self.planar = video.crf != 0
        if self.planar:
            self.frame_shape = (yuv420p_bytes(video.height, video.width),)
        try:
            self.log = _message_file(output.parent)
        except OSError as error:
            self.discard()
            raise WriteError(
                f"{shown(output.parent)}: cannot create a file for ffmpeg's messages ({error.strerror})"
            ) from None
        self.opened(sound)

    def start(self, sound: Soundtrack | None) -> None:
        """Start ffmpeg, with the sound's samples in the file it reads as its second input."""
        if sound is not None:
            try:
                self.sound_file = sound_file(sound, self.output.parent)
            except OSError as error:
                raise WriteError(
                    f"{shown(self.output.parent)}: cannot create a file for the sound ffmpeg reads ({error.strerror})"
                ) from None
        files = (self.sound_file,) if self.sound_file is not None else ()
        _, height, width, fps, crf, preset = dataclasses.astuple(self.video)
        command = encoder_command(width, height, fps, crf, preset, self.sound_format, files)
        try:
            self.process = subprocess.Popen(
                [*command, "-movflags", "+faststart", str(self.temp)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=self.log,
                start_new_session=True,
                pass_fds=[file.fileno() for file in files],
            )
        except OSError as error:
            self.process = None
            raise WriteError(f"cannot start ffmpeg ({error.strerror}); reinstall it: {VIDEO_INSTALL}") from None

    def convert(self, video: torch.Tensor) -> torch.Tensor:
        return to_yuv420p_frames(video) if self.planar else super().convert(video)

    def write_bytes(self, data: memoryview) -> None:
        try:
            self.process.stdin.write(data)
        except BrokenPipeError:
            self.process.wait()
            raise WriteError(self._messages()) from None

    def finish(self) -> None:
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        if self.process.wait() != 0:
            raise WriteError(self._messages())
        frames, samples = readback.read_back(self.temp)
        if frames != self.frames:
            raise WriteError(f"{shown(self.output)}: the encoded file reads back {frames} of {self.frames} frames")
        sound = self.sound_format
        # The audio stream covers the sound's samples within one AAC frame (an encoder may pad its last frame;
        # ffmpeg's trims it exactly).
        if sound is not None and (samples is None or abs(samples - sound.samples) >= AAC_FRAME):
            got = "no audio stream" if samples is None else f"{samples} samples"
            raise WriteError(f"{shown(self.output)}: the encoded file reads back {got} of {sound.samples} per channel")

    def _messages(self) -> str:
        self.log.seek(0)
        return self.ffmpeg_failure(self.process.returncode, self.log.read())

    def abort(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process is not None:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        for file in (self.log, self.sound_file):
            if file is not None:
                file.close()


def _message_file(folder: Path):
    """An unnamed file for ffmpeg's messages: in memory (memfd), so that it needs no disk (a full disk is where
    ffmpeg's reason matters most) and leaves nothing to clean up; elsewhere, an unnamed file in `folder` (it
    takes files; the temporary folder may not exist)."""
    if hasattr(os, "memfd_create"):
        return os.fdopen(os.memfd_create("ffmpeg-messages"), "w+b")
    return tempfile.TemporaryFile(dir=folder)
