"""The video decoder's located checkpoint: the config, which file holds each stored tensor, and reading the
decoder's tensors from it one at a time (the layouts with other key names subclass it with their key map)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ..config import H3DecoderConfig
from ..reader import DeviceReader
from ..tiling import RELEASE_TILING, Tiling
from .files import CheckpointError
from .stored import StoredCheckpoint

# Keys of the release that the decoder does not use: the masked-autoencoding token of training.
IGNORED_KEYS = frozenset({"decoder.mask_token"})
# Prefixes of the tensors this decoder owns; any other key belongs to the encoder or is metadata.
DECODER_PREFIXES = ("decoder.", "post_quant_conv.")


@dataclass
class Checkpoint(StoredCheckpoint):
    """A located video VAE checkpoint, in the key names of this package's modules (the original and ComfyUI
    layouts); `in_memory` holds the tensors of one already in memory."""

    config: H3DecoderConfig
    in_memory: dict[str, torch.Tensor] | None = None  # stored key -> tensor, for a checkpoint held in memory
    tiling: Tiling = RELEASE_TILING  # the tiling it was released with: the run default (original: its config.json)

    prefixes = DECODER_PREFIXES
    ignored = IGNORED_KEYS

    def sources(self, key: str) -> tuple[tuple[str, ...], Callable | None]:
        """The stored key(s) decoder key `key` is made from, and the function combining them (None: copy)."""
        return (key,), None

    def stored_shapes(self, key: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
        """Several stored tensors of one decoder tensor (diffusers' q, k, v) split its rows evenly."""
        stored, _ = self.sources(key)
        part = (shape[0] // len(stored), *shape[1:]) if len(stored) > 1 else shape
        return [(name, part) for name in stored]

    def stray_hint(self) -> str:
        return f"not in a {self.config.num_layers}-block decoder"

    def check_config(self) -> None:
        """The config's model-sizing fields against the tensor shapes of the file headers, before anything is
        allocated: a config that does not describe these weights (e.g. num_layers 10**6) fails here, and one
        that passes sizes the model by tensors that exist on disk. `check` then checks every tensor."""
        config, shapes = self.config, self.shapes
        embed = self.sources("decoder.x_embedder.weight")[0][0]
        w1 = self.sources("decoder.transformer_blocks.0.ff.w1.weight")[0][0]
        blocks = len({m.group(1) for k in shapes if (m := re.match(r"decoder\.transformer_blocks\.(\d+)\.", k))})
        if embed not in shapes:
            raise CheckpointError(f"{self.origin}: missing tensor {embed!r} ({self.layout} layout)")
        dim = shapes[embed][0]
        found = {
            "latent_channels": (config.latent_channels, shapes[embed][-1]),
            "num_heads x head_dim": (config.dim, dim),
        }
        if w1 in shapes:
            found["ffn_mult"] = (config.ffn_mult, shapes[w1][0] // (2 * dim) if dim else 0)
        if "decoder.register_tokens" in shapes:
            found["num_register_tokens"] = (config.num_register_tokens, shapes["decoder.register_tokens"][1])
        if "decoder.proj_out.weight" in shapes:
            found["out_channels x patch_size_t x patch_size^2"] = (
                config.patch_dim,
                shapes["decoder.proj_out.weight"][0],
            )
        wrong = [f"{name} {want} (the tensors say {have})" for name, (want, have) in found.items() if want != have]
        if config.num_layers > blocks:  # fewer: `check` names the tensors of the blocks left over
            wrong.insert(0, f"num_layers {config.num_layers} (the tensors hold {blocks} blocks)")
        if wrong:
            raise CheckpointError(
                f"{self.origin}: the config does not match the weights: {'; '.join(wrong)}; fix config.json or use "
                "the config that came with these weights"
            )

    def tensors(
        self, expected: dict[str, tuple[int, ...]], device: torch.device | None = None, host_keys=frozenset()
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """(original key, tensor) for every expected key, in stored dtype, read one at a time from disk.

        With a CUDA `device`, files are read straight onto it (reader.DeviceReader), except the keys in
        `host_keys`, which are read straight into pinned host memory; else everything goes to the CPU.
        """
        self.check(expected)
        handles = {}
        direct = device is not None and device.type == "cuda" and self.in_memory is None
        reader = DeviceReader(device) if direct else None
        try:
            for key in expected:
                stored, combine = self.sources(key)
                parts = [self.read(handles, name, reader, key in host_keys) for name in stored]
                yield key, parts[0] if combine is None else combine(parts, self.config.head_dim)
        finally:
            handles.clear()
            if reader is not None:
                reader.close()

    def owned(self, tensor: torch.Tensor) -> torch.Tensor:
        """A checkpoint in memory shares its tensors with the decoder (diffusers' swap, ComfyUI's VAE nodes)."""
        return tensor if self.in_memory is not None else super().owned(tensor)

    def read(self, handles: dict, name: str, reader: DeviceReader | None = None, pinned: bool = False) -> torch.Tensor:
        if self.in_memory is not None:
            return self.in_memory[name]
        return super().read(handles, name, reader, pinned)
