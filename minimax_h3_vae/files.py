"""Writing a file whole: a private temporary file beside it, renamed over it once complete, so that a
failure at any point leaves nothing behind and an existing file unchanged (the command's output, and
`save_latents`).

The temporary file is `.minimax-h3-decode-XXXXXXXX.part` + the suffix, in the file's folder: short, so any
name the filesystem takes works, and named so that one left by a SIGKILL is easy to recognise.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from .text import shown

TEMP_PREFIX = ".minimax-h3-decode-"
PROC_STATUS = Path("/proc/self/status")


def temp_name(output: Path) -> Path:
    return output.parent / f"{TEMP_PREFIX}{secrets.token_hex(4)}.part{output.suffix.lower()}"


def create_temp(output: Path) -> Path:
    """A new, empty, private temporary file beside `output`."""
    while True:
        path = temp_name(output)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return path
        except FileExistsError:
            continue


def new_file_mode(folder: Path) -> int:
    """The permission bits `open()` gives a new file in `folder`: 0o666 less the process umask.

    The umask is read without changing it (`os.umask` can only read it by setting it, and for that instant
    the files other threads of a host create would take the value set): from the Umask line of
    /proc/self/status (Linux 4.7 and later), else by creating a file of mode 0o666 in `folder`, reading its
    mode back and removing it. OSError if neither works (a folder that is not writable).
    """
    try:
        with open(PROC_STATUS, encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    while True:
        probe = temp_name(folder / "probe")
        try:
            handle = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            return os.fstat(handle).st_mode & 0o777
        finally:
            os.close(handle)
            probe.unlink(missing_ok=True)


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):  # a folder that does not exist (reported later), or a path too long for it
        return default


def check_length(output: Path) -> None:
    """ValueError for an OUT the system cannot take, before it is tried: a name longer than its filesystem
    takes (NAME_MAX, 255 bytes on most), or a path (OUT's, or the temporary file's beside it) of PATH_MAX
    bytes (4096 on Linux) or more."""
    path_max = _limit(output.parent, "PC_PATH_MAX", 4096)
    longest = max(len(os.fsencode(output)), len(os.fsencode(temp_name(output))))
    if longest >= path_max:
        raise ValueError(
            f"{shown(output)}: the path is {longest} bytes long (with the temporary file beside it), the system "
            f"takes less than {path_max}; give a shorter path"
        )
    name_max = _limit(output.parent, "PC_NAME_MAX", 255)
    for part in output.parts:
        if len(os.fsencode(part)) > name_max:
            raise ValueError(
                f"{shown(output)}: the name {shown(part[:40])}... is {len(os.fsencode(part))} bytes long, the "
                f"filesystem takes at most {name_max}; give a shorter name"
            )


def resolve_output(output: Path) -> Path:
    """Where OUT is written: OUT itself, or for a symbolic link the file it points to (the output is written
    through the link, as `cp` writes, and the link stays). ValueError for a link loop or a path too long."""
    check_length(output)
    if not output.is_symlink():
        return output
    try:
        os.stat(output)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ValueError(f"{shown(output)}: is a symbolic link loop; give a file name") from None
    return Path(os.path.realpath(output))
