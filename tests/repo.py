"""Paths in this checkout that the tests read: the root, the tiny example decoder (examples/tiny_h3_vae, the
original layout), the example latents and the command's script."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "tiny_h3_vae"
EXAMPLE_LATENTS = REPO / "examples" / "latents.safetensors"
SCRIPT = REPO / "tools" / "decode_latents.py"
