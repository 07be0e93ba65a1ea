"""The background writer: a sink's writes in a thread beside the decode, CUDA frames copied to pinned host
buffers without waiting, and the NaN policy (a chunk that held NaN or Inf is never written)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import torch

from ..frames import NON_FINITE_FRAMES
from ..text import shown
from .commit import WriteError
from .sinks import Sink


class BackgroundWriter:
    """Writes frames to a sink from a thread, so that copying and encoding a chunk overlap decoding the next.

    `put(frames)` takes one chunk's uint8 frames (`sink.convert`'s) on the CPU or a CUDA device. CUDA frames are
    copied into a pinned host buffer in stream order, without waiting; `put` then waits only for the copy
    of the chunk before, so the GPU always has the next chunk's work queued while the host writes, and the
    host runs at most one chunk ahead of the GPU. At most `depth` chunks wait for the thread, which bounds
    host memory (`depth` + 2 pinned buffers). An error in the writer is raised in the caller at its next
    `put` or at `close`.

    `before`, if given, runs in the thread before the first chunk is written, while the decode goes on (the
    command hands the sink a sound still being decoded there: `Sink.begin`); its error is handed over likewise.
    """

    def __init__(self, sink: Sink, depth: int = 2, before: Callable[[], None] | None = None):
        self.sink, self.before = sink, before
        self.queue = queue.Queue(maxsize=depth)
        self.idle = queue.Queue()  # pinned buffers the thread has written out
        self.buffers, self.most_buffers, self.largest = 0, depth + 2, 0
        self.last_copy = None  # the event of the latest chunk's copy to the host
        self.error: BaseException | None = None
        self.cancelled = False
        self.first_written: float | None = None  # time.perf_counter() when the first chunk was written
        self.thread = threading.Thread(target=self._run, name="frame-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.before is not None:
            try:
                self.before()
            except BaseException as error:  # as a write's error, below
                self.error = error
        while (item := self.queue.get()) is not None:
            frames, copied, buffer, finite = item
            if self.error is None and not self.cancelled:
                try:
                    if copied is not None:
                        copied.synchronize()
                    if finite is not None and not bool(finite):
                        raise WriteError(f"{shown(self.sink.output)}: {NON_FINITE_FRAMES}; nothing was written")
                    self.sink.write(frames)
                    self.first_written = self.first_written or time.perf_counter()
                except BaseException as error:  # handed to the caller; keep draining so it never blocks
                    self.error = error
            if buffer is not None:
                self.idle.put(buffer)

    def put(self, frames, finite=None) -> None:
        """frames: one chunk's uint8 frames. finite: a bool tensor on the frames' device, False when the
        chunk they were made from held NaN or Inf; read only after the copy landed, so it costs no wait."""
        if self.error is not None:
            raise self.error
        buffer = copied = None
        if frames.is_cuda:
            buffer = self._buffer(frames.numel())
            host = buffer[: frames.numel()].view(frames.shape)
            host.copy_(frames, non_blocking=True)
            if finite is not None:  # to the host with the frames, so that reading it waits for nothing else
                finite = torch.empty((), dtype=torch.bool, pin_memory=True).copy_(finite, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(torch.cuda.current_stream(frames.device))
            earlier, self.last_copy, frames = self.last_copy, copied, host
            if earlier is not None:
                earlier.synchronize()
        self.queue.put((frames, copied, buffer, finite))

    def _buffer(self, size: int):
        """A pinned uint8 buffer of at least `size` bytes: one the thread is done with, or a new one while
        there are fewer than `most_buffers`. New buffers take the largest chunk seen so far, so that a short
        chunk (a clip's last) never leaves a buffer too small for the next."""
        self.largest = max(self.largest, size)
        buffer = None
        if self.buffers < self.most_buffers and self.idle.empty():
            self.buffers += 1
        else:
            buffer = self.idle.get()
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(self.largest, dtype=torch.uint8, pin_memory=True)
        return buffer

    def close(self) -> None:
        """Wait for every queued chunk to be written; raise the writer's error, if any."""
        self._stop()
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        """Drop what is queued and end the thread (after the chunk it is writing, if any)."""
        self.cancelled = True
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        self._stop()

    def _stop(self) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()
