"""The command's package (minimax_h3_vae/command/): `python -m minimax_h3_vae.command` runs the same `main` as
the `minimax-h3-decode` console script (tests/test_cli.py checks the script's entry point)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_module_runs_the_command():
    done = subprocess.run(
        [sys.executable, "-m", "minimax_h3_vae.command", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: minimax-h3-decode")
