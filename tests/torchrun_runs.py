"""torchrun launches of tests/distributed_worker.py: gloo ranks on the CPU, one thread each (torchrun's own
choice); and the one sweep launch per world size that the tests of that size share (each torchrun start-up
costs seconds on two cores)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from distributed_worker import CLI_LENGTHS, latents
from repo import REPO, TINY
from safetensors.torch import save_file

from minimax_h3_vae import save_latents
from minimax_h3_vae.command import main as cli

WORKER = Path(__file__).with_name("distributed_worker.py")
# The worker's jobs run by the sweep on each world size: what the tests of that size read.
SWEEP_JOBS = {
    1: ("auto",),
    2: ("disagree", "decode", "auto", "api", "cli"),
    3: ("auto", "api", "cli"),
    4: ("auto", "api", "cli"),
}


def on_sweep(ranks: int) -> pytest.MarkDecorator:
    """The tests that read the sweep on `ranks` ranks run in one pytest-xdist worker, which launches it once."""
    return pytest.mark.xdist_group(f"sweep{ranks}")


def sweep_sizes(*sizes: int) -> list:
    """`ranks` parameters for tests that read the sweep of that size (`on_sweep` marks each)."""
    return [pytest.param(ranks, marks=on_sweep(ranks)) for ranks in sizes]


def torchrun(*args, ranks=2, timeout=240) -> subprocess.CompletedProcess:
    """distributed_worker.py ARGS under `torchrun --standalone` on `ranks` ranks; its output captured as text."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ranks}",
        str(WORKER),
        *map(str, args),
    ]
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # torchrun's own choice (1 thread per rank) is part of what is tested
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def write_cli_inputs(folder: Path) -> None:
    """The `cli` job's inputs: folder/in_T.safetensors, (24, T, 1, 29) latents of seed T, for T in CLI_LENGTHS."""
    for length in CLI_LENGTHS:
        z = torch.randn(24, length, 1, 29, generator=torch.Generator().manual_seed(length))
        save_file({"latents": z}, str(folder / f"in_{length}.safetensors"))


def sweep(folder: Path, ranks: int) -> None:
    """The worker's SWEEP_JOBS[ranks] on `ranks` ranks, writing into `folder` (failing the test if it fails)."""
    write_cli_inputs(folder)
    result = torchrun("sweep", TINY, folder, *SWEEP_JOBS[ranks], ranks=ranks, timeout=480)
    assert result.returncode == 0, result.stderr[-3000:]


@dataclass(frozen=True)
class CommandRun:
    """The command on 2 torchrun ranks (`result`, writing `spread`) and in one process on one thread, as each
    rank runs (`single`), from the same latents file with sound."""

    result: subprocess.CompletedProcess
    single: Path
    spread: Path


def command_run(folder: Path) -> CommandRun:
    """The command under torchrun, once for every test of what it writes: latents() (3 tiles, 2 chunks) with
    their 43 audio latents (26 frames at 24 fps); rank 1's checkpoint holds the video VAE alone (it never looks
    for the audio one)."""
    source = save_latents(
        folder / "in.safetensors",
        latents()[0],
        fps=24,
        audio_latents=torch.randn(2, 32, 43, generator=torch.Generator().manual_seed(1)),
    )
    single, spread = folder / "single.safetensors", folder / "spread" / "out.safetensors"
    spread.parent.mkdir()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert cli.main([str(source), str(single), "--model", str(TINY), "--device", "cpu", "--tile-batch", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    shared = folder / "model"
    shutil.copytree(TINY, shared)
    shutil.copytree(TINY / "video_vae", Path(f"{shared}.missing") / "video_vae")  # rank 1's: video alone
    result = torchrun("cli", shared, source, spread, "--device", "cpu", "--tile-batch", "1")
    return CommandRun(result, single, spread)
