"""Spatial tiling and temporal chunking, as released: pure functions over plans and tensors.

Spatial: tiles of 256 px with at least 64 px overlap (the release's geometry; a run option, `Tiling`),
tile-local positions, composed in row-major order by blending each tile with the RAW tiles above and to its
left, then cropping its trailing overlaps.
Temporal: chunks of 7 latent frames advancing by 5; each yields 17 new pixel frames and 5 that are
cross-faded into the next chunk's first 5. docs/decoder.md (sections 5 and 6) states both rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from .config import H3DecoderConfig


@dataclass(frozen=True)
class Tiling:
    """The spatial tile geometry, in pixels: tiles of `size` with at least `overlap` between neighbours (the
    release: 256 / 64). `size=None` is one tile covering the whole frame (diffusers' `disable_tiling()`).
    Both must be multiples of the checkpoint's patch size (`check`)."""

    size: int | None = 256
    overlap: int = 64

    def __post_init__(self):
        if self.size is not None and not (_is_int(self.size) and 1 <= self.size <= MAX_PIXELS):
            raise ValueError(f"tiling size must be a whole number of pixels >= 1 (or None: untiled), got {self.size!r}")
        if not (_is_int(self.overlap) and 0 <= self.overlap <= MAX_PIXELS):
            raise ValueError(f"tiling overlap must be a whole number of pixels >= 0, got {self.overlap!r}")
        if self.size is None and self.overlap:
            raise ValueError("an untiled plan (size None) has no overlap: give overlap=0")
        if self.size is not None and self.overlap >= self.size:
            raise ValueError(f"tiling overlap {self.overlap} px must be smaller than the tile size {self.size} px")

    def check(self, config: H3DecoderConfig) -> Tiling:
        """self, if its pixels fall on the latent grid of `config`; else ValueError."""
        p = config.patch_size
        if (self.size or 0) % p or self.overlap % p:
            raise ValueError(
                f"tiling {self.size}/{self.overlap} px: tile size and overlap must be multiples of the patch size "
                f"({p} px, one latent)"
            )
        return self


# Larger than any frame: a bound on tile sizes, so that no plan is sized by an absurd number.
MAX_PIXELS = 2**20


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


RELEASE_TILING = Tiling()


@dataclass(frozen=True)
class AxisPlan:
    """Tiles along one axis, in pixels: tile i covers [starts[i], starts[i] + size)."""

    starts: tuple[int, ...]
    size: int
    overlaps: tuple[int, ...]  # overlaps[i] is shared by tiles i and i + 1

    @property
    def count(self) -> int:
        return len(self.starts)


def plan_axis(length: int, tile: int, min_overlap: int, step: int) -> AxisPlan:
    """Fewest tiles of `tile` px that cover `length` with overlaps >= `min_overlap`.

    The slack is handed out `step` px at a time, round-robin from the first overlap, so every boundary
    stays on the latent grid. A length that fits one tile gets one tile of its own length.
    """
    if length <= tile:
        return AxisPlan((0,), length, ())
    count = -(-length // tile)
    while tile * count - min_overlap * (count - 1) < length:
        count += 1
    overlaps = [min_overlap] * (count - 1)
    slack = tile * count - min_overlap * (count - 1) - length
    for i in range(slack // step):
        overlaps[i % (count - 1)] += step
    starts = [0]
    for overlap in overlaps:
        starts.append(starts[-1] + tile - overlap)
    return AxisPlan(tuple(starts), tile, tuple(overlaps))


@dataclass(frozen=True)
class TilePlan:
    """The spatial tiles of a frame, row-major; all tiles share one shape."""

    rows: AxisPlan
    cols: AxisPlan
    patch_size: int

    @property
    def count(self) -> int:
        return self.rows.count * self.cols.count

    @property
    def latent_tile_shape(self) -> tuple[int, int]:
        return self.rows.size // self.patch_size, self.cols.size // self.patch_size

    def latent_windows(self) -> list[tuple[slice, slice]]:
        """(rows, cols) latent slices of every tile, row-major."""
        p = self.patch_size
        return [
            (slice(y // p, (y + self.rows.size) // p), slice(x // p, (x + self.cols.size) // p))
            for y in self.rows.starts
            for x in self.cols.starts
        ]


def plan_tiles(
    latent_height: int, latent_width: int, config: H3DecoderConfig, tiling: Tiling = RELEASE_TILING
) -> TilePlan:
    """The tiles of a frame of latent size (h, w) with the geometry `tiling` (untiled: one tile)."""
    p = config.patch_size
    height, width = latent_height * p, latent_width * p
    size = tiling.size if tiling.size is not None else max(height, width)
    return TilePlan(plan_axis(height, size, tiling.overlap, p), plan_axis(width, size, tiling.overlap, p), p)


def blend(old: torch.Tensor, new_head: torch.Tensor, extent: int, dim: int) -> torch.Tensor:
    """Linear cross-fade over an overlap of `extent` entries along `dim`.

    `new_head` holds the first n <= extent entries of the new piece; they meet entries [L - extent,
    L - extent + n) of `old` (length L). Returns `old * (1 - k/extent) + new * (k/extent)` for k < n, in
    `new_head`'s dtype, as a new tensor.
    """
    count = new_head.shape[dim]
    weight = torch.arange(count, device=new_head.device, dtype=new_head.dtype) / extent
    shape = [1] * new_head.ndim
    shape[dim] = count
    weight = weight.view(shape)
    return old.narrow(dim, old.shape[dim] - extent, count) * (1 - weight) + new_head * weight


def stitch(tiles: list[torch.Tensor], plan: TilePlan, out: torch.Tensor | None = None) -> torch.Tensor:
    """Compose decoded tiles (row-major, each (..., tile_h, tile_w) pixels) into one frame, as released.

    Each tile is blended with the raw tile above (over their vertical overlap), then with the raw tile to
    its left (over the horizontal one), then its trailing overlaps are cut. Where both overlaps cross,
    the top-left tile's share is lost: that is the released behaviour, kept for parity. Only the part of
    each tile that survives the cut is computed, straight into `out`.
    """
    rows, cols = plan.rows, plan.cols
    height = rows.starts[-1] + rows.size
    width = cols.starts[-1] + cols.size
    if out is None:
        out = tiles[0].new_empty(*tiles[0].shape[:-2], height, width)
    for i, y in enumerate(rows.starts):
        keep_h = rows.size - (rows.overlaps[i] if i < rows.count - 1 else 0)
        for j, x in enumerate(cols.starts):
            keep_w = cols.size - (cols.overlaps[j] if j < cols.count - 1 else 0)
            tile = tiles[i * cols.count + j]
            region = out[..., y : y + keep_h, x : x + keep_w]
            region.copy_(tile[..., :keep_h, :keep_w])
            if i > 0:
                extent = rows.overlaps[i - 1]
                above = tiles[(i - 1) * cols.count + j][..., :keep_w]
                head = min(extent, keep_h)
                region[..., :head, :] = blend(above, tile[..., :head, :keep_w], extent, -2)
            if j > 0:
                extent = cols.overlaps[j - 1]
                left = tiles[i * cols.count + j - 1][..., :keep_h, :]
                head = min(extent, keep_w)
                region[..., :, :head] = blend(left, region[..., :, :head], extent, -1)
    return out


@dataclass(frozen=True)
class ChunkPlan:
    """The decoder calls over time: call i reads latent frames [starts[i], starts[i] + window).

    The latents are first extended to `padded_frames` by repeating the last one; the result is cut to
    `out_frames` pixel frames.
    """

    starts: tuple[int, ...]
    window: int
    padded_frames: int
    out_frames: int


def plan_chunks(latent_frames: int, config: H3DecoderConfig) -> ChunkPlan:
    """The release's temporal plan, extended to T = 1 and T = 2.

    T >= 3: chunks of `chunk_latents` (5) advancing frames, each reading `chunk_overlap_latents` (2) more;
    `17 n + 5` pixel frames for `5 n + 2` latents, the tail padded and cut. T = 1: one call over the single
    latent, keeping its last pixel frame (the release's single-image decode). T = 2, which the release
    cannot decode: decoded as T = 3 with the last latent repeated, keeping the 5 frames the two latents
    cover (1 for the first latent, 4 for the second, as in every first chunk).
    """
    if latent_frames < 1:
        raise ValueError(f"need at least 1 latent frame, got {latent_frames}")
    if latent_frames == 1:
        return ChunkPlan((0,), 1, 1, 1)
    if latent_frames == 2:
        plan = plan_chunks(3, config)
        return ChunkPlan(plan.starts, plan.window, plan.padded_frames, plan.out_frames - config.patch_size_t)
    chunk, ratio = config.chunk_latents, config.patch_size_t
    tokens = latent_frames + config.token_drop
    pad = (-tokens) % chunk
    calls = (tokens + pad) // chunk - int(config.token_drop > 0)
    window = chunk + config.chunk_overlap_latents
    body, tail = chunk_spans(window, config)
    frames = calls * (body[1] - body[0]) + (tail[1] - tail[0])
    # A padded latent covers `ratio` pixel frames, except the first latent of a chunk, which covers
    # `clip_length % ratio` (the encoder's leading pad took the rest).
    first_latent_frames = config.clip_length % ratio
    for k in range(pad):
        starts_chunk = (latent_frames + k) % chunk == 0
        frames -= first_latent_frames if first_latent_frames and starts_chunk else ratio
    return ChunkPlan(tuple(i * chunk for i in range(calls)), window, latent_frames + pad, frames)


def chunk_spans(window: int, config: H3DecoderConfig) -> tuple[tuple[int, int], tuple[int, int]]:
    """Pixel-frame spans of one decoder call: the frames it emits and the tail it hands to the next call."""
    chunk_frames = config.chunk_latents * config.patch_size_t
    call_frames = window * config.patch_size_t
    body = (config.frame_pre_padding, min(chunk_frames, call_frames))
    if config.token_drop == 0:
        return body, (0, 0)
    tail_start = min(chunk_frames + config.frame_pre_padding, call_frames)
    return body, (tail_start, min(2 * chunk_frames, call_frames))


def join_chunks(clips: Iterable[torch.Tensor], plan: ChunkPlan, config: H3DecoderConfig) -> Iterator[torch.Tensor]:
    """The video's frames, one chunk per decoded window of `plan` (one (..., 4 * window, H, W) clip per start,
    frames on dim 2), cut and cross-faded as released: `plan.out_frames` frames in all.

    Each clip gives its body frames; its tail frames are held back and cross-faded into the next clip's first
    `frame_overlap` frames; the last clip's tail is appended to its body. Exactly one chunk per window, so a
    consumer can pair each chunk with its window (the ranks of a distributed decode do). Chunks are views of
    the clips, except the last, which is a new tensor when it takes a tail.
    """
    (body_start, body_end), (tail_start, tail_end) = chunk_spans(plan.window, config)
    remaining = plan.out_frames
    held = None
    for index, clip in enumerate(clips):
        body = clip[:, :, body_start:body_end]
        if held is not None:
            extent = config.frame_overlap
            body[:, :, :extent] = blend(held, body[:, :, :extent], extent, 2)
        # A copy, so that this window's buffer can go before the next window is decoded.
        held = clip[:, :, tail_start:tail_end].clone() if tail_end > tail_start else None
        emit = body[:, :, :remaining]
        remaining -= emit.shape[2]
        if index == len(plan.starts) - 1 and held is not None and remaining > 0:
            emit = torch.cat([emit, held[:, :, :remaining]], dim=2)
            remaining = 0
        yield emit
        del clip, body, emit


def check_temporal_plan(config: H3DecoderConfig) -> None:
    """ValueError unless the temporal plan of `config` decodes every clip length: for each T up to three
    windows (past that the plan repeats), every window lies within the padded latents and the chunks hold
    exactly `out_frames` frames. Some clip_length / token_drop pairs a config file may hold do not."""
    window = config.chunk_latents + config.chunk_overlap_latents
    for frames in range(1, 3 * window + 2):
        plan = plan_chunks(frames, config)
        clips = [torch.zeros(1, 1, plan.window * config.patch_size_t, 1, 1) for _ in plan.starts]
        try:
            got = sum(chunk.shape[2] for chunk in join_chunks(iter(clips), plan, config))
        except (IndexError, RuntimeError):
            got = -1
        fits = bool(plan.starts) and plan.starts[-1] + plan.window <= plan.padded_frames
        if not fits or got != plan.out_frames or plan.out_frames < 1:
            raise ValueError(
                f"clip_length {config.clip_length} with token_drop {config.token_drop} gives no temporal plan for "
                f"{frames} latent frames: not an encoder's chunking (the release: 17 and 3; an encoder drops fewer "
                "latents than a chunk holds)"
            )
