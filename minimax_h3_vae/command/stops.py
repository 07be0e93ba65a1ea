"""The stop signals, and how the command ends on one before its run has begun (`stop_at_start`): this module
imports nothing heavy, so that the console entry (console.py) handles them from its first instant."""

from __future__ import annotations

import os
import signal

# Every signal whose default action ends the process and that a handler may catch (SIGKILL and SIGSTOP
# cannot be caught; SIGPIPE stays ignored, as Python sets it, so a closed pipe is an error where it is
# written; the fault signals SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT are crashes, not requests to stop).
STOP_SIGNALS = {
    signum: signum.name
    for signum in (
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGALRM,
        signal.SIGVTALRM,
        signal.SIGPROF,
        signal.SIGXCPU,
        signal.SIGXFSZ,
    )
}


def stop_at_start(signum, frame) -> None:
    """A stop signal while the command starts (torch and the package still importing) or ends (after `main`):
    nothing is left to clean up, so the one line and the exit code (128 + the signal) are all there is to do;
    once the run has ended (`Ended`) it has said its line, and the process exits with the run's code, silently."""
    if Ended.code is not None:
        os._exit(Ended.code)
    line = stopped_line(STOP_SIGNALS.get(signum, f"signal {signum}")) + "\n"
    try:
        os.write(2, line.encode())
    except OSError:  # a closed or broken stderr: the exit code still says it
        pass
    os._exit(128 + signum)


def handle_stops_at_start() -> None:
    """Process-wide, for the console entry alone: `main` replaces these handlers with its own (signals.unwind)
    for the run, and puts these back after it."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop_at_start)


class Ended:
    """The exit code of the run that has ended, its line said (`main` notes it; None while none has): a stop
    that comes after it, such as torchrun's SIGTERM to a rank whose run has just failed, adds no second line
    and does not change the code."""

    code: int | None = None

    @classmethod
    def note(cls, code: int | None) -> None:
        cls.code = code


class Written:
    """The output this run is renaming over OUT (`path`, as shown, and its temporary file `temp`), noted just
    before the rename: once the temporary file is gone, renamed, a stop says OUT is complete, never that
    nothing was written. A stop signal may arrive on any thread, even during the rename, so what decides is
    the file system, not when the note was made. `main` forgets it as a run starts; a discarded output too."""

    path: str | None = None
    temp: str | None = None

    @classmethod
    def note(cls, path: str | None, temp: str | None = None) -> None:
        cls.path, cls.temp = path, temp

    @classmethod
    def complete(cls) -> bool:
        return cls.path is not None and cls.temp is not None and not os.path.lexists(cls.temp)


def stopped_line(name: str, cause: str = "") -> str:
    """The one line for a stop by the signal `name` (`cause`: what else is known, such as stopped ranks)."""
    if Written.complete():
        return f"interrupted by {name}{cause}: {Written.path} was already written and is complete"
    return f"interrupted by {name}{cause}: nothing was written"
