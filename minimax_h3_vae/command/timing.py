"""Where a run's wall clock goes, for --verbose: its phases from the process's start to the output's commit."""

from __future__ import annotations

import os
import time


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat against /proc/uptime, to the kernel's clock
    tick), or None where that cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as stat, open("/proc/uptime", "rb") as uptime:
            fields, since_boot = stat.read(), float(uptime.read().split()[0])
        # Field 2, the command name, may hold spaces and ')': count from its last ')'. starttime is field 22.
        start_ticks = int(fields[fields.rindex(b")") + 2 :].split()[19])
        return max(0.0, since_boot - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class Phases:
    """Wall-clock seconds per named phase, in the order the phases first end. `lap(name)` adds the time since
    the last lap to `name`; the first lap also takes the `already` seconds spent before this object was made
    (the process's start-up, when the command runs as its own process)."""

    def __init__(self, already: float = 0.0):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter() - already

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    def line(self) -> str:
        """`time: start-up 1.92 s, checks 0.31 s, ...; total 12.40 s`."""
        phases = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.seconds.items())
        return f"time: {phases}; total {sum(self.seconds.values()):.2f} s"
