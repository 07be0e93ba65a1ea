"""What the command says: one best-effort line on stderr (`say`), and for every way a run ends early its exit
code and its one line (`describe`)."""

from __future__ import annotations

import sys
import threading

from .. import distributed
from ..text import one_line, shown
from .commit import WriteError
from .stops import STOP_SIGNALS, stopped_line

# What writing to a closed (None or a closed file), full or broken stream raises.
STREAM_ERRORS = (OSError, ValueError, AttributeError)


class Diagnostics:
    """A file-like stderr (for `say`, tqdm and tracebacks) that writes best-effort: a closed, full or broken
    stderr never costs the output.

    It remembers whether its last text ended inside a line (a progress bar redraws its line with a carriage
    return and no newline), so that `say` starts its line on a fresh one, whichever thread says it."""

    _lock = threading.RLock()  # a write and the note of where it ended go together
    _mid_line = False

    def write(self, text: str) -> None:
        with Diagnostics._lock:
            if text:
                Diagnostics._mid_line = not text.endswith("\n")
            try:
                sys.stderr.write(text)
            except STREAM_ERRORS:
                pass

    def flush(self) -> None:
        try:
            sys.stderr.flush()
        except STREAM_ERRORS:
            pass


def progress_bar(total: int, what: str, unit: str):
    """A tqdm bar over `total` units on stderr, `what: n/total unit`, that starts no thread: the video's tiles
    ("decoding", "tile") and the sound's AMP blocks ("sound", "block").

    tqdm's class starts a monitor thread with its first bar (one that outlives the bar, and in a host that
    runs `main` in-process, the call), to refresh bars whose dynamic `miniters` has grown. A subclass with
    `monitor_interval = 0` starts none and leaves tqdm's own setting, and the host's bars, as they are; with
    `miniters=1` the bar redraws at each unit (at most every 0.1 s), so there is nothing to monitor."""
    from tqdm import tqdm

    class QuietBar(tqdm):
        monitor_interval = 0

    return QuietBar(total=total, unit=unit, desc=what, miniters=1, file=Diagnostics())


def say(line: str) -> None:
    """One line on stderr, best-effort (Diagnostics), starting a line of its own even where a progress bar
    has left the cursor inside its line."""
    diagnostics = Diagnostics()
    with Diagnostics._lock:
        diagnostics.write(("\n" if Diagnostics._mid_line else "") + line + "\n")
    diagnostics.flush()


class InputError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


class Stopped(BaseException):
    """A stop signal (STOP_SIGNALS) arrived: unwinds like KeyboardInterrupt, exit code 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(STOP_SIGNALS.get(signum, f"signal {signum}"))
        self.signum = signum


class Agreed(Exception):
    """A failure that every rank has agreed on (under torchrun); rank 0 alone reports it."""

    def __init__(self, code: int, line: str):
        super().__init__(line)
        self.code, self.line = code, line


def describe(error: BaseException) -> tuple[int, str]:
    """(exit code, the one line to print) for every way a run can end early: one line, whatever names or
    text the message holds (text.one_line)."""
    code, line = _describe(error)
    return code, one_line(line)


def _describe(error: BaseException) -> tuple[int, str]:
    if isinstance(error, Agreed):
        return error.code, error.line
    if isinstance(error, InputError):
        return 2, f"error: {error}"
    gone = distributed.stopped_ranks()  # under torchrun, the ranks of this host that have stopped
    cause = f" (rank {', '.join(map(str, gone))} had stopped)" if gone else ""
    if isinstance(error, Stopped):
        return 128 + error.signum, stopped_line(str(error), cause)
    if isinstance(error, KeyboardInterrupt):
        return 130, stopped_line("SIGINT", cause)
    if isinstance(error, distributed.RankLost):
        return 1, f"error: {error}; nothing was written"
    if isinstance(error, distributed.RankFailed):
        return 1, f"error: {error} (run with --verbose for rank {error.rank}'s traceback)"
    if isinstance(error, WriteError):
        return 1, f"error: {error}"
    if isinstance(error, OSError) and error.strerror:
        where = f"{shown(error.filename)}: " if error.filename else ""
        return 1, f"error: {where}{error.strerror}; nothing was written"
    return 1, f"error: {type(error).__name__}: {error} (run with --verbose for the traceback)"
