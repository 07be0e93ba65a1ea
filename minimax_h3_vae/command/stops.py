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
    """A stop signal while the command starts (torch and the package still importing): nothing can have been
    written yet, so the one line and the exit code (128 + the signal) are all there is to do."""
    line = f"interrupted by {STOP_SIGNALS.get(signum, f'signal {signum}')}: nothing was written\n"
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
