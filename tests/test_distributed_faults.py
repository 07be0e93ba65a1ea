"""Faults on several ranks: ranks given different options and a rank whose own decode fails (the 2-rank sweep),
and, in the command under real torchrun launches of gloo ranks on the CPU, a rank's failure, a rank killed
mid-decode, a rank blocked in a collective when the stop comes: one line, on the lowest rank still running, no
temporary file left, in bounded time. The 20-run repeat of the kill is marked slow (`pytest -m slow`)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from command_runs import refused, run_cli, small_latents, tree
from distributed_worker import disagree_latents
from repo import TINY
from safetensors.torch import save_file
from torchrun_runs import ON_FORKED_RANKS, PACKAGE_ROOT, end_launch, torchrun

from minimax_h3_vae import H3VideoDecoder
from minimax_h3_vae.command import main as cli

TYPE_NAMES = re.compile(r"\b\w+(Error|Exception)\b|NoneType|Traceback")


def rank_pids(agent: subprocess.Popen, ranks: int, timeout: float = 60) -> dict[int, int]:
    """rank -> process id of torchrun's workers (read from their environment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for child in Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split():
            try:
                env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            found.update({int(e[5:]): int(child) for e in env if e.startswith(b"RANK=")})
        if len(found) == ranks:
            return found
        time.sleep(0.05)
    raise AssertionError("torchrun's workers did not start")


def ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def lines(stderr: str) -> list[str]:
    """The command's own lines about the end of a run (not torchrun's report, not the progress bar)."""
    return [
        m.group(0) for m in re.finditer(r"(error: |interrupted by )[^\r\n]*", stderr) if "elastic" not in m.group(0)
    ]


@pytest.fixture(scope="module")
def long_latents(tmp_path_factory) -> Path:
    """157 latent frames of 3 tiles (31 windows): a decode that lasts a few seconds on two CPU ranks."""
    path = tmp_path_factory.mktemp("latents") / "in.safetensors"
    save_file({"latents": torch.randn(24, 157, 1, 29, generator=torch.Generator().manual_seed(3))}, str(path))
    return path


def command_args(latents: Path, out: Path) -> list:
    return [latents, out, "--model", TINY, "--device", "cpu", "--tile-batch", "1", "--raw-latents"]


# ---- a launch without its rendezvous -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, named",
    [
        ({"MASTER_PORT": "29500"}, "MASTER_ADDR"),
        ({"MASTER_ADDR": "localhost"}, "MASTER_PORT"),
        ({"MASTER_ADDR": "localhost", "MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ],
)
def test_world_size_without_the_rendezvous_is_one_line_exit_2(monkeypatch, capsys, tmp_path, env, named):
    """Bug: WORLD_SIZE=2 RANK=0 without MASTER_ADDR exited 1 with a Python type name in the message."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    save_file({"latents": torch.zeros(24, 1, 1, 1)}, str(tmp_path / "in.safetensors"))
    assert cli.main([str(tmp_path / "in.safetensors"), str(tmp_path / "out.mp4"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and named in err[0], err
    assert not TYPE_NAMES.search(err[0]), err


@pytest.mark.parametrize("name, value", [("WORLD_SIZE", "\u00b2"), ("WORLD_SIZE", "\u0662"), ("RANK", "\u00b9")])
def test_launcher_variables_are_read_as_strictly_as_flags(monkeypatch, capsys, tmp_path, name, value):
    """Numbers a launcher sets are ASCII digits, as the command reads every number: a superscript or another
    script's digit is the one error line, not int()'s "invalid literal"."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv(name, value)
    save_file({"latents": torch.zeros(24, 1, 1, 1)}, str(tmp_path / "in.safetensors"))
    assert cli.main([str(tmp_path / "in.safetensors"), str(tmp_path / "out.mp4"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {name}=") and "invalid literal" not in err[0], err


# ---- the ranks agree on each call first ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def disagree_run(rank_sweep):
    """What each rank of the 2-rank sweep's `disagree` job saw (distributed_worker.py), and the sweep's folder."""
    folder = rank_sweep(2)
    return [json.loads((folder / f"disagree_rank{rank}.json").read_text()) for rank in (0, 1)], folder


@ON_FORKED_RANKS
def test_ranks_given_different_options_fail_together(disagree_run):
    """Bug: ranks given different tile batches aborted rank 0 (SIGABRT inside gloo); different output ranks
    hung until the collective timeout. Now every rank raises the same ValueError, naming what differs, and
    the process group stays usable."""
    results, _ = disagree_run
    for name, words in (
        ("tile_batch", "tile_batch 1 (rank 0), 2 (rank 1)"),
        ("output_rank", "output_rank 0 (rank 0), 1 (rank 1)"),
        ("latents", "latents shape (1, 24, 2, 1, 29) (rank 0), (1, 24, 2, 1, 28) (rank 1)"),
    ):
        for rank in (0, 1):
            assert results[rank][name].startswith("ValueError: the ranks were given different decode settings")
            assert words in results[rank][name], results[rank][name]


@ON_FORKED_RANKS
def test_one_ranks_own_problem_fails_every_rank(disagree_run):
    results, _ = disagree_run
    assert results[1]["own_problem"].startswith("ValueError: tile_batch must be")
    assert results[0]["own_problem"] == "ValueError: rank 1: " + results[1]["own_problem"].removeprefix("ValueError: ")
    assert results[1]["own_failure"] == "RuntimeError: injected failure"
    assert results[0]["own_failure"] == (
        "RankFailed: rank 1 failed while decoding its tiles: RuntimeError: injected failure"
    )


@ON_FORKED_RANKS
def test_the_process_group_outlives_the_failed_calls(disagree_run, one_thread):
    """After every refused or failed call above, a good decode on both ranks is the single process's."""
    _, folder = disagree_run
    expected = H3VideoDecoder.from_pretrained(TINY, device="cpu").decode(disagree_latents(), tile_batch=1)
    for rank in (0, 1):
        assert torch.equal(torch.load(folder / f"disagree_rank{rank}.pt"), expected)


@pytest.mark.xdist_group("torchrun_command")
def test_torchrun_runs_each_rank_on_one_thread(torchrun_command):
    """torchrun sets OMP_NUM_THREADS=1 (for more than one rank per node, when it is not set), and a CPU
    decode's last bits depend on the thread count (docs/performance.md says so): the command's ranks run one
    thread each, as the one process its output is compared with (test_distributed.py)."""
    run = torchrun_command
    assert run.result.returncode == 0, run.result.stderr[-3000:]
    assert sorted(run.result.stdout.splitlines()) == ["rank 0: 1 threads", "rank 1: 1 threads"]


def test_the_docs_say_what_torchrun_does_to_threads():
    """torch/distributed/run.py sets OMP_NUM_THREADS=1 only when it starts more than one rank per node: the docs
    say so, not that every torchrun rank runs one thread."""
    text = (PACKAGE_ROOT / "docs" / "performance.md").read_text()
    section = text.split("## More than one GPU", 1)[1].split("\n## ", 1)[0]
    assert "OMP_NUM_THREADS=1" in section and "thread" in section
    assert "only with `--nproc-per-node` above 1" in section and "one\nrank keeps" in section


# ---- a rank's own failure in the command: one line, by rank 0 ------------------------------------------------------


def test_a_ranks_failure_is_one_line_from_rank_0(tmp_path):
    """Bug: every surviving rank printed an error line, with gloo's text ("Connection closed by peer")."""
    save_file({"latents": torch.randn(24, 2, 1, 29)}, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    result = torchrun("cli_fail", *command_args(tmp_path / "in.safetensors", out))
    found = lines(result.stderr)
    assert len(found) == 1, result.stderr[-3000:]
    assert found[0].startswith("error: rank 1 failed while decoding its tiles: RuntimeError: injected failure")
    assert "gloo" not in result.stderr and "Connection" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.safetensors"]


# ---- a rank killed, or blocked, mid-decode -------------------------------------------------------------------------


def kill_a_rank(latents: Path, folder: Path, ranks: int, held: int | None = None) -> tuple[float, str]:
    """The command on `ranks` ranks; once rank 0's temporary file exists, rank 1 is stopped where it is and
    killed (kill -9); rank `held`, if given, is stopped (SIGSTOP) with it and let go 2.5 s after the kill.
    Returns the seconds from the kill to torchrun's end, and its stderr."""
    agent = torchrun(*command_args(latents, folder / "out.safetensors"), ranks=ranks, module=True, wait=False)
    try:
        pids = rank_pids(agent, ranks)
        assert wait_for(lambda: any(".part" in p.name for p in folder.iterdir()), 60), "rank 0 never opened OUT"
        if held is not None:
            os.kill(pids[held], signal.SIGSTOP)
        os.kill(pids[1], signal.SIGSTOP)  # somewhere in its decode: rank 0 is inside the decode too
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        if held is not None:
            time.sleep(2.5)
            os.kill(pids[held], signal.SIGCONT)
        _, err = agent.communicate(timeout=60)
        return time.monotonic() - killed, err
    finally:
        if agent.poll() is None:
            end_launch(agent)


def check_killed_run(took: float, stderr: str, folder: Path) -> None:
    assert took < 15, f"{took:.1f} s: a rank was left waiting"
    found = lines(stderr)
    assert len(found) == 1 and "rank 1" in found[0], stderr[-3000:]
    assert not TYPE_NAMES.search(found[0]) and "gloo" not in found[0], found[0]
    assert list(folder.iterdir()) == [], "no output, no temporary file"


def test_a_killed_rank_ends_the_run_with_one_line_and_no_litter(tmp_path, long_latents):
    """Bugs: with 3 ranks, kill -9 of rank 1 made both survivors print gloo's error; the line now comes from
    rank 0 alone and names rank 1."""
    took, err = kill_a_rank(long_latents, tmp_path, ranks=3)
    check_killed_run(took, err, tmp_path)


def test_a_rank_that_meets_the_loss_late_says_nothing(tmp_path, long_latents):
    """Bug (a race CI met): rank 0 reported rank 1's death (or torchrun's SIGTERM that followed it) and exited;
    rank 2, meeting the same a moment later, found ranks 0 and 1 ended, took itself for the lowest running rank and
    printed a second line. Here rank 2 is held (SIGSTOP) while rank 1 is killed and released 2.5 s later, after
    rank 0 has reported: still one line, from rank 0, naming rank 1 (the reporter outlives this host's other
    ranks, 3 s at most)."""
    took, err = kill_a_rank(long_latents, tmp_path, ranks=3, held=2)
    check_killed_run(took, err, tmp_path)


@pytest.mark.slow
def test_twenty_killed_ranks(tmp_path, long_latents):
    """20 runs with a rank killed at a random point of its decode: none hangs, none leaves a file."""
    for run in range(20):
        folder = tmp_path / str(run)
        folder.mkdir()
        took, err = kill_a_rank(long_latents, folder, ranks=2)
        check_killed_run(took, err, folder)


def test_a_rank_blocked_in_a_collective_stops_in_bounded_time(tmp_path, long_latents):
    """Bug: a rank waiting inside gloo cannot run Python's signal handler: torchrun's SIGTERM did nothing,
    SIGKILL came 30 s later and the temporary file stayed. Rank 1 is frozen (SIGSTOP), so rank 0 waits in
    a collective; SIGTERM to rank 0 now ends it within about 5 s (2 s of grace, then at most 3 s waiting for the
    frozen rank to end, as a reporting rank does), with the one line and nothing left."""
    agent = torchrun(*command_args(long_latents, tmp_path / "out.safetensors"), module=True, wait=False)
    try:
        pids = rank_pids(agent, 2)
        assert wait_for(lambda: any(".part" in p.name for p in tmp_path.iterdir()), 60), "rank 0 never opened OUT"
        os.kill(pids[1], signal.SIGSTOP)
        time.sleep(0.5)  # rank 0 reaches the next collective and waits there
        os.kill(pids[0], signal.SIGTERM)
        start = time.monotonic()
        stopped = wait_for(lambda: ended(pids[0]), 10)
        took, litter = time.monotonic() - start, sorted(p.name for p in tmp_path.iterdir())
        os.kill(pids[1], signal.SIGKILL)
        _, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            end_launch(agent)
    assert stopped, f"rank 0 still running {took:.1f} s after SIGTERM"
    assert litter == [], litter
    assert lines(err) == ["interrupted by SIGTERM: nothing was written"], err[-3000:]
    assert re.search(rf"exitcode\s+: 143 \(pid: {pids[0]}\)", err), err[-3000:]


# ---- the rank variables read by one process ------------------------------------------------------------------------


@pytest.mark.usefixtures("eager_offline")
@pytest.mark.parametrize("env", [{"RANK": "1"}, {"RANK": "3", "WORLD_SIZE": "1"}])
def test_a_stray_rank_variable_is_one_process(capsys, tmp_path, monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if "WORLD_SIZE" not in env:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "o.safetensors"
    code, err = run_cli(capsys, small_latents(tmp_path), out)
    assert code == 0 and out.is_file(), err


@pytest.mark.usefixtures("eager_offline")
@pytest.mark.parametrize(
    "env, name",
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK"),
        ({"WORLD_SIZE": "abc"}, "WORLD_SIZE"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"WORLD_SIZE": "-1"}, "WORLD_SIZE"),
    ],
)
def test_malformed_rank_variables_are_refused_naming_them(capsys, tmp_path, monkeypatch, env, name):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    line = refused(capsys, small_latents(tmp_path), tmp_path / "o.safetensors")
    assert name in line and "torchrun" in line
    assert tree(tmp_path) == {"s.safetensors"}
