"""The MiniMax-H3 video VAE decoder's modules: post_quant_conv + a 36-block ViT, and `from_pretrained`.

Module names equal the original release's keys, so the original checkpoint loads as an identity map
(docs/decoder.md section 2). How a decode walks time and space is in decoding.py.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from . import decoding
from .blocks import BLOCK_LINEARS, EAGER_OPS, DecoderBlock
from .config import H3DecoderConfig
from .offload import BlockStreamer
from .rope import RotaryTable, rotary_table, token_positions
from .runtime import (
    Runtime,
    check_offload_choice,
    resolve_device,
    resolve_dtype,
    resolve_fused,
    resolve_max_gpu_memory,
    resolve_offload,
)

if TYPE_CHECKING:
    from .loading import Checkpoint


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

    def embed(self, z: torch.Tensor, ops: SimpleNamespace) -> tuple[torch.Tensor, torch.Tensor]:
        """z: (N, C, t, h, w) float32 latents after post_quant_conv -> the first block's input: the residual
        stream (N, S, dim) float32 with the register and zero tokens appended, and its norm1 in the compute
        dtype."""
        c = self.config
        n = z.shape[0]
        tokens = self.x_embedder(z.flatten(2).transpose(1, 2))
        suffix = torch.cat(
            [self.register_tokens.expand(n, -1, -1).to(tokens.dtype), tokens.new_zeros(n, 1, c.dim)], dim=1
        )
        residual = torch.cat([tokens, suffix], dim=1)
        norm1 = self.transformer_blocks[0].norm1.weight
        return residual, ops.rms_norm(residual, norm1, c.norm_eps, self.compute_dtype)

    def block(
        self, i: int, residual: torch.Tensor, normed: torch.Tensor, rotary: RotaryTable, ops: SimpleNamespace
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Block i on (residual, its normed input); returns the new residual and the next block's normed input
        (None after the last block)."""
        blocks = self.transformer_blocks
        next_norm = blocks[i + 1].norm1.weight if i + 1 < len(blocks) else None
        return blocks[i](residual, normed, rotary, ops, next_norm)

    def head(self, residual: torch.Tensor, shape: tuple[int, int, int], ops: SimpleNamespace, out: torch.Tensor):
        """residual (N, S, dim) after the last block, tiles of latent shape (t, h, w) -> pixels
        (N, 3, 4t, 16h, 16w) float32 written into `out` (un-patchified in the one copy)."""
        c = self.config
        frames, height, width = shape
        n = residual.shape[0]
        patches = ops.linear_fp32(
            self.norm_out(residual[:, : frames * height * width]), self.proj_out.weight, self.proj_out.bias
        )
        p, pt = c.patch_size, c.patch_size_t
        patches = patches.view(n, frames, height, width, c.out_channels, pt, p, p).permute(0, 4, 1, 5, 2, 6, 3, 7)
        out.view(n, c.out_channels, frames, pt, height, p, width, p).copy_(patches)
        return out

    def forward(
        self, z: torch.Tensor, ops: SimpleNamespace = EAGER_OPS, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """z: (N, C, t, h, w) float32 latents after post_quant_conv -> (N, 3, 4t, 16h, 16w) float32, written
        into `out` when given."""
        c = self.config
        n, _, frames, height, width = z.shape
        if out is None:
            out = z.new_empty(n, c.out_channels, frames * c.patch_size_t, height * c.patch_size, width * c.patch_size)
        residual, normed = self.embed(z, ops)
        rotary = self.rotary(frames, height, width)
        for i in range(len(self.transformer_blocks)):
            residual, normed = self.block(i, residual, normed, rotary, ops)
        return self.head(residual, (frames, height, width), ops, out)


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
        self._streamer: BlockStreamer | None = None

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
        offload: str = "auto",
        max_gpu_memory: float | None = None,
    ) -> H3VideoDecoder:
        """Load the decoder from a hub repo id, a local repo root, an original `video_vae/` folder, a
        diffusers `vae/` folder, or a single ComfyUI `.safetensors` file.

        device: defaults to CUDA when available. dtype: `torch.float32`/`"fp32"` (default on CPU) or
        `"fp16"`/`torch.float16`, the release recipe (default on CUDA): block linears in fp16, norms,
        residual stream, x_embedder and proj_out in fp32. fused: use the Triton kernels; default from
        MINIMAX_H3_VAE_FUSED, else on when the model is on CUDA and Triton is importable. revision: for a hub
        repo id, a branch, tag or commit; none loads a cached copy without asking the hub, a branch or tag
        asks the hub for its newest commit first. tile_batch:
        tiles per decoder call; default: as many as fit in free GPU memory (1 fits a 12 GB card).
        offload: "none" (all weights on the device), "blocks" (block linears in pinned host memory, streamed
        one block at a time, layer-major over each chunk's tiles), or "auto" (default): resident when the
        weights and a working reserve fit in `max_gpu_memory` or the free GPU memory, else "blocks".
        max_gpu_memory: GiB the decoder may hold on the GPU, weights included (None: what is free).
        """
        from .loading import load_checkpoint

        # Every setting is checked before the (possibly long) checkpoint load.
        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        fused = resolve_fused(fused, device)
        Runtime(fused=fused, tile_batch=tile_batch, max_gpu_memory=resolve_max_gpu_memory(max_gpu_memory))
        check_offload_choice(offload)  # the choice itself needs the checkpoint's sizes
        checkpoint = load_checkpoint(source, revision=revision)
        return cls.from_checkpoint(
            checkpoint,
            device=device,
            dtype=dtype,
            fused=fused,
            tile_batch=tile_batch,
            offload=offload,
            max_gpu_memory=max_gpu_memory,
        )

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Checkpoint,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        fused: bool | None = None,
        tile_batch: int | None = None,
        offload: str = "auto",
        max_gpu_memory: float | None = None,
    ) -> H3VideoDecoder:
        """Build the decoder from a located checkpoint (`loading.load_checkpoint` or, for tensors already in
        memory, `loading.checkpoint_in_memory`); the arguments are those of `from_pretrained`. On CUDA the
        libraries' one-time set-up runs in a thread while the weights load (`_LibrarySetUp`)."""
        device = resolve_device(device)
        linear_dtype = resolve_dtype(dtype, device)
        cap = resolve_max_gpu_memory(max_gpu_memory)
        with torch.device("meta"):
            model = cls(checkpoint.config, Runtime(fused=resolve_fused(fused, device), tile_batch=tile_batch))
        expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
        linear_bytes, other_bytes = _weight_bytes(expected, linear_dtype)
        reserve = decoding.reserve_bytes(checkpoint.config, torch.finfo(linear_dtype).bits // 8)
        model.runtime.offload = resolve_offload(offload, device, linear_bytes + other_bytes, reserve, cap)
        model.runtime.max_gpu_memory = cap
        # Every tensor goes straight to where it will live: the device, or for streamed block linears pinned
        # host memory; casts happen there (the same rounding as on the host).
        streamed = model.runtime.offload == "blocks"
        linear_home = torch.device("cpu") if streamed else device
        pin = streamed and device.type == "cuda"
        host_keys = {key for key in expected if _is_block_linear(key)} if streamed else set()
        set_up = _LibrarySetUp(model.config, device, linear_dtype, model.runtime) if device.type == "cuda" else None
        state_dict = {}
        for key, tensor in checkpoint.tensors(expected, device, host_keys):
            if _is_block_linear(key):
                tensor = tensor.to(device=linear_home, dtype=linear_dtype)
                state_dict[key] = tensor.pin_memory() if pin and not tensor.is_pinned() else tensor
            else:
                state_dict[key] = tensor.to(device=device, dtype=torch.float32)
        ops = set_up.join() if set_up is not None else None  # (after a failed load it just ends by itself)
        model.load_state_dict(state_dict, strict=True, assign=True)
        if ops is not None:
            model._ops = (model._ops_key(), ops)
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

    def device_bytes(self) -> int:
        """Bytes of weights this decoder holds on its device, the streaming slots included."""
        tensors = [*self.parameters(), *self.buffers()]
        held = sum(t.numel() * t.element_size() for t in tensors if t.device == self.device)
        return held + (2 * self._streamer.slot_bytes if self._streamer is not None and self._streamer.moves else 0)

    def streamer(self) -> BlockStreamer:
        """The block-weight streamer of offload="blocks" (made on first use)."""
        if self._streamer is None:
            self._streamer = BlockStreamer(self.decoder.transformer_blocks, self.device)
        return self._streamer

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
        key = self._ops_key()
        if self._ops is None or self._ops[0] != key:
            if self.runtime.fused:
                from . import fused

                ops = fused.select_ops(self.config, self.device, self.compute_dtype)
            else:
                ops = EAGER_OPS
            self._ops = (key, ops)
        return self._ops[1]

    def _ops_key(self) -> tuple:
        return (self.runtime.fused, self.device, self.compute_dtype)

    def decode_tiles(self, z: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Raw latent tiles (N, C, t, h, w), all of one shape -> (N, 3, 4t, 16h, 16w) pixels, float32."""
        with _attention_backends(self.runtime.attention_backends):
            return self.decoder(self._post_quant(z), self.ops(), out)

    def decode_tiles_layer_major(
        self, parts: list[torch.Tensor], outs: list[torch.Tensor], advance: Callable[[int], None]
    ) -> None:
        """`decode_tiles(parts[k], outs[k])` for every k, block by block instead of call by call: every part's
        residual stream stays on the device while each block's weights are brought in once (offload="blocks").
        The same GEMM shapes as the calls one by one, so the same values bit for bit. advance(n) is called
        as a part of n tiles finishes."""
        ops, streamer = self.ops(), self.streamer()
        shape = tuple(parts[0].shape[2:])
        streamer.prefetch(0)
        streamer.prefetch(1)
        with _attention_backends(self.runtime.attention_backends):
            rotary = self.decoder.rotary(*shape)
            states = [self.decoder.embed(self._post_quant(part), ops) for part in parts]
            for i in range(len(self.decoder.transformer_blocks)):
                with streamer.on_device(i):
                    for k, (residual, normed) in enumerate(states):
                        states[k] = self.decoder.block(i, residual, normed, rotary, ops)
            for k, out in enumerate(outs):
                self.decoder.head(states[k][0], shape, ops, out)
                states[k] = None  # its memory goes to the next part's head
                advance(out.shape[0])

    def _post_quant(self, z: torch.Tensor) -> torch.Tensor:
        return F.conv3d(z.float(), self.post_quant_conv.weight, self.post_quant_conv.bias)

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


class _LibrarySetUp:
    """The one-time set-up of a process's first decode on a CUDA device, run in a thread while the weights
    load: the ops are selected and each launched once (a process's first Triton launch sets up Triton: about
    0.5 s on an H200), and cuBLAS, cuDNN and the attention backends each get one small call (about 0.3 s of
    library loading and handles). Everything runs on two zero tokens; nothing here touches the model.

    `join()` returns the selected ops (the model keeps them, so they are selected once), or None when the
    set-up failed: it is only a head start, and the first decode then meets any real problem itself.
    """

    def __init__(self, config: H3DecoderConfig, device: torch.device, dtype: torch.dtype, runtime: Runtime):
        self.ops: SimpleNamespace | None = None
        self.thread = threading.Thread(
            target=self._run, args=(config, device, dtype, runtime), name="library-set-up", daemon=True
        )
        self.thread.start()

    def _run(self, config: H3DecoderConfig, device: torch.device, dtype: torch.dtype, runtime: Runtime) -> None:
        c = config
        try:
            with torch.cuda.device(device), torch.inference_mode():
                if runtime.fused:
                    from . import fused

                    ops = fused.select_ops(c, device, dtype)
                    fused.warm_up(ops, c, device, dtype)
                else:
                    ops = EAGER_OPS
                tokens = torch.zeros(1, 16, c.dim, device=device, dtype=dtype)
                F.linear(tokens, torch.zeros(c.dim, c.dim, device=device, dtype=dtype))
                channels = c.latent_channels
                kernel = torch.zeros(channels, channels, 1, 1, 1, device=device)
                F.conv3d(torch.zeros(1, channels, 1, 2, 2, device=device), kernel)
                with _attention_backends(runtime.attention_backends):
                    q = tokens.view(1, 16, c.num_heads, -1).transpose(1, 2)
                    F.scaled_dot_product_attention(q, q, q)
                torch.cuda.synchronize(device)
            self.ops = ops
        except Exception:  # only a head start: the first decode meets the same problem and reports it
            pass

    def join(self) -> SimpleNamespace | None:
        self.thread.join()
        return self.ops


def _attention_backends(names: tuple[str, ...]):
    """A context that lets SDPA use these backends, in this order where torch supports priorities."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, name) for name in names]
    try:
        return sdpa_kernel(backends, set_priority=True)
    except TypeError:
        return sdpa_kernel(backends)


def weight_bytes(config: H3DecoderConfig, dtype: torch.dtype) -> tuple[int, int]:
    """Bytes of a decoder of `config` in the recipe of `dtype`: (the block linears, held in `dtype`;
    everything else, held in float32). From shapes alone (a model on the meta device)."""
    with torch.device("meta"):
        shapes = {key: tuple(value.shape) for key, value in H3VideoDecoder(config).state_dict().items()}
    return _weight_bytes(shapes, dtype)


def _weight_bytes(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype) -> tuple[int, int]:
    element = torch.finfo(dtype).bits // 8
    linears = sum(math.prod(shape) * element for key, shape in shapes.items() if _is_block_linear(key))
    return linears, sum(4 * math.prod(shape) for key, shape in shapes.items() if not _is_block_linear(key))


def _is_block_linear(key: str) -> bool:
    return key.startswith("decoder.transformer_blocks.") and any(f".{m}." in key for m in BLOCK_LINEARS)
