"""Decode orchestration: the chunk loop over time, the tile loop over space, tiles per call, progress.

    latents (B, 24, T, h, w) -> chunk windows (tiling.plan_chunks)
      -> per window: tiles (tiling.plan_tiles) -> decoder calls of `tile_batch` tiles (model.decode_tiles;
         with offload="blocks" all of them block by block, model.decode_tiles_layer_major), shared across
         ranks (distributed.decode_shared) -> stitched frame (tiling.stitch)
      -> windows joined and cross-faded (tiling.join_chunks) -> frames, one chunk at a time

`H3VideoDecoder.decode` / `decode_stream` are the public entry points; they call `decode_stream` here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from . import distributed, limits, tiling
from .config import H3DecoderConfig
from .latents import check_latents

if TYPE_CHECKING:
    from .model import H3VideoDecoder

Progress = Callable[[int, int], None]


# With offload="blocks" the automatic tile batch stops at 4: on the H200, 4 tiles per call run within ~5% of
# 28 (benchmarks/RESULTS.md), and the small batch is what keeps the streamed decode's memory small.
STREAMED_TILE_BATCH = 4


def reserve_bytes(config: H3DecoderConfig, element: int, height: int = 768, width: int = 1344) -> int:
    """Device memory beyond the weights that one temporal window of a `height` x `width` video needs at one
    tile per call: the decoded tiles, the stitched frame and the one before it, one tile's activations.
    offload="auto" keeps the weights resident only if this much is left beside them."""
    c = config
    frames = c.chunk_latents + c.chunk_overlap_latents
    plan = tiling.plan_tiles(height // c.patch_size, width // c.patch_size, c)
    tile_h, tile_w = plan.latent_tile_shape
    tokens = frames * tile_h * tile_w + c.num_register_tokens + 1
    pixels = c.out_channels * frames * c.patch_size_t
    buffers = 4 * pixels * (plan.count * plan.rows.size * plan.cols.size + 2 * height * width)
    return buffers + limits.tile_bytes(c, element, tokens, torch.device("cuda"))


def auto_tile_batch(model: H3VideoDecoder, tiles: int, tokens: int, held_bytes: int) -> int:
    """Tiles per decoder call for `tiles` tiles of `tokens` tokens, when no tile batch is set.

    CUDA: what fits in 80% of the free memory and, with `max_gpu_memory`, in the cap less what the decoder
    holds (its device weights, the streaming slots, and `held_bytes` of this window's buffers). CPU: half
    the available host memory. With offload="blocks" every tile's residual stream stays on the device as
    well, and the batch stops at STREAMED_TILE_BATCH.
    """
    c = model.config
    layer_major = model.runtime.offload == "blocks"
    element = torch.finfo(model.compute_dtype).bits // 8
    state = tiles * tokens * c.dim * (4 + element) if layer_major else 0
    if model.device.type == "cuda":
        budget = int(0.8 * torch.cuda.mem_get_info(model.device)[0]) - state
        cap = model.runtime.max_gpu_memory
        if cap is not None:
            budget = min(budget, cap - model.device_bytes() - held_bytes - state)
    else:
        host = limits.available_host()
        budget = (host if host is not None else 2**62) // 2 - state
    batch = max(1, budget // limits.tile_bytes(c, element, tokens, model.device))
    return min(batch, STREAMED_TILE_BATCH) if layer_major else batch


def decode_window(model: H3VideoDecoder, z: torch.Tensor, advance: Callable[[int], None]) -> torch.Tensor | None:
    """One temporal window (B, C, t, h, w) -> (B, 3, 4t, 16h, 16w), spatially tiled and stitched.

    The tiles of all B videos go through the decoder together, `tile_batch` at a time (default: as many as
    fit, `auto_tile_batch`), shared across ranks under torch.distributed; with offload="blocks", layer-major
    over all of this rank's tiles. Returns None on a rank that does not receive the output. advance(n) is
    called as n tiles finish.
    """
    c = model.config
    plan = tiling.plan_tiles(z.shape[-2], z.shape[-1], c)
    tiles = torch.cat([z[..., rows, cols] for rows, cols in plan.latent_windows()])
    frames, (tile_h, tile_w) = z.shape[2], plan.latent_tile_shape
    tile_shape = (c.out_channels, frames * c.patch_size_t, plan.rows.size, plan.cols.size)
    tokens = frames * tile_h * tile_w + c.num_register_tokens + 1
    tile_batch = model.runtime.tile_batch
    done = 0

    def decode_calls(calls: list[tuple[int, int]], out: torch.Tensor) -> None:
        nonlocal done
        first, count = calls[0][0], calls[-1][1] - calls[0][0]
        # This window's buffers: the decoded tiles, the stitched frame, and the held tail of the last one.
        frame = (plan.rows.starts[-1] + plan.rows.size) * (plan.cols.starts[-1] + plan.cols.size)
        held = 4 * (out.numel() + 2 * z.shape[0] * math.prod(tile_shape[:2]) * frame)
        step = tile_batch or auto_tile_batch(model, count, tokens, held)
        parts = [(a, min(a + step, end)) for start, end in calls for a in range(start, end, step)]
        inputs = [tiles[a:b] for a, b in parts]
        outputs = [out[a - first : b - first] for a, b in parts]
        if model.runtime.offload == "blocks":
            model.decode_tiles_layer_major(inputs, outputs, advance)
        else:
            for tile_input, tile_output in zip(inputs, outputs):
                model.decode_tiles(tile_input, tile_output)
                advance(tile_input.shape[0])
        done += count

    decoded = distributed.decode_shared(
        tiles.shape[0],
        tile_batch,
        model.runtime.output_rank,
        lambda n: tiles.new_empty(n, *tile_shape, dtype=torch.float32),
        decode_calls,
    )
    if decoded is None:
        return None
    advance(tiles.shape[0] - done)  # the tiles other ranks decoded
    return tiling.stitch(decoded.split(z.shape[0]), plan)


def decode_stream(
    model: H3VideoDecoder, z: torch.Tensor, progress: Progress | None = None
) -> Iterator[torch.Tensor | None]:
    """The frames of `model.decode(z)`, one temporal chunk at a time (see `H3VideoDecoder.decode_stream`)."""
    c = model.config
    check_latents(z, c.latent_channels)
    z = z.to(model.device)
    plan = tiling.plan_chunks(z.shape[2], c)
    if plan.padded_frames > z.shape[2]:
        z = torch.cat([z, z[:, :, -1:].expand(-1, -1, plan.padded_frames - z.shape[2], -1, -1)], dim=2)
    total = tiling.plan_tiles(z.shape[-2], z.shape[-1], c).count * len(plan.starts) * z.shape[0]
    done = 0

    def advance(tiles: int) -> None:
        nonlocal done
        if tiles:
            done += tiles
            if progress is not None:
                progress(done, total)

    windows = (decode_window(model, z[:, :, start : start + plan.window], advance) for start in plan.starts)
    if not distributed.receives_output(model.runtime.output_rank):
        for _ in windows:  # this rank only decodes its share of the tiles
            yield None
        return
    yield from tiling.join_chunks(windows, plan, c)
