"""Tile plans, the release's composition rule, and the temporal chunk plan."""

from __future__ import annotations

import pytest
import torch

from minimax_h3_vae import H3DecoderConfig
from minimax_h3_vae.tiling import blend, join_chunks, plan_axis, plan_chunks, plan_tiles, stitch

CONFIG = H3DecoderConfig()


@pytest.mark.parametrize(
    "length, starts",
    [
        (768, (0, 160, 336, 512)),
        (1344, (0, 176, 352, 528, 704, 896, 1088)),
        (480, (0, 112, 224)),
        (464, (0, 96, 208)),
        (256, (0,)),
    ],
)
def test_spec_examples(length, starts):
    assert plan_axis(length, 256, 64, 16).starts == starts


def test_native_length_single_tile():
    plan = plan_axis(160, 256, 64, 16)
    assert plan.starts == (0,) and plan.size == 160 and plan.overlaps == ()


@pytest.mark.parametrize("length", range(272, 4097, 16))
def test_plan_properties(length):
    plan = plan_axis(length, 256, 64, 16)
    assert plan.starts[0] == 0 and plan.starts[-1] + 256 == length, "tiles must cover exactly"
    assert all(s % 16 == 0 for s in plan.starts), "boundaries on the latent grid"
    assert all(o >= 64 and o % 16 == 0 for o in plan.overlaps)
    assert all(b - a == 256 - o for a, b, o in zip(plan.starts, plan.starts[1:], plan.overlaps))
    n = plan.count
    assert 256 * (n - 1) - 64 * (n - 2) < length, "one tile fewer would have covered it: not the fewest"
    assert max(plan.overlaps) - min(plan.overlaps) <= 16, "slack is handed out round-robin"


def test_tiles_of_1344x768_share_one_shape():
    plan = plan_tiles(48, 84, CONFIG)
    assert plan.count == 28 and plan.latent_tile_shape == (16, 16)
    assert all(r.stop - r.start == 16 and c.stop - c.start == 16 for r, c in plan.latent_windows())


def test_stitch_matches_diffusers(oracle_vae):
    """Random tiles on a 288 x 464 grid, composed by the oracle's own stitcher and by ours."""
    plan = plan_tiles(18, 29, CONFIG)
    tiles = [torch.randn(2, 3, 4, 256, 256, generator=torch.Generator().manual_seed(i)) for i in range(plan.count)]
    grid = [tiles[i * plan.cols.count : (i + 1) * plan.cols.count] for i in range(plan.rows.count)]
    expected = oracle_vae._stitch_tiles(grid, list(plan.rows.overlaps), list(plan.cols.overlaps))
    out = stitch(tiles, plan)
    assert out.shape == expected.shape == (2, 3, 4, 288, 464)
    assert torch.equal(out, expected), f"max abs difference {(out - expected).abs().max().item():.3g}"


def test_stitch_loses_top_left_share_where_overlaps_cross():
    """The release's rule: blend with the RAW tiles above and left, so at a crossing the top-left tile
    drops out: D'' = C (1 - b) + (1 - a) b B + a b D (docs/decoder.md, section 5)."""
    plan = plan_tiles(20, 20, CONFIG)  # 320 px: two tiles per axis, overlap 192
    values = {"A": 1.0, "B": 2.0, "C": 4.0, "D": 8.0}
    tiles = [torch.full((1, 256, 256), v) for v in values.values()]
    out = stitch(tiles, plan)
    overlap = plan.rows.overlaps[0]
    y, x = 64 + 10, 64 + 30  # inside both overlaps, as seen from tile D at (64, 64)
    a, b = 10 / overlap, 30 / overlap
    expected = values["C"] * (1 - b) + (1 - a) * b * values["B"] + a * b * values["D"]
    assert out[0, y, x].item() == pytest.approx(expected, abs=1e-6)


def test_blend_weights():
    old, new = torch.zeros(1, 8), torch.ones(1, 8)
    assert blend(old, new[:, :4], 4, -1).tolist() == [[0.0, 0.25, 0.5, 0.75]]
    assert blend(old, new[:, :2], 4, -1).tolist() == [[0.0, 0.25]], "a head cut short keeps its weights"


@pytest.mark.parametrize("frames, expected", [(1, 1), (2, 5), (3, 9), (7, 22), (8, 26), (12, 39), (17, 56), (72, 243)])
def test_frame_counts(frames, expected):
    assert plan_chunks(frames, CONFIG).out_frames == expected


def test_chunk_plan_of_a_10s_clip():
    plan = plan_chunks(72, CONFIG)
    assert plan.starts == tuple(range(0, 70, 5)) and plan.window == 7 and plan.padded_frames == 72


def test_padded_tail():
    plan = plan_chunks(13, CONFIG)
    assert plan.padded_frames == 17 and plan.starts == (0, 5, 10)
    assert plan.out_frames == 43


def test_zero_frames_rejected():
    with pytest.raises(ValueError, match="at least 1"):
        plan_chunks(0, CONFIG)


@pytest.mark.parametrize("frames", range(1, 41))
def test_one_chunk_per_window(frames):
    """join_chunks yields exactly one chunk per window, whatever T (the ranks of a distributed decode pair
    their collectives by it), and the chunks hold plan.out_frames frames in order."""
    plan = plan_chunks(frames, CONFIG)
    clips = [torch.arange(4 * plan.window, dtype=torch.float32).view(1, 1, -1, 1, 1) + 100 * i for i in plan.starts]
    chunks = list(join_chunks(iter(clips), plan, CONFIG))
    assert len(chunks) == len(plan.starts)
    assert sum(chunk.shape[2] for chunk in chunks) == plan.out_frames and all(c.shape[2] for c in chunks)
