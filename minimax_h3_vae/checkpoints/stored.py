"""What both decoders' checkpoints do alike once located: check the stored tensors against the decoder's, and
read one stored tensor (from the CPU through safetensors, or straight onto a CUDA device through the reader)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import safe_open

from ..reader import DeviceReader
from .files import CheckpointError


@dataclass
class StoredCheckpoint:
    """A located checkpoint: its layout, decoder config, and which file holds each stored key.

    A subclass says how a decoder key is stored (`stored_shapes`), which stored keys are the decoder's
    (`prefixes`), which of those it leaves unread (`ignored`), and what a stray one suggests (`stray_hint`)."""

    layout: str  # "original", "diffusers" or "comfyui"
    config: Any  # the decoder's config dataclass
    files: dict[str, Path]  # stored key -> safetensors file
    shapes: dict[str, tuple[int, ...]]  # stored key -> shape, from the file headers
    origin: str  # what the user gave, for messages

    prefixes: ClassVar[tuple[str, ...]] = ()
    ignored: ClassVar[frozenset[str]] = frozenset()

    def stored_shapes(self, key: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
        """(stored key, its shape) for each stored tensor that decoder tensor `key` of `shape` is made from."""
        raise NotImplementedError

    def stray_hint(self) -> str:
        raise NotImplementedError

    def check(self, expected: dict[str, tuple[int, ...]]) -> None:
        """Fail, naming the tensor, on a missing, unexpected or mis-shaped decoder tensor. Reads no data."""
        used = set(self.ignored)
        for key, shape in expected.items():
            for name, want in self.stored_shapes(key, shape):
                if name not in self.shapes:
                    raise CheckpointError(f"{self.origin}: missing tensor {name!r} ({self.layout} layout)")
                if self.shapes[name] != want:
                    raise CheckpointError(
                        f"{self.origin}: tensor {name!r} has shape {list(self.shapes[name])}, "
                        f"this config expects {list(want)}"
                    )
                used.add(name)
        unexpected = sorted(k for k in self.shapes if k.startswith(self.prefixes) and k not in used)
        if unexpected:
            raise CheckpointError(
                f"{self.origin}: unexpected decoder tensor(s) {unexpected[:5]}"
                f"{' ...' if len(unexpected) > 5 else ''} ({self.stray_hint()}; is this a different model?)"
            )

    def owned(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` in storage of its own: a copy where it is still a view of the file's memory map (a CPU read
        that no cast or combination copied). A decoder keeps no view of a file: a file truncated or rewritten
        under a loaded decoder would otherwise end its process (SIGBUS) or change its weights."""
        if tensor.device.type == "cpu" and not tensor.is_pinned() and not tensor.untyped_storage().resizable():
            return tensor.clone()  # safetensors' mapped tensors have fixed-size storage; allocated ones do not
        return tensor

    def read(self, handles: dict, name: str, reader: DeviceReader | None = None, pinned: bool = False) -> torch.Tensor:
        """Stored tensor `name` as stored: through `reader` onto its device (or with `pinned` into pinned host
        memory) where it can read it, else on the CPU through a safetensors handle kept in `handles`."""
        path = self.files[name]
        try:
            if reader is not None and reader.can_read(path, name):
                return reader.read(path, name, pinned)
            if path not in handles:
                handles[path] = safe_open(str(path), framework="pt", device="cpu")
            return handles[path].get_tensor(name)
        except Exception as error:  # safetensors raises its own error types for truncated or corrupt files
            raise CheckpointError(
                f"{path}: cannot read tensor {name!r} ({error}); the file may be truncated "
                "or corrupt: download it again"
            ) from error
