"""Tile-parallel decoding under torch.distributed: the process group, who decodes which tiles, the gather,
and the ranks' agreement on failures.

Every rank calls `decode` with the same latents. The work unit is a (window, tile): the windows are taken in
groups (`window_group`: as few windows as make the units split evenly across the ranks, so 28 tiles on 8
ranks go two windows at a time, 7 tiles each), and for each group `decode_shared` gives each rank a
balanced, contiguous run of its decoder calls, lets it decode them, and gathers the decoded tiles in order,
on every rank or only on the output rank, which then stitches and streams the group's windows. Without an
initialised process group it is a plain loop on one process, one window at a time.
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Callable

import torch

# A rank that dies mid-decode leaves the others waiting in a collective: bound that wait.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)
MAX_RANKS = 65536


def launched_world_size() -> int:
    """The number of ranks a launcher (torchrun) started: WORLD_SIZE, with RANK and LOCAL_RANK checked when
    it is above 1. Without WORLD_SIZE (or with 1) this is one process, whatever a stray RANK says.
    ValueError naming the variable for a value a launcher would not set."""
    text = os.environ.get("WORLD_SIZE", "1").strip()
    if not text.isdigit() or int(text) < 1 or int(text) > MAX_RANKS:
        raise ValueError(
            f"WORLD_SIZE={text!r} is not a number of processes from 1 to {MAX_RANKS}: unset it, or launch with torchrun"
        )
    ranks = int(text)
    if ranks > 1:
        for name in ("RANK", "LOCAL_RANK"):
            value = os.environ.get(name, "0").strip()
            if not value.isdigit() or int(value) >= ranks:
                raise ValueError(f"{name}={value!r} is not a rank below WORLD_SIZE={ranks}: launch with torchrun")
    return ranks


def init_process_group(cpu: bool) -> tuple[int, int, torch.device]:
    """Join the launcher's process group: NCCL on the GPU of LOCAL_RANK, or gloo on the CPU when `cpu` is
    set or there is no CUDA. Returns (rank, world size, this rank's device)."""
    import torch.distributed as dist

    use_cuda = not cpu and torch.cuda.is_available()
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    return dist.get_rank(), dist.get_world_size(), device


def destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def agree(report: tuple[int, str] | None, ranks: int) -> tuple[int, tuple[int, str]] | None:
    """Every rank calls this at the same points with its failure report (exit code, line) or None; all learn
    the first failing rank and its report, or None when none failed. One process: its own report."""
    if ranks == 1:
        return None if report is None else (0, report)
    import torch.distributed as dist

    reports = [None] * ranks
    dist.all_gather_object(reports, report)
    failed = [(rank, tuple(found)) for rank, found in enumerate(reports) if found is not None]
    return failed[0] if failed else None


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the initialised default process group, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def receives_output(output_rank: int | None) -> bool:
    """Whether this rank gets the decoded video: every rank when `output_rank` is None, else only that one."""
    return output_rank is None or rank_and_world()[0] == output_rank


def split_balanced(count: int, parts: int) -> list[tuple[int, int]]:
    """`count` items in `parts` contiguous ranges whose sizes differ by at most one (the larger first)."""
    base, extra = divmod(count, parts)
    bounds = [0]
    for part in range(parts):
        bounds.append(bounds[-1] + base + (part < extra))
    return list(zip(bounds, bounds[1:]))


def window_group(units_per_window: int, windows: int, ranks: int) -> int:
    """Windows decoded together: the fewest whose work units (tiles, or decoder calls with a tile batch)
    split evenly across the ranks, at most all of them; 1 on one process (the plain window loop)."""
    return max(1, min(windows, ranks // math.gcd(units_per_window, ranks)))


def plan_tile_calls(
    tiles: int, tile_batch: int | None, ranks: int, per_window: int | None = None
) -> list[list[tuple[int, int]]]:
    """Which tiles each rank decodes, as a list of decoder calls (start, end) per rank; the tiles are those
    of consecutive windows of `per_window` tiles each (default: one window).

    With a tile batch, each window's tiles are cut into calls of `tile_batch` in order, whatever the number
    of ranks, and each rank takes a balanced run of consecutive calls: every call, and so every decoded
    value, is the same as in a single-process decode with that tile batch. Without one, each rank takes one
    balanced share, to be cut further by the caller only if it does not fit in memory.
    """
    if tile_batch is None:
        return [[share] if share[1] > share[0] else [] for share in split_balanced(tiles, ranks)]
    per_window = per_window or tiles
    calls = [
        (start, min(start + tile_batch, window + per_window, tiles))
        for window in range(0, tiles, per_window)
        for start in range(window, min(window + per_window, tiles), tile_batch)
    ]
    return [calls[a:b] for a, b in split_balanced(len(calls), ranks)]


def decode_shared(
    count: int,
    tile_batch: int | None,
    output_rank: int | None,
    allocate: Callable[[int], torch.Tensor],
    decode_calls: Callable[[list[tuple[int, int]], torch.Tensor], None],
    per_window: int | None = None,
) -> torch.Tensor | None:
    """Decode `count` tiles (of consecutive windows of `per_window` tiles) across the ranks; return all of
    them, in order, where the output is received.

    allocate(n) returns an empty (n, ...) buffer for n decoded tiles; decode_calls(calls, out) decodes this
    rank's calls, a list of consecutive tile ranges (start, end), into `out`, whose first row is tile
    calls[0][0]. Returns the (count, ...) decoded tiles, or None on a rank that does not receive the output
    (see `receives_output`).
    """
    rank, ranks = rank_and_world()
    calls = plan_tile_calls(count, tile_batch, ranks, per_window)
    counts = [sum(end - start for start, end in rank_calls) for rank_calls in calls]
    local = allocate(counts[rank])
    if calls[rank]:
        decode_calls(calls[rank], local)
    if ranks == 1:
        return local
    return _gather(local, counts, output_rank)


def _gather(local: torch.Tensor, counts: list[int], output_rank: int | None) -> torch.Tensor | None:
    """Every rank's decoded tiles (rank r holds counts[r]), concatenated in rank order, where received."""
    import torch.distributed as dist

    # Collectives move equal shapes: pad a share below the largest (the padding is never read).
    padded = local
    if local.shape[0] < max(counts):
        padded = local.new_empty(max(counts), *local.shape[1:])
        padded[: local.shape[0]] = local
    if output_rank is None:
        gathered = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(gathered, padded)
    elif dist.get_rank() == output_rank:
        gathered = [torch.empty_like(padded) for _ in counts]
        dist.gather(padded, gathered, dst=output_rank)
    else:
        dist.gather(padded, None, dst=output_rank)
        return None
    return torch.cat([part[:count] for part, count in zip(gathered, counts)])
