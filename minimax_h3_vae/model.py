"""The MiniMax-H3 video VAE decoder: post_quant_conv + a 36-block ViT, tiled in space and chunked in time.

Module names equal the original release's keys, so the original checkpoint loads as an identity map.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from . import tiling
from .blocks import EAGER_OPS, DecoderBlock
from .config import H3DecoderConfig
from .rope import RotaryTable, rotary_table, token_positions

# ImageNet statistics: the decoder's output space is `(rgb - mean) / std` with rgb in [0, 1].
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# SDPA backends in order of preference (names of torch.nn.attention.SDPBackend): cuDNN is the fastest on
# Hopper for S = 1797, D = 64 (benchmarks/RESULTS.md).
ATTENTION_BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")

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
            DecoderBlock(c.dim, c.num_heads, c.ffn_dim, c.norm_eps) for _ in range(c.num_layers))
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

    def forward(self, z: torch.Tensor, ops: SimpleNamespace = EAGER_OPS, out: torch.Tensor | None = None
                ) -> torch.Tensor:
        """z: (N, C, t, h, w) float32 latents after post_quant_conv -> (N, 3, 4t, 16h, 16w) float32, written
        into `out` when given (un-patchified in the one copy)."""
        c = self.config
        n, _, frames, height, width = z.shape
        tokens = self.x_embedder(z.flatten(2).transpose(1, 2))
        suffix = torch.cat([self.register_tokens.expand(n, -1, -1).to(tokens.dtype),
                            tokens.new_zeros(n, 1, c.dim)], dim=1)
        residual = torch.cat([tokens, suffix], dim=1)
        rotary = self.rotary(frames, height, width)
        blocks = self.transformer_blocks
        normed = ops.rms_norm(residual, blocks[0].norm1.weight, c.norm_eps, self.compute_dtype)
        for i, block in enumerate(blocks):
            next_norm = blocks[i + 1].norm1.weight if i + 1 < len(blocks) else None
            residual, normed = block(residual, normed, rotary, ops, next_norm)
        patches = ops.linear_fp32(self.norm_out(residual[:, :frames * height * width]), self.proj_out.weight,
                                  self.proj_out.bias)
        p, pt = c.patch_size, c.patch_size_t
        patches = patches.view(n, frames, height, width, c.out_channels, pt, p, p).permute(0, 4, 1, 5, 2, 6, 3, 7)
        if out is None:
            out = patches.new_empty(n, c.out_channels, frames * pt, height * p, width * p)
        out.view(n, c.out_channels, frames, pt, height, p, width, p).copy_(patches)
        return out


class H3VideoDecoder(nn.Module):
    """Decodes MiniMax-H3 video latents into ImageNet-normalised RGB video, exactly as released.

    Build it with `H3VideoDecoder.from_pretrained(...)`; `decode(z)` is the whole release pipeline.
    """

    def __init__(self, config: H3DecoderConfig):
        super().__init__()
        self.config = config
        self.post_quant_conv = nn.Conv3d(config.latent_channels, config.latent_channels, kernel_size=1)
        self.decoder = ViTDecoder(config)
        self.tile_batch: int | None = None  # tiles per decoder call; None: as many as fit in free GPU memory
        self.attention_backends = ATTENTION_BACKENDS
        self.output_rank: int | None = None  # under torch.distributed: the one rank that gets the output

    @classmethod
    def from_pretrained(
        cls, source: str | os.PathLike = "MiniMaxAI/MiniMax-H3", *, device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None, fused: bool | None = None, revision: str | None = None,
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
        if tile_batch is not None and tile_batch < 1:
            raise ValueError(f"tile_batch must be at least 1, got {tile_batch}")
        from .loading import load_checkpoint

        device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
        half = resolve_dtype(dtype, device) == torch.float16
        fused = resolve_fused(fused, device)
        checkpoint = load_checkpoint(source, revision=revision)
        with torch.device("meta"):
            model = cls(checkpoint.config.replace(fused=fused))
        expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
        state_dict = {key: tensor.to(device=device, dtype=torch.float16 if half and _is_block_linear(key)
                                     else torch.float32)
                      for key, tensor in checkpoint.tensors(expected)}
        model.load_state_dict(state_dict, strict=True, assign=True)
        model.tile_batch = tile_batch
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

    def ops(self) -> SimpleNamespace:
        """The pointwise ops for this model: eager, or the Triton kernels when the config asks for them.

        This is the one place the choice is made.
        """
        if not self.config.fused:
            return EAGER_OPS
        from . import fused
        return fused.FUSED_OPS

    def decode_tiles(self, z: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Raw latent tiles (N, C, t, h, w), all of one shape -> (N, 3, 4t, 16h, 16w) pixels, float32."""
        z = F.conv3d(z.float(), self.post_quant_conv.weight, self.post_quant_conv.bias)
        with _attention_backends(self.attention_backends):
            return self.decoder(z, self.ops(), out)

    def auto_tile_batch(self, tile_tokens: int) -> int:
        """Tiles per decoder call that fit in 80% of the free GPU memory (all of them on the CPU)."""
        if self.device.type != "cuda":
            return 2**31 - 1
        free, _ = torch.cuda.mem_get_info(self.device)
        c = self.config
        element = torch.finfo(self.decoder.compute_dtype).bits // 8
        # A conservative count of the live activations per token at the FFN's peak: w1's output and the
        # gate in the compute dtype, the fp32 residual and its temporaries, and the tile's fp32 pixels.
        per_token = (4 * c.ffn_dim + 12 * c.dim) * element + 12 * c.dim + 3 * c.patch_dim * 4
        return max(1, int(0.8 * free) // (per_token * tile_tokens))

    def decode_clip(self, z: torch.Tensor, on_tiles: Callable[[int], None] | None = None) -> torch.Tensor | None:
        """One temporal window (B, C, t, h, w) -> (B, 3, 4t, 16h, 16w), spatially tiled and stitched.

        The tiles of all B videos go through the decoder together, `tile_batch` at a time (default: as many
        as fit in free GPU memory). Under torch.distributed with several ranks, each rank decodes its share
        of the tiles (`tiling.plan_tile_calls`), the decoded tiles are gathered, and every rank stitches the
        same frame; with `output_rank` set, only that rank gathers and stitches, the others return None.
        """
        c = self.config
        plan = tiling.plan_tiles(z.shape[-2], z.shape[-1], c)
        tiles = torch.cat([z[..., rows, cols] for rows, cols in plan.latent_windows()])
        frames, (tile_h, tile_w) = z.shape[2], plan.latent_tile_shape
        tile_shape = (c.out_channels, frames * c.patch_size_t, plan.rows.size, plan.cols.size)
        rank, ranks = distributed_rank()
        calls = tiling.plan_tile_calls(tiles.shape[0], self.tile_batch, ranks)
        counts = [sum(end - start for start, end in rank_calls) for rank_calls in calls]
        mine = calls[rank]
        first = mine[0][0] if mine else 0
        local = tiles.new_empty(counts[rank], *tile_shape, dtype=torch.float32)
        tokens = frames * tile_h * tile_w + c.num_register_tokens + 1
        for start, end in mine:
            step = self.tile_batch or self.auto_tile_batch(tokens)
            for part in range(start, end, step):
                stop = min(part + step, end)
                self.decode_tiles(tiles[part:stop], local[part - first:stop - first])
                if on_tiles is not None:
                    on_tiles(stop - part)
        decoded = local if ranks == 1 else self._gather_tiles(local, counts)
        if decoded is None:
            return None
        if on_tiles is not None and ranks > 1:
            on_tiles(tiles.shape[0] - local.shape[0])
        return tiling.stitch(decoded.split(z.shape[0]), plan)

    def _gather_tiles(self, local: torch.Tensor, counts: list[int]) -> torch.Tensor | None:
        """Every rank's decoded tiles (rank r holds counts[r]), in tile order, on every rank (or only on
        `output_rank`)."""
        import torch.distributed as dist

        # Collectives move equal shapes: pad every share to the largest.
        padded = local.new_zeros(max(counts), *local.shape[1:])
        padded[:local.shape[0]] = local
        if self.output_rank is None:
            gathered = [torch.empty_like(padded) for _ in counts]
            dist.all_gather(gathered, padded)
        elif dist.get_rank() == self.output_rank:
            gathered = [torch.empty_like(padded) for _ in counts]
            dist.gather(padded, gathered, dst=self.output_rank)
        else:
            dist.gather(padded, None, dst=self.output_rank)
            return None
        return torch.cat([part[:count] for part, count in zip(gathered, counts)])

    @torch.inference_mode()
    def decode_stream(self, z: torch.Tensor, progress: Callable[[int, int], None] | None = None
                      ) -> Iterator[torch.Tensor]:
        """Yield the decoded frames of `decode(z)` in order, one temporal chunk at a time.

        z: raw (denormalised) latents (B, 24, T, h, w). Each item is (B, 3, f, 16h, 16w) float32 on the
        model's device, in the ImageNet-normalised output space; their concatenation along dim 2 is
        `decode(z)`. progress(done, total) is called as tiles finish (total = tiles x chunks x B).
        Under torch.distributed (see `decode_clip`), ranks other than `output_rank`, when it is set, yield
        None for each chunk instead.
        """
        c = self.config
        check_latents(z, c.latent_channels)
        z = z.to(self.device)
        plan = tiling.plan_chunks(z.shape[2], c)
        if plan.padded_frames > z.shape[2]:
            z = torch.cat([z, z[:, :, -1:].expand(-1, -1, plan.padded_frames - z.shape[2], -1, -1)], dim=2)
        (body_start, body_end), (tail_start, tail_end) = tiling.chunk_spans(plan.window, c)
        total_tiles = tiling.plan_tiles(z.shape[-2], z.shape[-1], c).count * len(plan.starts) * z.shape[0]
        done = 0

        def advance(tiles: int) -> None:
            nonlocal done
            done += tiles
            if progress is not None:
                progress(done, total_tiles)

        remaining = plan.out_frames
        held = None
        for start in plan.starts:
            clip = self.decode_clip(z[:, :, start:start + plan.window], advance)
            if clip is None:  # a distributed rank other than output_rank: it only decodes its tiles
                yield None
                continue
            body = clip[:, :, body_start:body_end]
            if held is not None:
                extent = c.frame_overlap
                body[:, :, :extent] = tiling.blend(held, body[:, :, :extent], extent, 2)
            held = clip[:, :, tail_start:tail_end] if tail_end > tail_start else None
            emit = body[:, :, :remaining]
            remaining -= emit.shape[2]
            if emit.shape[2]:
                yield emit
        if held is not None and remaining > 0:
            yield held[:, :, :remaining]

    def decode(self, z: torch.Tensor, progress: Callable[[int, int], None] | None = None) -> torch.Tensor | None:
        """Raw (denormalised) latents (B, 24, T, h, w) -> video (B, 3, F, 16h, 16w), float32, in the
        ImageNet-normalised space (see `to_unit_rgb`). F = 1 for T = 1, 5 for T = 2, else 17n + 5 for
        T = 5n + 2 (tails padded and cut as released). Under torch.distributed every rank must call it with
        the same latents; each gets the whole video, or None on ranks other than `output_rank` when set."""
        chunks = list(self.decode_stream(z, progress))
        return None if chunks[0] is None else torch.cat(chunks, dim=2)


def distributed_rank() -> tuple[int, int]:
    """(rank, world size) of the initialised default process group, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """The recipe's compute dtype: float32, or float16 for the release's fp16 recipe."""
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    named = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}
    resolved = named.get(dtype, None) if isinstance(dtype, str) else dtype
    if resolved not in (torch.float32, torch.float16):
        raise ValueError(f"dtype {dtype!r} is not supported: use torch.float32 ('fp32') or 'fp16' (release recipe)")
    return resolved


def resolve_fused(fused: bool | None, device: torch.device) -> bool:
    """Explicit argument, else MINIMAX_H3_VAE_FUSED=0|1, else on for CUDA when Triton is importable."""
    has_triton = importlib.util.find_spec("triton") is not None
    if fused is None:
        env = os.environ.get("MINIMAX_H3_VAE_FUSED", "").strip()
        if env and env not in ("0", "1"):
            raise ValueError(f"MINIMAX_H3_VAE_FUSED={env!r}: set it to 0 or 1")
        fused = env == "1" if env else device.type == "cuda" and has_triton
    if fused and not has_triton:
        raise ValueError("the fused path needs Triton (pip install triton); or ask for the eager path with "
                         "fused=False / MINIMAX_H3_VAE_FUSED=0")
    return bool(fused)


def check_latents(z: torch.Tensor, channels: int | None) -> None:
    """Raise ValueError naming the problem for latents the decoder cannot take.

    z: (B, C, T, h, w); `channels`: the decoder's C, or None to leave the channel count unchecked.
    """
    layout = f"(B, {channels or 'C'}, T, h, w)"
    if not isinstance(z, torch.Tensor):
        raise ValueError(f"latents must be a torch.Tensor, got {type(z).__name__}")
    if z.ndim != 5:
        raise ValueError(f"latents must be {layout}, got shape {tuple(z.shape)}")
    if channels is not None and z.shape[1] != channels:
        raise ValueError(f"latents have {z.shape[1]} channels, the decoder takes {channels} "
                         f"(shape {tuple(z.shape)}; expected {layout})")
    if min(z.shape) == 0:
        raise ValueError(f"latents are empty: shape {tuple(z.shape)}")
    if not z.is_floating_point():
        raise ValueError(f"latents must be floating point, got {z.dtype}")
    if not torch.isfinite(z).all():
        raise ValueError("latents contain NaN or Inf")


def denormalize_latents(z: torch.Tensor, config: H3DecoderConfig) -> torch.Tensor:
    """Pipeline latents -> decoder input: `z * latents_std + latents_mean`, per channel (dim 1)."""
    shape = (1, -1) + (1,) * (z.ndim - 2)
    mean = torch.tensor(config.latents_mean, dtype=torch.float32, device=z.device).view(shape)
    std = torch.tensor(config.latents_std, dtype=torch.float32, device=z.device).view(shape)
    return z.float() * std + mean


def to_unit_rgb(video: torch.Tensor) -> torch.Tensor:
    """Decoder output (B, 3, F, H, W) or (3, F, H, W), ImageNet-normalised -> RGB in [0, 1], same layout,
    float32."""
    std = torch.tensor(IMAGENET_STD, dtype=torch.float32, device=video.device).view(3, 1, 1, 1)
    mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32, device=video.device).view(3, 1, 1, 1)
    return (video.float() * std + mean).clamp_(0.0, 1.0)


def to_uint8_frames(video: torch.Tensor) -> torch.Tensor:
    """Decoder output of one video (3, F, H, W) or (1, 3, F, H, W) -> uint8 frames (F, H, W, 3), rounded."""
    if video.ndim == 5:
        if video.shape[0] != 1:
            raise ValueError(f"to_uint8_frames takes one video, got a batch of {video.shape[0]}")
        video = video[0]
    return to_unit_rgb(video).mul_(255.0).round_().to(torch.uint8).permute(1, 2, 3, 0).contiguous()
