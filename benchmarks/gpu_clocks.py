"""SM clock and board power while a block of GPU work runs, sampled by nvidia-smi every 50 ms.

The H200 here holds a 700 W board limit; under a sustained decode it sits at that limit with SM clocks well
under the 1980 MHz maximum, so every timing in LOG.md is reported with the clock and power it ran at.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess


class ClockSampler:
    """`with ClockSampler() as clocks: ...` then `clocks.summary`: samples, median and min SM MHz and median
    watts over the samples drawing more than 200 W (the busy ones), or {} when nvidia-smi is missing."""

    def __enter__(self) -> ClockSampler:
        self.summary: dict = {}
        self.process = None
        if shutil.which("nvidia-smi"):
            self.process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        return self

    def __exit__(self, *exc) -> None:
        if self.process is None:
            return
        self.process.terminate()
        out, _ = self.process.communicate()
        samples = []
        for line in out.splitlines():
            try:
                samples.append([float(v) for v in line.split(",")])
            except ValueError:
                continue
        busy = [s for s in samples if s[1] > 200] or samples
        if busy:
            self.summary = {
                "clock_samples": len(busy),
                "median_sm_mhz": statistics.median(s[0] for s in busy),
                "min_sm_mhz": min(s[0] for s in busy),
                "median_power_w": statistics.median(s[1] for s in busy),
            }
