"""Decode orchestration: the chunk loop over time, the tile loop over space, tiles per call, progress.

    latents (B, 24, T, h, w) -> chunk windows (tiling.plan_chunks)
      -> per window: tiles (tiling.plan_tiles) -> decoder calls of `tile_batch` tiles (model.decode_tiles),
         shared across ranks (distributed.decode_shared) -> stitched frame (tiling.stitch)
      -> windows joined and cross-faded (tiling.join_chunks) -> frames, one chunk at a time

`H3VideoDecoder.decode` / `decode_stream` are the public entry points; they call `decode_stream` here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from . import distributed, tiling
from .latents import check_latents

if TYPE_CHECKING:
    from .model import H3VideoDecoder

Progress = Callable[[int, int], None]


def auto_tile_batch(model: H3VideoDecoder, tile_tokens: int) -> int:
    """Tiles per decoder call that fit in 80% of the free GPU memory (all of them on the CPU)."""
    if model.device.type != "cuda":
        return 2**31 - 1
    free, _ = torch.cuda.mem_get_info(model.device)
    c = model.config
    element = torch.finfo(model.compute_dtype).bits // 8
    # A conservative count of the live activations per token at the FFN's peak: w1's output and the
    # gate in the compute dtype, the fp32 residual and its temporaries, and the tile's fp32 pixels.
    per_token = (4 * c.ffn_dim + 12 * c.dim) * element + 12 * c.dim + 3 * c.patch_dim * 4
    return max(1, int(0.8 * free) // (per_token * tile_tokens))


def decode_window(model: H3VideoDecoder, z: torch.Tensor, advance: Callable[[int], None]) -> torch.Tensor | None:
    """One temporal window (B, C, t, h, w) -> (B, 3, 4t, 16h, 16w), spatially tiled and stitched.

    The tiles of all B videos go through the decoder together, `tile_batch` at a time (default: as many as
    fit in free GPU memory), shared across ranks under torch.distributed. Returns None on a rank that does
    not receive the output. advance(n) is called as n tiles finish.
    """
    c = model.config
    plan = tiling.plan_tiles(z.shape[-2], z.shape[-1], c)
    tiles = torch.cat([z[..., rows, cols] for rows, cols in plan.latent_windows()])
    frames, (tile_h, tile_w) = z.shape[2], plan.latent_tile_shape
    tile_shape = (c.out_channels, frames * c.patch_size_t, plan.rows.size, plan.cols.size)
    tokens = frames * tile_h * tile_w + c.num_register_tokens + 1
    tile_batch = model.runtime.tile_batch
    done = 0

    def decode_range(start: int, end: int, out: torch.Tensor) -> None:
        nonlocal done
        step = tile_batch or auto_tile_batch(model, tokens)
        for part in range(start, end, step):
            stop = min(part + step, end)
            model.decode_tiles(tiles[part:stop], out[part - start : stop - start])
            advance(stop - part)
            done += stop - part

    decoded = distributed.decode_shared(
        tiles.shape[0],
        tile_batch,
        model.runtime.output_rank,
        lambda n: tiles.new_empty(n, *tile_shape, dtype=torch.float32),
        decode_range,
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
