"""From what the user gave to a located video VAE checkpoint: a local path or a hub repo id, which layout a
folder or file holds, and a checkpoint whose tensors are already in memory."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..config import H3DecoderConfig
from .checkpoint import DECODER_PREFIXES, Checkpoint
from .comfyui import open_comfyui
from .diffusers import SUBFOLDER as DIFFUSERS_SUBFOLDER
from .diffusers import DiffusersCheckpoint, open_diffusers
from .files import DIFFUSERS_INDEX, DIFFUSERS_SINGLE, CheckpointError, first_folder, single_file
from .hub import DEFAULT_REPO, diffusers_locator, hub_snapshot, local_or_fetched
from .original import SUBFOLDERS as ORIGINAL_SUBFOLDERS
from .original import locate_original, open_original

# The class of each layout's checkpoint: the key names it is read through.
CHECKPOINT_CLASSES = {"original": Checkpoint, "comfyui": Checkpoint, "diffusers": DiffusersCheckpoint}


def load_checkpoint(source: str | os.PathLike = DEFAULT_REPO, revision: str | None = None) -> Checkpoint:
    """Locate a checkpoint (local path or hub repo id) and read its config and tensor headers."""
    path, _ = local_or_fetched(source, revision, download)
    return open_local(path, str(source))


def checkpoint_in_memory(
    state_dict: dict[str, torch.Tensor], config: H3DecoderConfig, layout: str, origin: str = "state dict"
) -> Checkpoint:
    """A checkpoint whose tensors are already in memory (e.g. a loaded diffusers VAE's `state_dict()`), in
    the key names of `layout` ("original" / "comfyui" or "diffusers"); converted like a file of that layout."""
    if layout not in CHECKPOINT_CLASSES:
        raise CheckpointError(f"{origin}: unknown layout {layout!r}")
    shapes = {key: tuple(tensor.shape) for key, tensor in state_dict.items()}
    return CHECKPOINT_CLASSES[layout](layout, config, {}, shapes, origin, in_memory=dict(state_dict))


def open_local(path: Path, origin: str) -> Checkpoint:
    """The checkpoint at `path`: a ComfyUI file, or a folder of the original or diffusers layout, or a repo
    root holding one (the original first)."""
    if single_file(path, origin):
        return open_comfyui(path, origin)
    if (folder := first_folder(path, ORIGINAL_SUBFOLDERS)) is not None:
        return open_original(folder, origin)
    if (folder := first_folder(path, (DIFFUSERS_SUBFOLDER,))) is not None:
        return open_diffusers(folder, origin)
    config = path / "config.json"
    if config.is_file():
        if (path / DIFFUSERS_INDEX).is_file() or (path / DIFFUSERS_SINGLE).is_file():
            return open_diffusers(path, origin)
        return open_original(path, origin)
    raise CheckpointError(
        f"{origin}: not a checkpoint folder: expected a video_vae/ folder (config.json + "
        f"source/), a diffusers vae/ folder, or a repo root holding one of them"
    )


def download(repo_id: str, revision: str | None) -> Path:
    """Fetch only the files the decoder needs (original layout, else diffusers) into the HF cache, by
    `hub.hub_snapshot`'s policy; returns the layout's folder there."""
    return hub_snapshot(
        repo_id,
        revision,
        (locate_original, diffusers_locator(DIFFUSERS_SUBFOLDER, DECODER_PREFIXES)),
        f"neither {ORIGINAL_SUBFOLDERS[0]}/ nor {DIFFUSERS_SUBFOLDER}/ with a video VAE",
    )
