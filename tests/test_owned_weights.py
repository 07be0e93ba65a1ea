"""A loaded decoder owns its weights: the file it was read from may be rewritten or truncated afterwards
without changing a decode or ending the process (a view of the file's memory map would: SIGBUS on truncation)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minimax_h3_vae import H3AudioDecoder, H3VideoDecoder

REPO = Path(__file__).resolve().parent.parent


def _header_bytes(path: Path) -> int:
    with path.open("rb") as handle:
        return 8 + int.from_bytes(handle.read(8), "little")


def _rewrite_in_place(path: Path) -> None:
    """The same file (same inode, same size, same header) with every tensor byte changed."""
    start = _header_bytes(path)
    data = bytearray(path.read_bytes()[start:])
    with path.open("r+b") as handle:
        handle.seek(start)
        handle.write(bytes(b ^ 0x5A for b in data))


def _weights(kind: str, tmp_path: Path, layouts, audio_layouts) -> tuple[Path, Path]:
    """(what to load, the safetensors file inside it) in a copy of the fp32 layout the kind is released in."""
    if kind == "video":
        folder = shutil.copytree(layouts["original"], tmp_path / "video_vae")
        return folder, folder / "source" / "model.safetensors"
    path = shutil.copy(audio_layouts["comfyui"], tmp_path / "audio.safetensors")
    return Path(path), Path(path)


def _load(kind: str, path: Path):
    if kind == "video":
        return H3VideoDecoder.from_pretrained(path, device="cpu"), torch.randn(1, 24, 2, 2, 2)
    decoder = H3AudioDecoder.from_pretrained(path, device="cpu", fused=False)
    return decoder, torch.randn(1, decoder.config.latent_channels, 6)


@pytest.mark.parametrize("kind", ["video", "audio"])
def test_a_rewritten_file_changes_nothing(kind, tmp_path, layouts, audio_layouts, one_thread):
    source, weights = _weights(kind, tmp_path, layouts, audio_layouts)
    torch.manual_seed(0)
    decoder, z = _load(kind, source)
    before = decoder.decode(z)
    _rewrite_in_place(weights)
    assert torch.equal(decoder.decode(z), before)


_TRUNCATED = """
import os, sys, torch
from minimax_h3_vae import H3AudioDecoder, H3VideoDecoder
kind, source, weights, header = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.manual_seed(0)
if kind == "video":
    decoder, z = H3VideoDecoder.from_pretrained(source, device="cpu"), torch.randn(1, 24, 2, 2, 2)
else:
    decoder = H3AudioDecoder.from_pretrained(source, device="cpu", fused=False)
    z = torch.randn(1, decoder.config.latent_channels, 6)
before = decoder.decode(z)
os.truncate(weights, header)
print(torch.equal(decoder.decode(z), before))
"""


@pytest.mark.parametrize("kind", ["video", "audio"])
def test_a_truncated_file_leaves_the_decoder_working(kind, tmp_path, layouts, audio_layouts):
    """In a child process: a decoder holding views of the file dies of SIGBUS there, failing this test."""
    source, weights = _weights(kind, tmp_path, layouts, audio_layouts)
    run = subprocess.run(
        [sys.executable, "-c", _TRUNCATED, kind, str(source), str(weights), str(_header_bytes(weights))],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    assert (run.returncode, run.stdout.strip()) == (0, "True"), run.stderr[-2000:]
