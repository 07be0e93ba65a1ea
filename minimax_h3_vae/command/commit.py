"""OUT written whole or not at all: a temporary file beside it that is verified, synced, given OUT's permission
bits and renamed over it (`OutputFile.commit`), or removed (`OutputFile.discard`); and the line that says why
writing failed (`WriteError`).

The temporary file is `.minimax-h3-decode-XXXXXXXX.part` + OUT's suffix, in OUT's folder (files.py's
`create_temp`): short, so any OUT name the filesystem takes works, and named so that one left by a SIGKILL
is easy to recognise.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

from ..files import create_temp, new_file_mode
from ..text import one_line, shown
from .stops import Written


class WriteError(Exception):
    """Writing the output failed (disk full, ffmpeg failed): the message says where and why; OUT is kept."""


class OutputFile:
    """A temporary file beside `output` that becomes OUT at `commit`, or goes at `discard`.

    Each kind of output defines `finish` (write what is left and verify the temporary file, WriteError if it
    is wrong) and `abort` (stop writing: close files, end processes); `commit` and `discard` call them."""

    def __init__(self, output: Path):
        self.output = output
        try:
            self.temp = create_temp(output)
        except OSError as error:  # a disk out of inodes, a folder made read-only since the preflight
            raise WriteError(self.failure(error)) from None

    def commit(self) -> None:
        """Finish and verify the temporary file, give it OUT's permission bits (or those of a new file), and
        rename it over OUT. WriteError, with the temporary file left to `discard`, if anything is wrong."""
        try:
            self.finish()
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
            raise WriteError(self.failure(error)) from None

    def discard(self) -> None:
        """Stop writing and remove the temporary file. Never raises: it runs while the error that is reported
        unwinds, and a writer that failed (a full disk) fails again as it is closed."""
        try:
            self.abort()
        except OSError:
            pass
        finally:
            try:
                if os.path.lexists(self.temp):  # not renamed: OUT is as it was
                    Written.note(None)
                self.temp.unlink(missing_ok=True)
            except OSError:
                pass

    def failure(self, error: OSError) -> str:
        """The message for a write of the temporary file that failed with `error`."""
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            return self.no_space()
        reason = error.strerror or error
        return f"{shown(self.output)}: writing failed ({reason}); the existing file, if any, is unchanged"

    def no_space(self) -> str:
        return (
            f"{shown(self.output)}: no space left on the disk of {shown(self.output.parent)}; free some space or "
            "write elsewhere; the existing file, if any, is unchanged"
        )

    def ffmpeg_failure(self, status: int, messages: bytes) -> str:
        """The message for an ffmpeg that ended with `status` and wrote `messages` on its stderr."""
        lines = [line.strip() for line in messages.decode(errors="replace").splitlines() if line.strip()]
        # ffmpeg exits with the negated errno of a failed write (228 for ENOSPC) and says it in its last line.
        if status in (256 - errno.ENOSPC, 256 - errno.EDQUOT) or (lines and os.strerror(errno.ENOSPC) in lines[-1]):
            return self.no_space()
        if status < 0:  # a signal: the CPU time limit (`ulimit -t`), the OOM killer, another user
            name = next((s.name for s in signal.Signals if s == -status), f"signal {-status}")
            return f"{shown(self.output)}: ffmpeg was stopped by {name}; nothing was written"
        reason = one_line(lines[-1]) if lines else "no message"
        return f"{shown(self.output)}: ffmpeg failed (exit status {status}: {reason}); nothing was written"

    def finish(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError
