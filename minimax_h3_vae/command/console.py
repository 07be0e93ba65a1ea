"""The `minimax-h3-decode` console entry: stop signals are handled before anything heavy is imported (torch
takes seconds to import), then the command runs (main.console_main)."""

from __future__ import annotations

from .stops import handle_stops_at_start


def console_main() -> None:
    handle_stops_at_start()
    from .main import console_main as run  # imported only now: torch comes with it

    run()
