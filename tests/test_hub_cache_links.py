"""Checkpoints from the Hugging Face cache as huggingface_hub lays it out: every snapshot file is a link to a
blob outside the snapshot folder. The video and the audio loader read them, and from the hub they fetch only
their own component's files."""

from __future__ import annotations

import pytest
import torch
from hub_cache import add_repo, offline_cache, record_downloads

from minimax_h3_vae import H3AudioDecoder, H3VideoDecoder
from minimax_h3_vae.audio import loading as audio_loading
from minimax_h3_vae.checkpoints import CheckpointError


def video_files(layouts) -> dict:
    """The release's video VAE in the repo: FL2VA/video_vae/ (original) and vae/ (diffusers, sharded)."""
    original = layouts["original"]
    files = {f"FL2VA/video_vae/{p.relative_to(original).as_posix()}": p for p in original.rglob("*") if p.is_file()}
    return files | {f"vae/{p.name}": p for p in layouts["diffusers"].iterdir()}


def audio_files(audio_layouts) -> dict:
    """The release's audio VAE in the repo: FL2VA/audio_vae/ (original) and audio_vae/ (diffusers)."""
    files = {f"FL2VA/audio_vae/{p.name}": p for p in audio_layouts["original"].iterdir()}
    return files | {f"audio_vae/{p.name}": p for p in audio_layouts["diffusers"].iterdir()}


def test_video_decoder_loads_linked_snapshot_files(tmp_path, monkeypatch, layouts, no_network):
    """Bug: the check that a config names files inside its folder resolved the links, so every file of a real
    hub cache counted as outside ('names 'source/model.safetensors', outside its folder')."""
    cache = offline_cache(tmp_path, monkeypatch)
    add_repo(cache, "Org/H3", video_files(layouts))
    H3VideoDecoder.from_pretrained("Org/H3", device="cpu", fused=False)
    sharded = {f"vae/{p.name}": p for p in layouts["diffusers"].iterdir()}
    assert len(sharded) > 2  # an index and its shards, each a link
    add_repo(cache, "Org/DiffusersOnly", sharded)
    H3VideoDecoder.from_pretrained("Org/DiffusersOnly", device="cpu", fused=False)


def test_audio_decoder_fetches_only_the_audio_vae(tmp_path, monkeypatch, layouts, audio_layouts, no_network):
    cache = offline_cache(tmp_path, monkeypatch)
    add_repo(cache, "Org/H3", video_files(layouts) | audio_files(audio_layouts))
    asked = record_downloads(monkeypatch)
    decoder = H3AudioDecoder.from_pretrained("Org/H3", device="cpu", fused=False)
    assert sorted(asked) == [f"FL2VA/audio_vae/{n}" for n in ("config.json", "metadata.json", "model.safetensors")]
    local = H3AudioDecoder.from_pretrained(audio_layouts["original"], device="cpu", fused=False)
    expected = local.state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in decoder.state_dict().items())


def test_audio_decoder_falls_back_to_the_diffusers_folder(tmp_path, monkeypatch, audio_layouts, no_network):
    """A repo with only audio_vae/ (diffusers, sharded): its config, index and the shards with decoder tensors."""
    cache = offline_cache(tmp_path, monkeypatch)
    files = {f"audio_vae/{p.name}": p for p in audio_layouts["diffusers"].iterdir()}
    add_repo(cache, "Org/DiffusersOnly", files)
    asked = record_downloads(monkeypatch)
    checkpoint = audio_loading.load_checkpoint("Org/DiffusersOnly")
    assert checkpoint.layout == "diffusers"
    assert set(asked) - {"FL2VA/audio_vae/config.json"} <= set(files)  # the original layout is looked for first
    assert {path.name for path in checkpoint.files.values()} <= {name.split("/")[1] for name in asked}


def test_audio_repo_without_an_audio_vae(tmp_path, monkeypatch, layouts, no_network):
    cache = offline_cache(tmp_path, monkeypatch)
    add_repo(cache, "Org/VideoOnly", {f"vae/{p.name}": p for p in layouts["diffusers"].iterdir()})
    with pytest.raises(
        CheckpointError, match="Org/VideoOnly: no such local path, and not in the local Hugging Face cache"
    ):
        H3AudioDecoder.from_pretrained("Org/VideoOnly", device="cpu")
