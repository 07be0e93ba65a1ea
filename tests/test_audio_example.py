"""The shipped tiny audio VAE (examples/tiny_h3_vae/audio_vae/, original layout): it loads, it decodes H3's
audio latents to 800 samples per latent, and tools/make_example_checkpoint.py makes exactly the committed files."""

from __future__ import annotations

import importlib.util

import torch
from repo import REPO, TINY

from minimax_h3_vae import H3AudioDecoder
from minimax_h3_vae.audio import loading


def test_the_example_decodes_audio_latents():
    checkpoint = loading.load_checkpoint(TINY)  # the repo root of both VAEs: the audio one is found
    assert checkpoint.layout == "original" and checkpoint.config.latent_channels == 32
    decoder = H3AudioDecoder.from_checkpoint(checkpoint, device="cpu", fused=False)
    z = torch.randn(2, 32, 65, generator=torch.Generator().manual_seed(0))  # 1.625 s: 39 frames at 24 fps
    audio = decoder.decode(z)
    assert audio.shape == (2, 52000) and decoder.sample_rate == 32000
    assert 0.1 < audio.std() < 0.5 and (audio.abs() < 1).float().mean() > 0.99  # spread, not clamped


def test_the_tool_writes_the_committed_files(tmp_path):
    spec = importlib.util.spec_from_file_location("make_example", REPO / "tools" / "make_example_checkpoint.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.write_audio_checkpoint(tmp_path, tool.TINY_AUDIO, tool.AUDIO_SEED)
    committed = sorted(p.name for p in (TINY / "audio_vae").iterdir())
    assert committed == ["config.json", "config.yaml", "metadata.json", "model.safetensors"]
    for name in committed:
        assert (tmp_path / "audio_vae" / name).read_bytes() == (TINY / "audio_vae" / name).read_bytes(), name
