"""The `minimax-h3-decode` console entry: stop signals are handled before anything heavy is imported (torch
takes seconds to import), then the command runs (main.console_main)."""

from __future__ import annotations

import os

from .stops import handle_stops_at_start

# libgomp (torch's OpenMP on Linux) lets a thread that waits for work spin for ~300,000 rounds before it sleeps.
# On a machine whose cores other processes also use, those spins take the cores the working threads need: the
# audio decode on 2 busy cores ran up to 10x slower (benchmarks/LOG.md, 2026-12-03 CPU sound). A short spin
# keeps the quick hand-over between ops. libgomp reads the variable when torch loads it, so it is set here,
# before torch is imported, for this process alone, and only when the user has set neither variable.
GOMP_SPINCOUNT = "10000"


def spin_briefly(environ=os.environ) -> None:
    if "GOMP_SPINCOUNT" not in environ and "OMP_WAIT_POLICY" not in environ:
        environ["GOMP_SPINCOUNT"] = GOMP_SPINCOUNT


def console_main() -> None:
    handle_stops_at_start()
    spin_briefly()
    from .main import console_main as run  # imported only now: torch comes with it

    run()
