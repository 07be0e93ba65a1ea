"""Shared fixtures: one random oracle VAE written once per session in every released layout."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch

# Triton reads this at import: without a GPU, its kernels run in the interpreter on the CPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

# pytest-xdist's workers share the machine's cores: each takes its share of torch's threads, as one run on all
# of them would (the tiny decoder's GEMMs gain little from a second thread, and oversubscribed cores lose much).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

from checkpoints import random_diffusers_vae, write_comfyui, write_diffusers, write_original  # noqa: E402


@pytest.fixture(scope="session")
def oracle_vae():
    """diffusers' AutoencoderKLMiniMaxH3, small, every parameter random, fp32."""
    return random_diffusers_vae(seed=0)


@pytest.fixture(scope="session")
def release_repo(tmp_path_factory, oracle_vae) -> Path:
    """A repo root as on the hub: FL2VA/video_vae/ (original), vae/ (diffusers), and a ComfyUI file."""
    root = tmp_path_factory.mktemp("MiniMax-H3")
    write_original(root / "FL2VA", oracle_vae)
    write_diffusers(root, oracle_vae)
    (root / "comfyui").mkdir()
    write_comfyui(root / "comfyui" / "minimax_h3_video_vae_fp16.safetensors", oracle_vae)
    return root


@pytest.fixture(scope="session")
def layouts(release_repo) -> dict[str, Path]:
    """Path of each layout inside `release_repo`."""
    return {
        "original": release_repo / "FL2VA" / "video_vae",
        "diffusers": release_repo / "vae",
        "comfyui": release_repo / "comfyui" / "minimax_h3_video_vae_fp16.safetensors",
    }


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test; the hub client is put offline too (huggingface_hub
    reads HF_HUB_OFFLINE once, at import, so its constant is patched as well)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def one_thread():
    """CPU GEMMs split their work by thread count (and then round differently): tests that compare two CPU
    decodes bit for bit run them on one thread, as the torchrun ranks do (OMP_NUM_THREADS=1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def audio_oracle():
    """diffusers' AutoencoderKLMiniMaxH3Audio with the release's stage structure, small, every parameter random."""
    from audio_checkpoints import random_diffusers_audio_vae

    return random_diffusers_audio_vae(seed=0)


@pytest.fixture(scope="session")
def audio_layouts(tmp_path_factory, audio_oracle) -> dict[str, Path]:
    """The oracle in each layout, inside one repo root as on the hub: FL2VA/audio_vae/ (original), audio_vae/
    (diffusers, in 3 shards with an index), and a ComfyUI file."""
    from audio_checkpoints import write_comfyui, write_diffusers, write_original

    root = tmp_path_factory.mktemp("MiniMax-H3-audio")
    (root / "comfyui").mkdir()
    return {
        "original": write_original(root / "FL2VA" / "audio_vae", audio_oracle),
        "diffusers": write_diffusers(root / "audio_vae", audio_oracle, shards=3),
        "comfyui": write_comfyui(root / "comfyui" / "minimax_h3_audio_vae_fp32.safetensors", audio_oracle),
    }


@pytest.fixture
def eager_offline(no_network, monkeypatch):
    """Offline and on the eager path (MINIMAX_H3_VAE_FUSED=0): the command's runs on the tiny decoder."""
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0")


@pytest.fixture(scope="session")
def rank_sweep(tmp_path_factory):
    """ranks -> the folder of distributed_worker.py's sweep on that many ranks, launched once, at first use."""
    from torchrun_runs import sweep

    folders = {}

    def folder(ranks: int) -> Path:
        if ranks not in folders:
            path = tmp_path_factory.mktemp(f"sweep{ranks}")
            sweep(path, ranks)
            folders[ranks] = path
        return folders[ranks]

    return folder


@pytest.fixture(scope="session")
def torchrun_command(tmp_path_factory):
    """The command on 2 torchrun ranks, launched once (`torchrun_runs.command_run`)."""
    from torchrun_runs import command_run

    return command_run(tmp_path_factory.mktemp("command"))


@pytest.fixture(scope="session", autouse=True)
def ffmpeg_looked_up_first():
    """imageio-ffmpeg caches its binary lookup for the process, a failed one too: it is looked up before any
    test patches subprocess, so the test that happens to ask first in a worker (an order pytest-xdist varies)
    cannot leave that worker's later mp4 tests without ffmpeg."""
    from minimax_h3_vae.command import encoder

    try:
        encoder.ffmpeg_exe()
    except ValueError:  # no imageio-ffmpeg here: the tests that need it say so themselves
        pass
