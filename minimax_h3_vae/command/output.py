"""OUT's writer, picked by its format (`open_sink`). Every writer keeps one contract: the data goes to a
temporary file beside OUT as it arrives, and OUT is replaced only once that file is complete and verified;
a failure, a signal or a full disk leaves OUT as it was and nothing beside it.

    sink.begin(sound)         the sound, where the sink was opened with its format only (before the first frame)
    sink.convert(video)       a chunk of decoder output -> the frames the sink takes, on the chunk's device
                              (uint8 RGB (f, H, W, 3); for an mp4 of crf > 0, BT.709 yuv420p planes)
    sink.write(frames)        those frames, on the CPU, in order (writer.py's thread calls it)
    sink.commit()             finish, verify (readback.py: frames and sound read back; sizes, header), keep
                              OUT's permission bits, rename (commit.py)
    sink.discard()            stop the writer, remove the temporary file; OUT is untouched

The writers: mux.py (the mp4: H.264 and AAC from one ffmpeg process) and sinks.py (.safetensors, .wav,
.flac). Each is given the sound whole before the first frame: when it opens, or by `begin` once a sound still
decoding beside the video is done (sinks.Sink). What OUT is checked for before any work is in checks.py.
"""

from __future__ import annotations

from pathlib import Path

from .commit import OutputFile
from .formats import Soundtrack, VideoFormat
from .mux import Mp4Sink
from .sinks import FlacSink, SafetensorsSink, WavSink


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
