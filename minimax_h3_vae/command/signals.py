"""Stopping cleanly: stop signals unwind the run (`unwind`), a CPU limit leaves time for the cleanup
(`reserve_cpu_time`), and under torchrun a watchdog ends a rank whose main thread waits in a collective."""

from __future__ import annotations

import os
import resource
import signal
import socket
import threading
import time

from .. import distributed
from .report import STOP_SIGNALS, Diagnostics, Stopped, describe, say

# `ulimit -t N` sets the soft and the hard CPU limit to N seconds: the kernel then sends SIGKILL at N with no
# SIGXCPU first, and nothing could clean up. The command lowers the soft limit by this share of N (at least
# CPU_MARGIN_S seconds), so that SIGXCPU comes first and the cleanup has that much CPU time left to run.
CPU_MARGIN_S, CPU_MARGIN_SHARE = 2, 0.1


def unwind(signum, frame) -> None:
    """The first stop signal unwinds the run, cleanup included; later ones are ignored, so that the cleanup
    finishes."""
    for other in STOP_SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Stopped(signum)


def reserve_cpu_time() -> tuple[int, int] | None:
    """Under a CPU limit whose soft and hard values are equal (`ulimit -t N`), lower the soft one by the
    margin (CPU_MARGIN_S), so that SIGXCPU, which unwinds the run like any stop signal, comes before the
    hard limit's SIGKILL. Returns the limits to put back, or None when nothing was changed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if soft != hard or hard == resource.RLIM_INFINITY:
        return None
    margin = max(CPU_MARGIN_S, int(hard * CPU_MARGIN_SHARE))
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (max(1, hard - margin), hard))
    except (OSError, ValueError):
        return None
    return soft, hard


class Watchdog:
    """Under torchrun, a bounded end for a rank whose main thread cannot run Python: gloo and NCCL wait
    inside C++, where a signal handler never runs, and a collective with a rank that died may wait until
    its timeout (10 minutes), while torchrun kills the rank (SIGKILL, 30 s after its SIGTERM) and its
    temporary file stays behind.

    Python writes each signal's number to the wakeup fd (`signal.set_wakeup_fd`) whatever the main thread is
    doing; this thread reads it. GRACE seconds after a stop signal, or after the main thread has waited that
    long in a collective with a rank of this host that has stopped, it discards the output (`cleanups`),
    prints the one line (on the lowest running rank, unless the main thread has) and exits the process, with
    the code the main thread would have returned. A commit in progress (`committing`: the output's fsync and
    rename) is waited for, at most COMMIT_WAIT seconds, so that it is not cut off halfway.
    """

    GRACE = 2.0  # seconds: the main thread's own unwinding takes milliseconds
    POLL = 0.25
    # The rank that reports a failure waits this long at most for this host's other ranks to end (each ends
    # within GRACE and a poll of meeting it, torchrun's SIGTERM or the broken group), so that none of them takes
    # it for stopped and reports again (`distributed.outlive_local_ranks`).
    OUTLIVE = GRACE + 4 * POLL
    COMMIT_WAIT = 10.0  # at most, for the fsync and rename of a finished output (torchrun kills at 30 s)

    def __init__(self):
        self.cleanups: list = []
        self._said = False
        self._lock = threading.Lock()  # one line, once
        self._commit = threading.Lock()
        self._reader, writer = socket.socketpair()
        writer.setblocking(False)
        self._writer = writer
        self._previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._reader.settimeout(self.POLL)
        self._thread = threading.Thread(target=self._watch, name="torchrun-watchdog", daemon=True)
        self._thread.start()

    def say_once(self, line: str) -> None:
        with self._lock:
            if not self._said:
                self._said = True
                say(line)

    def committing(self):
        return self._commit

    def stop(self) -> None:
        signal.set_wakeup_fd(self._previous)
        self._writer.close()  # the reader sees the end and the thread returns
        self._thread.join()
        self._reader.close()

    def _watch(self) -> None:
        stopped_by, since = None, None
        while True:
            try:
                data = self._reader.recv(16)
                if not data:
                    return  # stop(): the run has ended
                if stopped_by is None and any(signum in STOP_SIGNALS for signum in data):
                    stopped_by, since = next(signum for signum in data if signum in STOP_SIGNALS), time.monotonic()
            except TimeoutError:
                pass
            now = time.monotonic()
            waiting = distributed.in_collective_since
            if stopped_by is not None and now - since > self.GRACE:
                self._end(describe(Stopped(stopped_by)))
            if waiting is not None and now - waiting > self.GRACE and distributed.stopped_ranks():
                self._end(describe(distributed.RankLost()))

    def _end(self, described: tuple[int, str]) -> None:
        code, line = described
        self._commit.acquire(timeout=self.COMMIT_WAIT)  # a commit in progress finishes first
        for cleanup in self.cleanups:
            try:
                cleanup()
            except Exception:  # the line and the exit matter more than a cleanup that fails
                pass
        if distributed.reports_failures():
            self.say_once(line)
            distributed.outlive_local_ranks(self.OUTLIVE)
        Diagnostics().flush()
        os._exit(code)
