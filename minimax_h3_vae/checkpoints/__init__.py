"""Checkpoints: finding one (a local path or a hub repo id), telling its layout, mapping its config and key
names onto this package's, and reading the decoder's tensors from it. Only decoder tensors are read; the
encoder's are skipped without being read.

files.py (JSON, headers, names inside the folder, config settings) -> stored.py (checking and reading stored
tensors, for both decoders) -> checkpoint.py (the video decoder's `Checkpoint`) -> one file per video layout:
original.py (`video_vae/`), diffusers.py (`vae/`, with its key map), comfyui.py (one file, no config) ->
hub.py (fetching one component's files, for both decoders) -> locate.py (`load_checkpoint`: which layout a
path holds). The audio decoder's layouts are in audio/loading.py, on files.py, stored.py and hub.py.
"""

from .checkpoint import Checkpoint
from .files import CheckpointError
from .hub import DEFAULT_REPO
from .locate import checkpoint_in_memory, load_checkpoint

__all__ = ["DEFAULT_REPO", "Checkpoint", "CheckpointError", "checkpoint_in_memory", "load_checkpoint"]
