"""The MiniMax-H3 video VAE decoder's modules: post_quant_conv + a 36-block ViT, and `from_pretrained`.

Module names equal the original release's keys, so the original checkpoint loads as an identity map
(docs/decoder.md section 2). How a decode walks time and space is in decoding.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from . import decoding
from .blocks import EAGER_OPS, DecoderBlock
from .config import H3DecoderConfig
from .rope import RotaryTable, rotary_table, token_positions
from .runtime import Runtime, resolve_device, resolve_dtype, resolve_fused

if TYPE_CHECKING:
    from .loading import Checkpoint

# Modules that hold the block linears: fp16 in the release recipe, everything else stays fp32.
_BLOCK_LINEARS = ("attn.to_qkv", "attn.to_out", "ff.w1", "ff.w2")


class ViTDecoder(nn.Module):
    """One token per latent voxel -> 36 blocks -> one 4x16x16x3 pixel patch per token."""

    def __init__(self, config: H3DecoderConfig):
        super().__init__()
        c = config
        self.config = c
        self.x_embedder = nn.Linear(c.latent_channels, c.dim)
        self.register_tokens = nn.Parameter(torch.zeros(1, c.num_register_tokens, c.dim))
        self.transformer_blocks = nn.ModuleList(
            DecoderBlock(c.dim, c.num_heads, c.ffn_dim, c.norm_eps) for _ in range(c.num_layers)
        )
        self.norm_out = nn.LayerNorm(c.dim, eps=c.norm_eps)
        self.proj_out = nn.Linear(c.dim, c.patch_dim)
        self._rotary_cache: dict[tuple, RotaryTable] = {}

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.transformer_blocks[0].attn.to_qkv.weight.dtype

    def rotary(self, frames: int, height: int, width: int) -> RotaryTable:
        """The rotary table of one tile shape, built once and reused by every call and every tile."""
        device = self.x_embedder.weight.device
        key = (frames, height, width, device)
        if key not in self._rotary_cache:
            positions = token_positions(frames, height, width, self.config.num_register_tokens + 1, device)
            self._rotary_cache[key] = rotary_table(positions, self.config.rope_dim, self.config.rope_theta)
        return self._rotary_cache[key]

    def forward(
        self, z: torch.Tensor, ops: SimpleNamespace = EAGER_OPS, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """z: (N, C, t, h, w) float32 latents after post_quant_conv -> (N, 3, 4t, 16h, 16w) float32, written
        into `out` when given (un-patchified in the one copy)."""
        c = self.config
        n, _, frames, height, width = z.shape
        tokens = self.x_embedder(z.flatten(2).transpose(1, 2))
        suffix = torch.cat(
            [self.register_tokens.expand(n, -1, -1).to(tokens.dtype), tokens.new_zeros(n, 1, c.dim)], dim=1
        )
        residual = torch.cat([tokens, suffix], dim=1)
        rotary = self.rotary(frames, height, width)
        blocks = self.transformer_blocks
        normed = ops.rms_norm(residual, blocks[0].norm1.weight, c.norm_eps, self.compute_dtype)
        for i, block in enumerate(blocks):
            next_norm = blocks[i + 1].norm1.weight if i + 1 < len(blocks) else None
            residual, normed = block(residual, normed, rotary, ops, next_norm)
        patches = ops.linear_fp32(
            self.norm_out(residual[:, : frames * height * width]), self.proj_out.weight, self.proj_out.bias
        )
        p, pt = c.patch_size, c.patch_size_t
        patches = patches.view(n, frames, height, width, c.out_channels, pt, p, p).permute(0, 4, 1, 5, 2, 6, 3, 7)
        if out is None:
            out = patches.new_empty(n, c.out_channels, frames * pt, height * p, width * p)
        out.view(n, c.out_channels, frames, pt, height, p, width, p).copy_(patches)
        return out


class H3VideoDecoder(nn.Module):
    """Decodes MiniMax-H3 video latents into ImageNet-normalised RGB video, exactly as released.

    Build it with `H3VideoDecoder.from_pretrained(...)`; `decode(z)` is the whole release pipeline. How it
    runs (fused ops, tiles per call, output rank) is `self.runtime`; the checkpoint is `self.config`.
    """

    def __init__(self, config: H3DecoderConfig, runtime: Runtime | None = None):
        super().__init__()
        self.config = config
        self.runtime = runtime if runtime is not None else Runtime()
        self.post_quant_conv = nn.Conv3d(config.latent_channels, config.latent_channels, kernel_size=1)
        self.decoder = ViTDecoder(config)
        self._ops: tuple[tuple, SimpleNamespace] | None = None

    @classmethod
    def from_pretrained(
        cls,
        source: str | os.PathLike = "MiniMaxAI/MiniMax-H3",
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        fused: bool | None = None,
        revision: str | None = None,
        tile_batch: int | None = None,
    ) -> H3VideoDecoder:
        """Load the decoder from a hub repo id, a local repo root, an original `video_vae/` folder, a
        diffusers `vae/` folder, or a single ComfyUI `.safetensors` file.

        device: defaults to CUDA when available. dtype: `torch.float32`/`"fp32"` (default on CPU) or
        `"fp16"`/`torch.float16`, the release recipe (default on CUDA): block linears in fp16, norms,
        residual stream, x_embedder and proj_out in fp32. fused: use the Triton kernels; default from
        MINIMAX_H3_VAE_FUSED, else on when the model is on CUDA and Triton is importable. tile_batch:
        tiles per decoder call; default: as many as fit in free GPU memory (1 fits a 12 GB card).
        """
        from .loading import load_checkpoint

        # Every setting is checked before the (possibly long) checkpoint load.
        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        fused = resolve_fused(fused, device)
        Runtime(fused=fused, tile_batch=tile_batch)
        checkpoint = load_checkpoint(source, revision=revision)
        return cls.from_checkpoint(checkpoint, device=device, dtype=dtype, fused=fused, tile_batch=tile_batch)

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Checkpoint,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        fused: bool | None = None,
        tile_batch: int | None = None,
    ) -> H3VideoDecoder:
        """Build the decoder from a located checkpoint (`loading.load_checkpoint` or, for tensors already in
        memory, `loading.checkpoint_in_memory`); the arguments are those of `from_pretrained`."""
        device = resolve_device(device)
        half = resolve_dtype(dtype, device) == torch.float16
        runtime = Runtime(fused=resolve_fused(fused, device), tile_batch=tile_batch)
        with torch.device("meta"):
            model = cls(checkpoint.config, runtime)
        expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
        state_dict = {
            key: tensor.to(device=device, dtype=torch.float16 if half and _is_block_linear(key) else torch.float32)
            for key, tensor in checkpoint.tensors(expected)
        }
        model.load_state_dict(state_dict, strict=True, assign=True)
        return model.eval().requires_grad_(False)

    def to_release_fp16(self) -> H3VideoDecoder:
        """Cast the block linears to fp16 in place: the release's fp16-autocast recipe, cast once."""
        for name, module in self.named_modules():
            if _is_block_linear(name + ".weight"):
                module.half()
        return self

    @property
    def device(self) -> torch.device:
        return self.post_quant_conv.weight.device

    @property
    def compute_dtype(self) -> torch.dtype:
        """The block linears' dtype: float16 in the release recipe, else float32."""
        return self.decoder.compute_dtype

    # Run settings, kept in `self.runtime`; these two are the ones users set most.
    @property
    def tile_batch(self) -> int | None:
        return self.runtime.tile_batch

    @tile_batch.setter
    def tile_batch(self, value: int | None) -> None:
        self.runtime.tile_batch = value

    @property
    def output_rank(self) -> int | None:
        return self.runtime.output_rank

    @output_rank.setter
    def output_rank(self, value: int | None) -> None:
        self.runtime.output_rank = value

    def ops(self) -> SimpleNamespace:
        """The pointwise ops for this model: eager, or the Triton kernels when `runtime.fused` asks for them.

        The one place the choice is made: once per (fused, device, dtype), with a warning naming any kernel
        that cannot run here (that op then runs eagerly).
        """
        key = (self.runtime.fused, self.device, self.compute_dtype)
        if self._ops is None or self._ops[0] != key:
            if self.runtime.fused:
                from . import fused

                ops = fused.select_ops(self.config, self.device, self.compute_dtype)
            else:
                ops = EAGER_OPS
            self._ops = (key, ops)
        return self._ops[1]

    def decode_tiles(self, z: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Raw latent tiles (N, C, t, h, w), all of one shape -> (N, 3, 4t, 16h, 16w) pixels, float32."""
        z = F.conv3d(z.float(), self.post_quant_conv.weight, self.post_quant_conv.bias)
        with _attention_backends(self.runtime.attention_backends):
            return self.decoder(z, self.ops(), out)

    @torch.inference_mode()
    def decode_stream(
        self, z: torch.Tensor, progress: Callable[[int, int], None] | None = None
    ) -> Iterator[torch.Tensor]:
        """Yield the decoded frames of `decode(z)` in order, one temporal chunk at a time.

        z: raw (denormalised) latents (B, 24, T, h, w). Each item is (B, 3, f, 16h, 16w) float32 on the
        model's device, in the ImageNet-normalised output space; their concatenation along dim 2 is
        `decode(z)`. progress(done, total) is called as tiles finish (total = tiles x chunks x B).
        Under torch.distributed, ranks other than `output_rank`, when it is set, yield None per chunk.
        """
        yield from decoding.decode_stream(self, z, progress)

    def decode(self, z: torch.Tensor, progress: Callable[[int, int], None] | None = None) -> torch.Tensor | None:
        """Raw (denormalised) latents (B, 24, T, h, w) -> video (B, 3, F, 16h, 16w), float32, in the
        ImageNet-normalised space (see `to_unit_rgb`). F = 1 for T = 1, 5 for T = 2, else 17n + 5 for
        T = 5n + 2 (tails padded and cut as released). Under torch.distributed every rank must call it with
        the same latents; each gets the whole video, or None on ranks other than `output_rank` when set."""
        chunks = list(self.decode_stream(z, progress))
        return None if chunks[0] is None else torch.cat(chunks, dim=2)


def _attention_backends(names: tuple[str, ...]):
    """A context that lets SDPA use these backends, in this order where torch supports priorities."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, name) for name in names]
    try:
        return sdpa_kernel(backends, set_priority=True)
    except TypeError:
        return sdpa_kernel(backends)


def _is_block_linear(key: str) -> bool:
    return key.startswith("decoder.transformer_blocks.") and any(f".{m}." in key for m in _BLOCK_LINEARS)
