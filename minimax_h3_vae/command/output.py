"""The command's output file: checked before any work, written to a temporary file beside it as frames
arrive, verified, and only then renamed over OUT.

    preflight(OUT)            the folder exists and takes a file, enough free space, the writer is installed
    open_sink(OUT, ...)       Mp4Sink (frames piped to ffmpeg, the sound as its second input), SafetensorsSink
                              (header and sound first, then frames), or for the sound alone WavSink / FlacSink
    sink.convert(video)       a chunk of decoder output -> the frames the sink takes, on the chunk's device
                              (uint8 RGB (f, H, W, 3); for an mp4 of crf > 0, BT.709 yuv420p planes)
    sink.write(frames)        those frames, on the CPU, in order
    sink.commit()             finish, verify (frame count and sound length read back, size), keep OUT's
                              permission bits, rename
    sink.discard()            stop the writer, remove the temporary file; OUT is untouched
    BackgroundWriter(sink)    the sink's writes in a thread, beside the decode (CUDA frames copied without waiting)

The sound is decoded before the video, so every sink is given it whole when it opens (`Soundtrack`).

The temporary file is `.minimax-h3-decode-XXXXXXXX.part` + OUT's suffix, in OUT's folder: short, so any OUT
name the filesystem takes works, and named so that one left by a SIGKILL is easy to recognise.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import torch

from ..files import check_length, create_temp, new_file_mode
from ..frames import to_uint8_frames
from ..text import one_line, shown
from .colour import to_yuv420p_frames, yuv420p_bytes
from .stops import Written

OUTPUT_FORMATS = (".mp4", ".safetensors", ".wav", ".flac")
AUDIO_FORMATS = (".wav", ".flac")  # the sound alone: the video is not decoded
CRF_RANGE = (0, 51)  # libx264, 8 bit; 0 is lossless (written as RGB, see Mp4Sink)
# What the yuv420p frames sent to ffmpeg are (colour.py), said to ffmpeg twice. On the input: ffmpeg
# negotiates colour spaces in its filter graph (imageio-ffmpeg's 9.0 does), and untagged planes would be
# converted by swscale to the tagged output (BT.601 read as BT.709: red's Y' 63 became 58); tagged, nothing
# is converted and the frames carry the tags to the encoder. On the output: for an ffmpeg that takes them
# from the encoder's options (9.0 takes primaries and transfer from the frames only). libx264 writes them
# into the H.264 VUI, the mp4 muxer into its colr box. Left siting is H.264's default (x264 signals no
# chroma location for it; decoders assume it), so naming it changes no byte; it says what the planes hold.
BT709_TAGS = ["-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709", "-color_range", "tv"]
BT709_TAGS += ["-chroma_sample_location", "left"]
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
# The mp4's sound: AAC-LC by ffmpeg's own encoder at the decoder's rate (32 kHz is one of AAC's sampling rates,
# so nothing is resampled), 192 kb/s for the two channels. An AAC frame holds 1024 samples per channel.
AAC_BITRATE = "192k"
AAC_FRAME = 1024
# The sound reaches ffmpeg as raw little-endian float32 samples, interleaved (left, right, left, ...): the mp4's
# second input, from a file written before ffmpeg starts (`_sound_file`).
SOUND_INPUT = ["-f", "f32le"]
# A .flac holds 24-bit samples: the float samples are rounded in torch (FlacSink), so ffmpeg converts nothing.
FLAC_BITS = 24
# How to get the mp4 writer: the package is installed from a checkout (it is not on the package index).
VIDEO_INSTALL = 'pip install imageio-ffmpeg, or in the checkout pip install -e ".[video]"'
# The least space an mp4 of F frames can take, as a share of its raw RGB size: for the preflight only, so
# a full disk is found in a second; a disk that fills up while writing is still caught by the writer.
MP4_MIN_SHARE = 1 / 50


class WriteError(Exception):
    """Writing the output failed (disk full, ffmpeg failed): the message says where and why; OUT is kept."""


@dataclass(frozen=True)
class VideoFormat:
    """What OUT takes of the video: `frames` frames of height x width at `fps`, and for an mp4 the encoder's
    crf and preset (None: ffmpeg's)."""

    frames: int
    height: int
    width: int
    fps: float
    crf: int = 17
    preset: str | None = None


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


# What to write instead of a format that needs ffmpeg, when it is missing.
WITHOUT_FFMPEG = {
    ".mp4": "write a .safetensors file (the frames and the sound, no ffmpeg needed)",
    ".flac": "write a .wav (no ffmpeg needed)",
}


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


def raw_bytes(frames: int, height: int, width: int) -> int:
    return frames * height * width * 3


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


def check_encoder(
    output: Path, width: int, height: int, fps: float, crf: int, preset: str | None, sound: SoundFormat | None = None
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
        command, data = _flac_command(silence), _flac_samples(silence)
        what = f"{sound.sample_rate} Hz sound of {sound.channels} channels"
    else:
        files = (_sound_file(silence, output.parent),) if silence is not None else ()
        command = [*encoder_command(width, height, fps, crf, preset, silence, files), "-frames:v", "1"]
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


def encoder_command(
    width: int,
    height: int,
    fps: float,
    crf: int,
    preset: str | None,
    sound: Soundtrack | None = None,
    files: tuple = (),
) -> list[str]:
    """ffmpeg reading raw frames from stdin and encoding H.264 (see Mp4Sink). crf 1-51: BT.709 limited-range
    yuv420p planes in (colour.py), encoded by libx264 as they are (the same pix_fmt in and out, the same
    tags: no conversion), the stream tagged bt709 / tv. crf 0: rgb24 in, libx264rgb, RGB 4:4:4, lossless.
    With `sound`, its samples are the second input, read from `files[0]` (`_sound_file`, inherited by ffmpeg
    under its own descriptor number), and encoded to AAC."""
    codec, pix_fmt, tags = ("libx264rgb", "rgb24", []) if crf == 0 else ("libx264", "yuv420p", BT709_TAGS)
    command = [ffmpeg_exe(), "-y", "-f", "rawvideo", "-vcodec", "rawvideo", "-s", f"{width}x{height}"]
    command += ["-pix_fmt", pix_fmt, *tags, "-r", str(Fraction(fps).limit_denominator()), "-i", "-"]
    if sound is None:
        command += ["-an"]
    else:
        rate, channels = str(sound.sample_rate), str(sound.samples.shape[0])
        command += [*SOUND_INPUT, "-ar", rate, "-ac", channels, "-i", f"pipe:{files[0].fileno()}"]
        command += ["-map", "0:v:0", "-map", "1:a:0", "-c:a", "aac", "-b:a", AAC_BITRATE]
    command += ["-vcodec", codec, "-pix_fmt", pix_fmt, *tags, "-v", "error", "-crf", str(crf)]
    return command + (["-preset", preset] if preset else [])


def _sound_file(sound: Soundtrack, folder: Path):
    """The sound's interleaved samples in an unnamed file, read from its start: in memory (memfd), else an
    unnamed file in `folder`. ffmpeg reads it as its second input while the frames come through its stdin,
    so neither input waits on the other, and nothing is left behind whatever happens."""
    if hasattr(os, "memfd_create"):
        file = os.fdopen(os.memfd_create("minimax-h3-sound"), "w+b")
    else:
        file = tempfile.TemporaryFile(dir=folder)
    try:
        data = sound.interleaved()
        file.write(_tensor_bytes(data))
        file.flush()
        file.seek(0)
    except BaseException:
        file.close()
        raise
    return file


def check_free_space(output: Path, needed: int) -> None:
    from ..memory import format_size

    free = shutil.disk_usage(output.parent).free
    if free < needed:
        raise ValueError(
            f"{shown(output.parent)}: {format_size(free)} free, the output needs at least {format_size(needed)}; "
            "free some space or write elsewhere"
        )


def same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _tensor_bytes(frames: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU uint8 tensor, without a copy and without numpy (the caller keeps
    `frames` alive while the view is used)."""
    return memoryview((ctypes.c_uint8 * frames.numel()).from_address(frames.data_ptr())).cast("B")


class OutputFile:
    """A temporary file beside `output` that becomes OUT at `commit`, or goes at `discard`."""

    def __init__(self, output: Path):
        self.output = output
        try:
            self.temp = create_temp(output)
        except OSError as error:  # a disk out of inodes, a folder made read-only since the preflight
            raise WriteError(self._failed(error)) from None

    def commit(self) -> None:
        """Finish and verify the temporary file, give it OUT's permission bits (or those of a new file), and
        rename it over OUT. WriteError, with the temporary file left to `discard`, if anything is wrong."""
        try:
            self._finish()
            with open(self.temp, "rb+") as handle:
                os.fsync(handle.fileno())
            try:
                mode = os.stat(self.output).st_mode & 0o7777
            except FileNotFoundError:
                mode = new_file_mode(self.output.parent)
            os.chmod(self.temp, mode)
            Written.note(shown(self.output), str(self.temp))  # a stop from here on checks whether it was renamed
            os.replace(self.temp, self.output)
        except OSError as error:
            raise WriteError(self._failed(error)) from None

    def discard(self) -> None:
        """Stop writing and remove the temporary file. Never raises: it runs while the error that is reported
        unwinds, and a writer that failed (a full disk) fails again as it is closed."""
        try:
            self._abort()
        except OSError:
            pass
        finally:
            try:
                if os.path.lexists(self.temp):  # not renamed: OUT is as it was
                    Written.note(None)
                self.temp.unlink(missing_ok=True)
            except OSError:
                pass

    def _failed(self, error: OSError) -> str:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            return self._no_space()
        reason = error.strerror or error
        return f"{shown(self.output)}: writing failed ({reason}); the existing file, if any, is unchanged"

    def _no_space(self) -> str:
        return (
            f"{shown(self.output)}: no space left on the disk of {shown(self.output.parent)}; free some space or "
            "write elsewhere; the existing file, if any, is unchanged"
        )

    def _ffmpeg_failed(self, status: int, messages: bytes) -> str:
        """The message for an ffmpeg that ended with `status` and wrote `messages` on its stderr."""
        lines = [line.strip() for line in messages.decode(errors="replace").splitlines() if line.strip()]
        # ffmpeg exits with the negated errno of a failed write (228 for ENOSPC) and says it in its last line.
        if status in (256 - errno.ENOSPC, 256 - errno.EDQUOT) or (lines and os.strerror(errno.ENOSPC) in lines[-1]):
            return self._no_space()
        if status < 0:  # a signal: the CPU time limit (`ulimit -t`), the OOM killer, another user
            name = next((s.name for s in signal.Signals if s == -status), f"signal {-status}")
            return f"{shown(self.output)}: ffmpeg was stopped by {name}; nothing was written"
        reason = one_line(lines[-1]) if lines else "no message"
        return f"{shown(self.output)}: ffmpeg failed (exit status {status}: {reason}); nothing was written"

    def _check_sound(self, sound: Soundtrack) -> None:
        """WriteError unless the finished file's audio stream covers the sound's samples, within one AAC frame
        (an encoder may pad its last frame; ffmpeg's trims it exactly)."""
        samples = count_audio_samples(self.temp)
        if samples is None or abs(samples - sound.samples.shape[1]) >= AAC_FRAME:
            got = "no audio stream" if samples is None else f"{samples} samples"
            raise WriteError(
                f"{shown(self.output)}: the encoded file reads back {got} of {sound.samples.shape[1]} per channel"
            )

    def _finish(self) -> None:
        raise NotImplementedError

    def _abort(self) -> None:
        raise NotImplementedError


class Sink(OutputFile):
    """An OutputFile that receives `frames` frames of height x width, as uint8 tensors (f, *frame_shape): RGB
    (f, H, W, 3) unless a subclass takes another format (see `convert`)."""

    def __init__(self, output: Path, frames: int, height: int, width: int):
        self.frames, self.height, self.width = frames, height, width
        self.frame_shape = (height, width, 3)
        self.written = 0
        super().__init__(output)

    def convert(self, video: torch.Tensor) -> torch.Tensor:
        """Decoder output of one chunk, (1, 3, f, H, W) or (3, f, H, W), ImageNet-normalised, on any device
        -> the frames `write` takes, on the same device (so a CUDA chunk is converted before it is copied):
        here uint8 RGB (f, H, W, 3), rounded."""
        return to_uint8_frames(video)

    def write(self, frames: torch.Tensor) -> None:
        """frames: uint8 (f, *frame_shape) on the CPU, as `convert` makes them."""
        if frames.dtype != torch.uint8 or tuple(frames.shape[1:]) != self.frame_shape:
            expected = ", ".join(str(size) for size in ("f", *self.frame_shape))
            raise ValueError(f"frames must be uint8 ({expected}), got {frames.dtype} {tuple(frames.shape)}")
        if self.written + frames.shape[0] > self.frames:
            raise WriteError(f"{shown(self.output)}: more frames than the {self.frames} announced")
        frames = frames.contiguous()
        try:
            self._write(_tensor_bytes(frames))
        except OSError as error:
            raise WriteError(self._failed(error)) from None
        self.written += frames.shape[0]

    def commit(self) -> None:
        if self.written != self.frames:
            raise WriteError(f"{shown(self.output)}: {self.written} of {self.frames} frames were written")
        super().commit()

    def _write(self, data: memoryview) -> None:
        raise NotImplementedError


class SafetensorsSink(Sink):
    """`{"video": uint8 (F, H, W, 3)}` in the safetensors format, with `sound` also `"audio"`: float32 (C, S)
    and `audio_sample_rate` in the metadata; byte for byte what `save_file` writes: the header is known from
    the frame count, so the sound goes first and the frames go to disk as they arrive (host memory flat in
    the clip's length).

    Each chunk is synced to disk as it is written (in the writer thread, beside the decode), so the fsync
    before the rename has almost nothing left to do. The temporary file is opened without truncating it:
    on ext4 a truncated file is flushed whole when it is closed, which cost 0.3 s per 750 MB on the H200's
    disk at the end of the run.
    """

    def __init__(self, output: Path, frames: int, height: int, width: int, sound: Soundtrack | None = None):
        super().__init__(output, frames, height, width)
        size = raw_bytes(frames, height, width)
        # save_file's layout: the metadata first, then the tensors by dtype, widest first (audio before video).
        entries, start, self.shapes = {}, 0, {"video": [frames, height, width, 3]}
        if sound is not None:
            self.shapes["audio"] = list(sound.samples.shape)
            start = sound.samples.numel() * 4
            entries["__metadata__"] = {"audio_sample_rate": str(sound.sample_rate)}
            entries["audio"] = {"dtype": "F32", "shape": self.shapes["audio"], "data_offsets": [0, start]}
        entries["video"] = {"dtype": "U8", "shape": self.shapes["video"], "data_offsets": [start, start + size]}
        header = json.dumps(entries, separators=(",", ":")).encode()
        header += b" " * (-len(header) % 8)  # safetensors pads the header to 8 bytes with spaces
        self.size = 8 + len(header) + start + size
        self.handle = None
        try:
            self.handle = open(self.temp, "r+b")  # created empty by Sink; see above for why not "wb"
            self.handle.write(len(header).to_bytes(8, "little") + header)
            if sound is not None:
                samples = sound.samples.contiguous().view(torch.uint8).flatten()
                self._write(_tensor_bytes(samples))
        except OSError as error:
            self.discard()
            raise WriteError(self._failed(error)) from None

    def _write(self, data: memoryview) -> None:
        self.handle.write(data)
        self.handle.flush()
        os.fdatasync(self.handle.fileno())

    def _finish(self) -> None:
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

    def _abort(self) -> None:
        if self.handle is not None:
            self.handle.close()


class Mp4Sink(Sink):
    """H.264 in mp4, frames piped to ffmpeg; with `sound`, an AAC track beside it, from the same ffmpeg
    process (the samples are its second input, a file written before it starts: `_sound_file`). ffmpeg runs
    in its own session, so a Ctrl-C in the terminal reaches this process alone and the cleanup decides what
    happens to ffmpeg. Its exit status is checked, and the frame count and the sound's length read back from
    the finished file, before it may replace OUT.

    crf 1-51: libx264, yuv420p (plays everywhere): `convert` makes BT.709 limited-range 4:2:0 planes
    (colour.py) on the chunk's device, frames (f, H * W * 3 // 2), and ffmpeg encodes them as they are, the
    stream tagged bt709 / tv. crf 0: libx264rgb, RGB 4:4:4 from uint8 RGB frames, lossless (the frames read
    back are exactly the decoded ones; many players cannot play it). The sound is AAC either way.
    """

    def __init__(self, output: Path, video: VideoFormat, sound: Soundtrack | None = None):
        self.process = self.log = None
        self.sound, self.sound_file = sound, None
        frames, height, width, fps, crf, preset = dataclasses.astuple(video)
        super().__init__(output, frames, height, width)
        self.planar = crf != 0
        if self.planar:
            self.frame_shape = (yuv420p_bytes(height, width),)
        try:
            self.log = _message_file(output.parent)
            if sound is not None:
                self.sound_file = _sound_file(sound, output.parent)
        except OSError as error:
            self.discard()
            what = "ffmpeg's messages" if self.log is None else "the sound ffmpeg reads"
            raise WriteError(f"{shown(output.parent)}: cannot create a file for {what} ({error.strerror})") from None
        files = (self.sound_file,) if self.sound_file is not None else ()
        command = [*encoder_command(width, height, fps, crf, preset, sound, files), "-movflags", "+faststart"]
        try:
            self.process = subprocess.Popen(
                [*command, str(self.temp)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=self.log,
                start_new_session=True,
                pass_fds=[file.fileno() for file in files],
            )
        except OSError as error:
            self.process = None
            self.discard()
            raise WriteError(f"cannot start ffmpeg ({error.strerror}); reinstall it: {VIDEO_INSTALL}") from None

    def convert(self, video: torch.Tensor) -> torch.Tensor:
        return to_yuv420p_frames(video) if self.planar else super().convert(video)

    def _write(self, data: memoryview) -> None:
        try:
            self.process.stdin.write(data)
        except BrokenPipeError:
            self.process.wait()
            raise WriteError(self._messages()) from None

    def _finish(self) -> None:
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        if self.process.wait() != 0:
            raise WriteError(self._messages())
        frames = count_mp4_frames(self.temp)
        if frames != self.frames:
            raise WriteError(f"{shown(self.output)}: the encoded file reads back {frames} of {self.frames} frames")
        if self.sound is not None:
            self._check_sound(self.sound)

    def _messages(self) -> str:
        self.log.seek(0)
        return self._ffmpeg_failed(self.process.returncode, self.log.read())

    def _abort(self) -> None:
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


# The WAV header of WavSink: RIFF, `fmt ` (18 bytes, IEEE float), `fact` (the sample count), `data`.
WAV_HEADER_BYTES = 12 + 8 + 18 + 8 + 4 + 8
WAV_IEEE_FLOAT = 3
WAV_MAX_DATA = 2**32 - 1 - (WAV_HEADER_BYTES - 8)  # RIFF sizes are 32-bit


class WavSink(OutputFile):
    """The sound alone, as a WAV file of 32-bit float samples (WAVE_FORMAT_IEEE_FLOAT, interleaved): exactly the
    decoded samples. The whole file is written at `commit`, then verified by its size."""

    def __init__(self, output: Path, sound: Soundtrack):
        self.sound, self.handle = sound, None  # at most WAV_MAX_DATA bytes of samples (check_encoder)
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

    def _finish(self) -> None:
        data = self.sound.interleaved()
        with open(self.temp, "r+b") as self.handle:
            self.handle.write(self.header())
            self.handle.write(_tensor_bytes(data))
        size = WAV_HEADER_BYTES + data.numel()
        if self.temp.stat().st_size != size:
            raise WriteError(f"{shown(self.output)}: wrote {self.temp.stat().st_size} bytes, expected {size}")

    def _abort(self) -> None:
        if self.handle is not None:
            self.handle.close()


class FlacSink(OutputFile):
    """The sound alone, as FLAC (lossless) of 24-bit samples, encoded by ffmpeg at `commit`: the float samples
    are rounded to 24 bits here (nearest, halves to even; +1.0 becomes the largest 24-bit value), so the file
    decodes to them within 2^-24 (2^-23 at +1.0). Verified by ffmpeg's exit status and the samples read back."""

    def __init__(self, output: Path, sound: Soundtrack):
        self.sound = sound
        super().__init__(output)

    def _finish(self) -> None:
        result = subprocess.run(
            [*_flac_command(self.sound), str(self.temp)],
            input=_flac_samples(self.sound),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        if result.returncode:
            raise WriteError(self._ffmpeg_failed(result.returncode, result.stderr))
        samples = count_audio_samples(self.temp)
        if samples != self.sound.samples.shape[1]:
            raise WriteError(
                f"{shown(self.output)}: the encoded file reads back {samples} of {self.sound.samples.shape[1]} "
                "samples per channel"
            )

    def _abort(self) -> None:
        pass  # subprocess.run has ended ffmpeg, whatever stopped it


def _flac_command(sound: Soundtrack) -> list[str]:
    """ffmpeg reading `_flac_samples` from stdin and writing FLAC of FLAC_BITS bits (to the path appended)."""
    rate, channels = str(sound.sample_rate), str(sound.samples.shape[0])
    command = [ffmpeg_exe(".flac"), "-y", "-f", "s32le", "-ar", rate, "-ac", channels, "-i", "-", "-c:a", "flac"]
    return command + ["-sample_fmt", "s32", "-bits_per_raw_sample", str(FLAC_BITS), "-v", "error"]


def _flac_samples(sound: Soundtrack) -> bytes:
    """The samples as FLAC_BITS-bit integers in the top bits of 32-bit ones (what ffmpeg's FLAC encoder keeps of
    s32 input), interleaved, little-endian."""
    top = 2 ** (FLAC_BITS - 1)
    levels = torch.round(sound.samples.double() * top).clamp(-top, top - 1).to(torch.int32) * 2 ** (32 - FLAC_BITS)
    return levels.T.contiguous().numpy().tobytes()


def _message_file(folder: Path):
    """An unnamed file for ffmpeg's messages: in memory (memfd), so that it needs no disk (a full disk is where
    ffmpeg's reason matters most) and leaves nothing to clean up; elsewhere, an unnamed file in `folder` (it
    takes files; the temporary folder may not exist)."""
    if hasattr(os, "memfd_create"):
        return os.fdopen(os.memfd_create("ffmpeg-messages"), "w+b")
    return tempfile.TemporaryFile(dir=folder)


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


def open_sink(output: Path, video: VideoFormat, sound: Soundtrack | None = None) -> OutputFile:
    """The output file for OUT's format: for .wav and .flac (the sound alone) `sound` is required and the
    frames are not taken."""
    suffix = output.suffix.lower()
    if suffix == ".mp4":
        return Mp4Sink(output, video, sound)
    if suffix == ".wav":
        return WavSink(output, sound)
    if suffix == ".flac":
        return FlacSink(output, sound)
    return SafetensorsSink(output, video.frames, video.height, video.width, sound)
