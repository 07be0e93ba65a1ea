"""Tile-parallel decode on torch.distributed: the split, and bitwise equality on gloo ranks on the CPU (the API's
sweeps on forked ranks, the command under torchrun)."""

from __future__ import annotations

import os
import subprocess

import distributed_worker
import pytest
import torch
from distributed_worker import API_LENGTHS, CLI_LENGTHS, SHAPES, latents, sweep_latents
from repo import TINY
from safetensors.torch import load_file, save_file
from torchrun_runs import ON_FORKED_RANKS, forked_ranks, sweep_sizes, write_cli_inputs

from minimax_h3_vae import H3VideoDecoder
from minimax_h3_vae.distributed import plan_tile_calls, split_balanced


@pytest.mark.parametrize("count", [0, 1, 3, 7, 28, 29])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 8, 40])
def test_split_balanced(count, parts):
    ranges = split_balanced(count, parts)
    assert len(ranges) == parts and ranges[0][0] == 0 and ranges[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), "contiguous, every item once"
    sizes = [end - start for start, end in ranges]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("tiles", [1, 3, 28, 29])
@pytest.mark.parametrize("ranks", [1, 2, 4, 7, 40])
@pytest.mark.parametrize("tile_batch", [None, 1, 2, 5])
def test_tile_calls_cover_every_tile_once(tiles, ranks, tile_batch):
    plan = plan_tile_calls(tiles, tile_batch, ranks)
    assert len(plan) == ranks
    flat = [index for calls in plan for start, end in calls for index in range(start, end)]
    assert flat == list(range(tiles)), "each tile once, in order"
    per_rank = [sum(end - start for start, end in calls) for calls in plan]
    if tile_batch is None:
        assert max(per_rank) - min(per_rank) <= 1
    else:
        assert all(end - start <= tile_batch for calls in plan for start, end in calls)
        single = [call for calls in plan_tile_calls(tiles, tile_batch, 1) for call in calls]
        assert [call for calls in plan for call in calls] == single, "the same calls as on one process"
        calls_per_rank = [len(calls) for calls in plan]
        assert max(calls_per_rank) - min(calls_per_rank) <= 1, "balanced in decoder calls"


@pytest.fixture(scope="module")
def distributed_outputs(rank_sweep):
    return rank_sweep(2)


@ON_FORKED_RANKS
@pytest.mark.parametrize("tile_batch", [1, 2])
def test_bitwise_equal_to_single_process(distributed_outputs, tile_batch, one_thread):
    """With the same tile batch, every rank returns exactly the single-process output."""
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu", tile_batch=tile_batch)
    expected = model.decode(latents())
    for rank in (0, 1):
        out = torch.load(distributed_outputs / f"rank{rank}_batch{tile_batch}.pt")
        assert torch.equal(out, expected)


@ON_FORKED_RANKS
def test_blocks_offload_on_ranks(distributed_outputs, one_thread):
    """Each rank streams its own weights, layer-major over its share of the tiles: still the single-process
    output, bit for bit."""
    expected = H3VideoDecoder.from_pretrained(TINY, device="cpu", tile_batch=1).decode(latents())
    for rank in (0, 1):
        assert torch.equal(torch.load(distributed_outputs / f"rank{rank}_blocks_batch1.pt"), expected)


@ON_FORKED_RANKS
def test_automatic_batch_matches_single_process(distributed_outputs, one_thread):
    """Automatic batches: each rank decodes its share (2 and 1 tiles) in one call, the single process all 3
    in one call; no op depends on the tiles a call holds (docs/decoder.md §9), so the bits are the same."""
    expected = H3VideoDecoder.from_pretrained(TINY, device="cpu").decode(latents())
    outs = [torch.load(distributed_outputs / f"rank{rank}_batchNone.pt") for rank in (0, 1)]
    assert torch.equal(outs[0], outs[1]), "every rank stitches the same gathered tiles"
    assert torch.equal(outs[0], expected)


@ON_FORKED_RANKS
def test_output_rank_limits_the_output(distributed_outputs):
    assert torch.load(distributed_outputs / "rank0_output_rank1.pt") is None
    assert torch.equal(
        torch.load(distributed_outputs / "rank1_output_rank1.pt"), torch.load(distributed_outputs / "rank1_batch1.pt")
    )


@pytest.mark.xdist_group("torchrun_command")
def test_cli_under_torchrun_writes_one_file_equal_to_single_process(torchrun_command):
    run = torchrun_command
    assert run.result.returncode == 0, run.result.stderr[-3000:]
    assert sorted(p.name for p in run.spread.parent.iterdir()) == ["out.safetensors"], "one file, from rank 0"
    assert torch.equal(load_file(str(run.spread))["video"], load_file(str(run.single))["video"])
    assert "x 2 ranks" in run.result.stderr


@pytest.fixture(scope="module")
def single_process_files(tmp_path_factory):
    """T -> the command's output for the sweep's input of clip length T, from one process on one thread."""
    from minimax_h3_vae.command.main import main

    folder = tmp_path_factory.mktemp("single")
    write_cli_inputs(folder)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for length in CLI_LENGTHS:
            single = folder / f"single_{length}.safetensors"
            args = [
                folder / f"in_{length}.safetensors",
                single,
                "--model",
                TINY,
                "--device",
                "cpu",
                "--tile-batch",
                "1",
            ]
            assert main([str(a) for a in args]) == 0
    finally:
        torch.set_num_threads(threads)
    return {length: load_file(str(folder / f"single_{length}.safetensors"))["video"] for length in CLI_LENGTHS}


@pytest.mark.parametrize("ranks", sweep_sizes(2, 3, 4))
def test_command_on_ranks_every_clip_length(rank_sweep, single_process_files, ranks):
    """Bug: for most clip lengths (T = 7, 12, 72, ...) the output rank's stream yielded one chunk more than the
    other ranks' (the held tail), so the command's per-chunk agreement stopped pairing up and gloo reset the
    connection. Every rank now takes part in the same collectives for every T, and the file is the single
    process's, bit for bit."""
    folder = rank_sweep(ranks)
    for length in CLI_LENGTHS:
        spread = load_file(str(folder / f"out_{length}.safetensors"))["video"]
        assert torch.equal(spread, single_process_files[length]), f"T = {length}"


@pytest.fixture(scope="module")
def single_process_decodes():
    """(T, h, w, tile batch) -> one process's decode (one thread) of the sweep's latents."""
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {
            (length, h, w, tile_batch): model.decode(sweep_latents(length, h, w), tile_batch=tile_batch, tiling=tiling)
            for length in API_LENGTHS
            for h, w, tiling in SHAPES
            for tile_batch in (1, 3)
        }
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("ranks", sweep_sizes(2, 3, 4))
def test_windows_x_tiles_across_ranks_equal_one_process(rank_sweep, single_process_decodes, ranks):
    """The (window, tile) schedule: for T = 1, 2, 3, 7, 12, 13, frames smaller than one tile, a row of tiles and
    a 2 x 2 grid, and tile batches 1 and 3, every rank's decode equals the single process's bit for bit."""
    folder = rank_sweep(ranks)
    for (length, h, w, tile_batch), expected in single_process_decodes.items():
        for rank in range(ranks):
            got = torch.load(folder / f"api_{length}_{h}_{w}_{tile_batch}_rank{rank}.pt")
            assert torch.equal(got, expected), (length, h, w, tile_batch, rank)


@pytest.mark.parametrize(
    "units, windows, ranks, group",
    [(28, 14, 8, 2), (28, 14, 1, 1), (4, 14, 8, 2), (3, 2, 4, 2), (1, 14, 8, 8), (7, 3, 7, 1)],
)
def test_window_groups(units, windows, ranks, group):
    """The fewest windows whose units split evenly across the ranks (at most all windows): 28 tiles on 8
    ranks go 2 windows (56 tiles, 7 each) at a time; one process decodes window by window."""
    from minimax_h3_vae.distributed import window_group

    assert window_group(units, windows, ranks) == group


def test_calls_never_cross_a_window():
    """With a tile batch, a group's calls are each window's own calls (as on one process), shared out."""
    plan = plan_tile_calls(56, 5, 8, per_window=28)
    calls = [call for rank_calls in plan for call in rank_calls]
    single = [(w + a, w + min(a + 5, 28)) for w in (0, 28) for a in range(0, 28, 5)]
    assert calls == single and len(plan) == 8


@ON_FORKED_RANKS
def test_cli_rank_that_cannot_load_stops_every_rank(tmp_path):
    """Rank 1 gets a missing checkpoint: both ranks exit 2 with rank 1's error, printed once (by rank 0),
    nothing is written, no hang. (The ranks are forked as torchrun sets them up; the command's own launches
    under torchrun are in test_distributed_faults.py and above.)"""
    save_file({"latents": latents()[0]}, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.mp4"
    args = [str(TINY), str(tmp_path / "in.safetensors"), str(out), "--device", "cpu"]
    exits = forked_ranks(2, distributed_worker.cli, "cli", args, timeout=120)
    stderr = "".join(e.output for e in exits)
    assert [e.code for e in exits] == [2, 2], stderr[-2000:]
    message = f"error: {TINY}.missing: no such file or folder"
    assert stderr.count(message) == 1 and message in exits[0].output, stderr[-2000:]
    assert stderr.count("(rank 1)") == 1
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in.safetensors"]


@ON_FORKED_RANKS
def test_cli_rank_0_only_failure_stops_every_rank(tmp_path):
    """An output folder that does not take a file concerns rank 0 alone (the writer): every rank still
    exits 2 with rank 0's one line, printed once, and no rank is left in a collective ("Connection closed
    by peer", or a rank still running at the timeout)."""
    save_file({"latents": latents()[0]}, str(tmp_path / "in.safetensors"))
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = (
        os.geteuid() == 0 and not subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(folder)]).returncode
    )
    if not mounted:
        if os.geteuid() == 0:
            pytest.skip("cannot make a folder read-only for root here")
        os.chmod(folder, 0o555)
    try:
        args = [str(TINY), str(tmp_path / "in.safetensors"), str(folder / "out.mp4"), "--device", "cpu"]
        exits = forked_ranks(2, distributed_worker.cli, "cli_same", args, timeout=120)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=False)
    stderr = "".join(e.output for e in exits)
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "cannot create the output there" in errors[0], stderr[-2000:]
    assert "Connection closed" not in stderr
    assert [e.code for e in exits] == [2, 2], stderr[-2000:]
