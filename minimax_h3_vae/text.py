"""Text in and out of the package: numbers read from text one strict way (command-line flags and file
metadata alike), paths shown in messages so that every message stays one line, and the nearest name to a
misspelt one (run options and flags alike)."""

from __future__ import annotations

import difflib
import os
import re

# A decimal number in ASCII digits: 24, -3, 23.976, .5, 1e3. Python's float() also takes "2_4" (as 24),
# " 24 ", "infinity", "nan" and other scripts' digits; text that means something else to a person is refused.
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_WHOLE = re.compile(r"[+-]?\d{1,18}", re.ASCII)


def parse_number(text: str) -> float:
    """`text` as a float; ValueError unless it is a decimal number written in ASCII digits."""
    if not isinstance(text, str) or _NUMBER.fullmatch(text) is None:
        raise ValueError(f"{text!r} is not a number written in digits (like 24 or 23.976)")
    return float(text)


def parse_whole(text: str) -> int:
    """`text` as an int; ValueError unless it is a whole number written in ASCII digits."""
    if not isinstance(text, str) or _WHOLE.fullmatch(text) is None:
        raise ValueError(f"{text!r} is not a whole number written in digits (like 2 or 17)")
    return int(text)


def shown(path: str | os.PathLike) -> str:
    """A path (or any name) as a message shows it: as it is when it is plain printable text, else quoted with
    Python's escapes (a newline in a file name shows as \\n), so that the message stays one line."""
    text = path if isinstance(path, str) else os.fsdecode(path)
    return text if text.isprintable() and text == text.strip() and text else repr(text)


def one_line(text: str) -> str:
    """`text` with every character that would break a line or the terminal (newlines, control characters,
    undecodable bytes) escaped: the last guard of the command's one-line messages, for text it does not
    write itself (an OS error, ffmpeg's last line)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def nearest(name: str, names) -> str | None:
    """The one of `names` closest to `name` (difflib's ratio at least 0.6), for a message's "did you mean":
    None when none is close."""
    near = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return near[0] if near else None
