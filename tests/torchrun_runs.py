"""Launches of tests/distributed_worker.py's ranks: gloo on the CPU, one thread each (torchrun's own choice).

The command runs under real torchrun launches (`torchrun`, `command_run`). The sweeps, the API's jobs that
the tests of one world size share, run on ranks forked from a server process that imported torch and the
package once (`forked_ranks`): each torchrun launch costs a launcher and one torch import per rank, ~3 s of
CPU each on two cores.
"""

from __future__ import annotations

import multiprocessing.forkserver
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import distributed_worker
import pytest
import torch
from distributed_worker import CLI_LENGTHS, latents
from repo import TINY
from safetensors.torch import save_file

import minimax_h3_vae
from minimax_h3_vae import save_latents
from minimax_h3_vae.command import main as cli

WORKER = Path(__file__).with_name("distributed_worker.py")
PACKAGE_ROOT = Path(minimax_h3_vae.__file__).resolve().parents[1]  # the ranks import the package under test
# The worker's jobs run by the sweep on each world size: what the tests of that size read.
SWEEP_JOBS = {
    1: ("auto",),
    2: ("disagree", "decode", "auto", "api", "cli"),
    3: ("auto", "api", "cli"),
    4: ("auto", "api", "cli"),
}


# Every test that reads a sweep or forks ranks runs in one pytest-xdist worker: its fork server starts once, each
# sweep is launched once, and one process computes the single-process decodes the ranks' are compared with.
ON_FORKED_RANKS = pytest.mark.xdist_group("forked_ranks")


def sweep_sizes(*sizes: int) -> list:
    """`ranks` parameters for tests that read the sweep of that size (each marked ON_FORKED_RANKS)."""
    return [pytest.param(ranks, marks=ON_FORKED_RANKS) for ranks in sizes]


def torchrun(*args, ranks=2, module=False, wait=True, timeout=240):
    """`torchrun --standalone` on `ranks` CPU ranks of distributed_worker.py ARGS (or, with module=True, of the
    command itself), importing the package under test. wait: its CompletedProcess, output captured as text
    (a launch still running after `timeout` s is ended, then TimeoutExpired raised); else the Popen."""
    target = ["-m", "minimax_h3_vae.command"] if module else [str(WORKER)]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *target]
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)}
    env.pop("OMP_NUM_THREADS", None)  # torchrun's own choice (1 thread per rank) is part of what is tested
    process = subprocess.Popen(
        [*command, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=PACKAGE_ROOT,
    )
    if not wait:
        return process
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # a hang: end the launch and its ranks, then fail
        end_launch(process)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def end_launch(agent: subprocess.Popen) -> None:
    """Kill torchrun and its ranks (each rank leads a process group of its own, as torchrun starts them)."""
    try:
        children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
    except OSError:  # it has just ended
        children = []
    for child in children:
        try:
            os.killpg(int(child), signal.SIGKILL)
        except OSError:
            pass
    agent.kill()
    agent.communicate()


def write_cli_inputs(folder: Path) -> None:
    """The `cli` job's inputs: folder/in_T.safetensors, (24, T, 1, 29) latents of seed T, for T in CLI_LENGTHS."""
    for length in CLI_LENGTHS:
        z = torch.randn(24, length, 1, 29, generator=torch.Generator().manual_seed(length))
        save_file({"latents": z}, str(folder / f"in_{length}.safetensors"))


@dataclass(frozen=True)
class RankExit:
    """How a forked rank ended: its exit code, and what it wrote on stdout and stderr."""

    code: int | None
    output: str


def forked_ranks(ranks: int, target, *args, timeout: float) -> list[RankExit]:
    """target(*args) on `ranks` ranks of one gloo process group (`distributed_worker.as_rank`), forked from
    multiprocessing's fork server, which imports the worker (and with it torch and the package) once per test
    process. Each rank's exit; a rank still running after `timeout` s fails the test, every rank killed."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["distributed_worker", "minimax_h3_vae.command.main"])
    # The server imports torch as a torchrun rank does, with OMP_NUM_THREADS=1 in its environment: the thread
    # pools torch sets up then are those of a rank (on a 16-core machine, a server started with 16 threads gave
    # its children other float32 bits at 2 threads than a process that started with 1).
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    with socket.socket() as probe:  # a free port for the rendezvous, as torchrun --standalone picks one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environ = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    with tempfile.TemporaryDirectory() as temp:
        logs = [Path(temp) / f"rank{rank}.log" for rank in range(ranks)]
        processes = [
            context.Process(target=distributed_worker.as_rank, args=(rank, ranks, port, environ, log, target, *args))
            for rank, log in enumerate(logs)
        ]
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        hung = [rank for rank, process in enumerate(processes) if process.is_alive()]
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
        exits = [RankExit(process.exitcode, log.read_text()) for process, log in zip(processes, logs)]
    assert not hung, f"ranks {hung} still running after {timeout} s: " + "".join(e.output[-2000:] for e in exits)
    return exits


def sweep(folder: Path, ranks: int) -> None:
    """The worker's SWEEP_JOBS[ranks] on `ranks` ranks, writing into `folder` (failing the test if it fails)."""
    write_cli_inputs(folder)
    exits = forked_ranks(ranks, distributed_worker.sweep, str(TINY), folder, list(SWEEP_JOBS[ranks]), timeout=480)
    assert all(e.code == 0 for e in exits), "\n".join(
        f"rank {r}: {e.code}\n{e.output[-3000:]}" for r, e in enumerate(exits)
    )


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
