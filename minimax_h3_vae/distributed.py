"""Tile-parallel decoding under torch.distributed: the process group, who decodes which tiles, the gather,
and the ranks' agreement on failures.

Every rank calls `decode` with the same latents. The work unit is a (window, tile): the windows are taken in
groups (`window_group`: as few windows as make the units split evenly across the ranks, so 28 tiles on 8
ranks go two windows at a time, 7 tiles each), and for each group `share_tiles` gives each rank a
balanced, contiguous run of the decoder calls; the rank decodes them (decoding.py's loop) and `gather_tiles`
gathers the decoded tiles in order, on every rank or only on the output rank, which then stitches and
streams the group's windows. Without an initialised process group a rank's share is every call, one window
at a time, and nothing is gathered.

Failures: before a decode the ranks agree on its settings (`agree_call`: different latents or per-call
options would pair collectives of different sizes, which aborts or hangs gloo), and a rank whose own decode
fails tells the others at the next gather (`gather_tiles`), so every rank raises the same error. A rank
that dies (killed, out of memory) breaks the process group: a collective that fails then raises `RankLost`,
naming the ranks of this host that are gone (`init_process_group` records every rank's host and process
id), and only the lowest rank still running reports it (`reports_failures`).
"""

from __future__ import annotations

import datetime
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .text import parse_whole

# A rank that dies mid-decode leaves the others waiting in a collective: bound that wait.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)
MAX_RANKS = 65536
# The variables of torch.distributed's env:// rendezvous that a launcher (torchrun) sets besides the ranks.
RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT")
# How long a rank whose collective failed looks for the rank that ended (10 x 50 ms).
LOST_LOOKS, LOST_LOOK_INTERVAL = 10, 0.05

# Set by init_process_group: every rank's (host name, process id), and when this process entered the
# collective it is in (time.monotonic(), or None outside one), for a watchdog that looks for dead peers.
_peers: list[tuple[str, int]] | None = None
in_collective_since: float | None = None


class RankLost(RuntimeError):
    """A collective failed because another rank stopped (killed, crashed): the process group is broken."""

    def __init__(self, cause: BaseException | None = None):
        # A killed peer's sockets close a moment before its process shows as ended: look for it briefly.
        for _ in range(LOST_LOOKS):
            self.ranks = stopped_ranks()
            if self.ranks or _peers is None:
                break
            time.sleep(LOST_LOOK_INTERVAL)
        who = f"rank {', '.join(map(str, self.ranks))}" if self.ranks else "another rank"
        super().__init__(f"{who} stopped (killed, or it crashed) while the ranks were decoding")
        self.cause = cause


class RankFailed(RuntimeError):
    """Another rank's own decode failed (its message follows); this rank stopped with it."""

    def __init__(self, rank: int, message: str):
        super().__init__(f"rank {rank} failed while decoding its tiles: {message}")
        self.rank = rank


def _whole(text: str) -> int | None:
    """A launcher's variable as a whole number (ASCII digits only, as text.parse_whole reads them), else None."""
    try:
        return parse_whole(text)
    except ValueError:
        return None


def launched_world_size() -> int:
    """The number of ranks a launcher (torchrun) started: WORLD_SIZE, with RANK and LOCAL_RANK checked when
    it is above 1. Without WORLD_SIZE (or with 1) this is one process, whatever a stray RANK says.
    ValueError naming the variable for a value a launcher would not set."""
    text = os.environ.get("WORLD_SIZE", "1").strip()
    if _whole(text) is None or not 1 <= int(text) <= MAX_RANKS:
        raise ValueError(
            f"WORLD_SIZE={text!r} is not a number of processes from 1 to {MAX_RANKS}: unset it, or launch with torchrun"
        )
    ranks = int(text)
    if ranks > 1:
        for name in ("RANK", "LOCAL_RANK"):
            value = os.environ.get(name, "0").strip()
            if _whole(value) is None or int(value) >= ranks:
                raise ValueError(f"{name}={value!r} is not a rank below WORLD_SIZE={ranks}: launch with torchrun")
        for name in RENDEZVOUS_VARIABLES:
            if not os.environ.get(name, "").strip():
                raise ValueError(
                    f"WORLD_SIZE={ranks} but {name} is not set: launch with torchrun, or set "
                    f"{' and '.join(RENDEZVOUS_VARIABLES)} (the rank 0 host and a free port) on every rank"
                )
        port = os.environ["MASTER_PORT"].strip()
        if _whole(port) is None or not 0 < int(port) < 65536:
            raise ValueError(f"MASTER_PORT={port!r} is not a port number from 1 to 65535: launch with torchrun")
    return ranks


def init_process_group(cpu: bool) -> tuple[int, int, torch.device]:
    """Join the launcher's process group: NCCL on the GPU of LOCAL_RANK, or gloo on the CPU when `cpu` is
    set or there is no CUDA, and record every rank's host and process id (for `stopped_ranks`). Returns
    (rank, world size, this rank's device)."""
    import torch.distributed as dist

    global _peers
    use_cuda = not cpu and torch.cuda.is_available()
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    peers = [None] * dist.get_world_size()
    _collective(dist.all_gather_object, peers, (socket.gethostname(), os.getpid()))
    _peers = [tuple(peer) for peer in peers]
    return dist.get_rank(), dist.get_world_size(), device


def destroy_process_group() -> None:
    import torch.distributed as dist

    global _peers
    _peers = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def agree(report: tuple[int, str] | None, ranks: int) -> tuple[int, tuple[int, str]] | None:
    """Every rank calls this at the same points with its failure report (exit code, line) or None; all learn
    the first failing rank and its report, or None when none failed. One process: its own report."""
    if ranks == 1:
        return None if report is None else (0, report)
    import torch.distributed as dist

    reports = [None] * ranks
    _collective(dist.all_gather_object, reports, report)
    failed = [(rank, tuple(found)) for rank, found in enumerate(reports) if found is not None]
    return failed[0] if failed else None


def agree_call(settings: dict, problem: str | None) -> tuple[int, str] | None:
    """Before a decode under torch.distributed: every rank gives the call's settings (the latents' shape,
    the run options, the checkpoint: whatever decides the collectives or the values) and its own problem
    with the call (None if none). Returns the first rank with a problem and its message, or a message
    naming the settings the ranks disagree on (as rank -1); None when all agree. One process: its problem."""
    rank, ranks = rank_and_world()
    if ranks == 1:
        return None if problem is None else (0, problem)
    import torch.distributed as dist

    given = [None] * ranks
    _collective(dist.all_gather_object, given, (settings, problem))
    failed = [(r, found) for r, (_, found) in enumerate(given) if found is not None]
    if failed:
        return failed[0]
    differ = [name for name in settings if any(other[name] != settings[name] for other, _ in given)]
    if not differ:
        return None
    values = "; ".join(
        f"{name} " + ", ".join(f"{other[name]!r} (rank {r})" for r, (other, _) in enumerate(given)) for name in differ
    )
    return -1, (
        f"the ranks were given different decode settings: {values}; every rank must call decode with the "
        "same latents and options"
    )


def reports_failures() -> bool:
    """Whether this rank is the one that reports a failure every rank meets: the lowest rank still running.
    Ranks on other hosts count as running (only this host's processes can be looked at); one process: True."""
    rank = rank_and_world()[0]
    if _peers is None:  # no process group (it may have failed to form): the launcher's rank
        text = os.environ.get("RANK", "0").strip()
        return rank == 0 and _whole(text) in (None, 0)
    gone = set(stopped_ranks())
    return all(lower in gone for lower in range(rank))


def stopped_ranks() -> list[int]:
    """The ranks on this host whose process has ended (or is a zombie), from the ids init_process_group
    recorded; [] when they are unknown."""
    if _peers is None:
        return []
    host = socket.gethostname()
    return [rank for rank, (name, pid) in enumerate(_peers) if name == host and not _running(pid)]


def outlive_local_ranks(timeout: float) -> None:
    """Wait, at most `timeout` seconds, until every other rank of this host has ended. The rank that reported a
    failure stays running meanwhile: a rank that meets the failure later (torchrun's SIGTERM, the broken group)
    would otherwise find it ended, take itself for the lowest running rank and report again. No process group:
    returns at once."""
    if _peers is None:
        return
    host, me = socket.gethostname(), os.getpid()
    others = [pid for name, pid in _peers if name == host and pid != me]
    deadline = time.monotonic() + timeout
    while any(_running(pid) for pid in others) and time.monotonic() < deadline:
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _collective(call: Callable, *args, **kwargs):
    """`call(*args, **kwargs)`, a collective: marks the time it started (`in_collective_since`) and turns a
    failure into RankLost (the only way a collective of ranks that agree on their settings fails)."""
    global in_collective_since
    in_collective_since = time.monotonic()
    try:
        return call(*args, **kwargs)
    except RankLost:
        raise
    except RuntimeError as error:  # gloo: "Connection closed by peer", "Connection reset by peer", timeouts
        raise RankLost(error) from error
    finally:
        in_collective_since = None


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the initialised default process group, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def host_ranks() -> int:
    """The ranks on this host, which share its memory: from the ids init_process_group recorded, else the
    launcher's LOCAL_WORLD_SIZE, else every rank; 1 on one process."""
    ranks = rank_and_world()[1]
    if ranks == 1:
        return 1
    if _peers is not None:
        host = socket.gethostname()
        return sum(name == host for name, _ in _peers)
    text = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    return min(int(text), ranks) if (_whole(text) or 0) >= 1 else ranks


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


def share_tiles(
    count: int, tile_batch: int | None, per_window: int | None = None
) -> tuple[list[tuple[int, int]], list[int]]:
    """This rank's decoder calls for `count` tiles (of consecutive windows of `per_window` tiles), as
    consecutive tile ranges (start, end), and the number of tiles each rank decodes (`plan_tile_calls`).
    One process: every call, and counts [count]."""
    rank, ranks = rank_and_world()
    calls = plan_tile_calls(count, tile_batch, ranks, per_window)
    return calls[rank], [sum(end - start for start, end in rank_calls) for rank_calls in calls]


def gather_tiles(
    local: torch.Tensor, counts: list[int], output_rank: int | None, failure: Exception | None = None
) -> torch.Tensor | None:
    """After each rank decoded its share (`share_tiles`) into `local` (counts[rank] tiles) or failed with
    `failure`: every decoded tile in order, where the output is received (see `receives_output`), else None.

    A rank's failure is told to every rank first, so that none waits in the gather for it: the failing rank
    raises its own error, the others RankFailed. One process: `local`, or its failure raised."""
    ranks = len(counts)
    if ranks == 1:
        if failure is not None:
            raise failure
        return local
    failed = agree(None if failure is None else (1, f"{type(failure).__name__}: {failure}"), ranks)
    if failure is not None:
        raise failure
    if failed is not None:
        raise RankFailed(failed[0], failed[1][1])
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
        _collective(dist.all_gather, gathered, padded)
    elif dist.get_rank() == output_rank:
        gathered = [torch.empty_like(padded) for _ in counts]
        _collective(dist.gather, padded, gathered, dst=output_rank)
    else:
        _collective(dist.gather, padded, None, dst=output_rank)
        return None
    return torch.cat([part[:count] for part, count in zip(gathered, counts)])
