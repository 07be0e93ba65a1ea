"""The command under faults: nothing is ever lost. Each test provokes the fault for real where it
can (ffmpeg refusing a frame rate, a full tmpfs, a read-only mount, real signals to a real process, a
sparse file declaring huge latents) and checks the exit code, the one stderr line, that no temporary file
is left and that an existing output is unchanged."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import imageio.v3 as iio
import pytest
import torch
from command_runs import (
    OLD,
    fill,
    latents_file,
    one_error_line,
    run_cli,
    run_cli_or_parser,
    small_latents,
    tmpfs,
    tree,
)
from repo import EXAMPLE_LATENTS, REPO, SCRIPT, TINY
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from minimax_h3_vae import H3VideoDecoder, denormalize_latents, files, to_uint8_frames
from minimax_h3_vae import latents as latents_module
from minimax_h3_vae.checkpoints import Checkpoint, CheckpointError, load_checkpoint
from minimax_h3_vae.command import checks, commit, encoder, mux, readback, sinks
from minimax_h3_vae.command.report import progress_bar, say


@pytest.fixture(autouse=True)
def offline(no_network, monkeypatch):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0")


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if the checkpoint is opened: the check must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the check")

    monkeypatch.setattr("minimax_h3_vae.checkpoints.load_checkpoint", refuse)
    monkeypatch.setattr(H3VideoDecoder, "from_pretrained", refuse)


@pytest.fixture
def no_weights_read(monkeypatch):
    """Fails the test if the decoder is built or any weight is read (headers may be)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the weights were read before the check")

    monkeypatch.setattr(Checkpoint, "tensors", refuse)
    monkeypatch.setattr(H3VideoDecoder, "from_pretrained", refuse)


# ---- a failed mp4 write never replaces a good output ---------------------------------------------------------------


@pytest.mark.parametrize("fps", ["1e-6", "1e-9", "5000"])
def test_fps_ffmpeg_cannot_mux_is_refused_up_front(capsys, tmp_path, no_model_load, fps):
    out = tmp_path / "v.mp4"
    out.write_bytes(OLD)
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors"), out, "--fps", fps)
    assert code == 2
    assert "--fps" in one_error_line(err) and "0.01" in err and "ffmpeg" not in err
    assert out.read_bytes() == OLD and tree(tmp_path) == {"v.mp4", "z.safetensors"}


def test_fps_metadata_ffmpeg_cannot_mux(capsys, tmp_path):
    out = tmp_path / "v.mp4"
    out.write_bytes(OLD)
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors", metadata={"fps": "1e-6"}), out)
    assert code == 2 and "metadata fps" in one_error_line(err)
    assert out.read_bytes() == OLD


def test_ffmpeg_failure_keeps_the_old_output(capsys, tmp_path, monkeypatch):
    """ffmpeg exits non-zero after it was given every frame (a bad option here: a real ffmpeg failure)."""
    real_popen = subprocess.Popen

    def popen(command, *args, **kwargs):
        if command[0] == encoder.ffmpeg_exe() and "-movflags" in command:
            command = [*command[:-1], "-frames:v", "not-a-number", command[-1]]
        return real_popen(command, *args, **kwargs)

    monkeypatch.setattr(mux.subprocess, "Popen", popen)
    out = tmp_path / "v.mp4"
    out.write_bytes(OLD)
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors"), out)
    assert code == 1
    assert "ffmpeg failed (exit status" in one_error_line(err)
    assert out.read_bytes() == OLD and tree(tmp_path) == {"v.mp4", "z.safetensors"}


def test_mp4_whose_frames_do_not_read_back_is_not_committed(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(readback, "read_back", lambda path: (4, None))
    out = tmp_path / "v.mp4"
    out.write_bytes(OLD)
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors"), out)
    assert code == 1 and "reads back 4 of 9 frames" in one_error_line(err)
    assert out.read_bytes() == OLD and tree(tmp_path) == {"v.mp4", "z.safetensors"}


def test_full_disk_keeps_the_old_mp4(capsys, tmp_path):
    """A real 256 KiB tmpfs holding an old output; the new mp4 (the example's first 9 frames and their sound:
    ~470 kB of noise) passes the preflight (which only knows a lower bound for mp4) and fills the disk."""
    example = load_file(str(EXAMPLE_LATENTS))
    first = {"latents": example["latents"][:, :3], "audio_latents": example["audio_latents"][..., :15]}
    latents = tmp_path / "z.safetensors"
    metadata = safe_open(str(EXAMPLE_LATENTS), "pt").metadata()
    save_file({k: v.contiguous() for k, v in first.items()}, str(latents), metadata=metadata)
    with tmpfs(tmp_path / "disk", "256k") as disk:
        out = disk / "v.mp4"
        out.write_bytes(OLD)
        code, err = run_cli(capsys, latents, out)
        assert code == 1
        line = one_error_line(err)  # the disk named, not "ffmpeg failed (... no message)"
        assert f"{out}: no space left on the disk of {disk}; free some space" in line, line
        assert out.read_bytes() == OLD and tree(disk) == {out.name}


def test_full_disk_while_streaming_safetensors(capsys, tmp_path, monkeypatch):
    """ENOSPC from the file's sync of its second chunk (simulated: the preflight already refuses what cannot
    fit, and a delayed-allocation filesystem reports the full disk there)."""
    real, calls = os.fdatasync, []

    def fdatasync(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    out = tmp_path / "v.safetensors"
    out.write_bytes(OLD)
    z = torch.randn(24, 12, 2, 2, generator=torch.Generator().manual_seed(1))
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors", z), out)
    assert code == 1 and f"{out}: no space left on the disk of {tmp_path}" in one_error_line(err)
    assert out.read_bytes() == OLD and tree(tmp_path) == {"v.safetensors", "z.safetensors"}


# ---- OUT is never the input or a checkpoint file -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "relative"])
def test_output_is_the_input(capsys, tmp_path, monkeypatch, how):
    latents = latents_file(tmp_path / "l.safetensors")
    before = latents.read_bytes()
    out = {"same": latents, "symlink": tmp_path / "link.safetensors", "hardlink": tmp_path / "hard.safetensors"}.get(
        how, Path("l.safetensors")
    )
    if how == "symlink":
        out.symlink_to(latents)
    if how == "hardlink":
        os.link(latents, out)
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, latents, out)
    assert code == 2 and "is the input file" in one_error_line(err)
    assert latents.read_bytes() == before


@pytest.mark.parametrize("how", ["weights", "config", "hardlink_elsewhere"])
def test_output_is_a_checkpoint_file(capsys, tmp_path, how):
    model = tmp_path / "model"
    shutil.copytree(TINY, model)
    weights = model / "video_vae" / "source" / "model.safetensors"
    before = weights.read_bytes()
    out = {"weights": weights, "config": model / "video_vae" / "source" / "config.mp4"}.get(how)
    if how == "config":  # a file of the checkpoint folder, whatever its name
        (model / "video_vae" / "source" / "config.json").rename(out)
        (model / "video_vae" / "source" / "config.json").symlink_to(out)
    if how == "hardlink_elsewhere":
        out = tmp_path / "frames.safetensors"
        os.link(weights, out)
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors"), out, "--model", model)
    assert code == 2 and "is a file of the checkpoint" in one_error_line(err)
    assert weights.read_bytes() == before


# ---- signals -------------------------------------------------------------------------------------------------------


def start_long_decode(folder: Path, out: Path, stderr) -> subprocess.Popen:
    """The command as a real process, decoding 9 chunks of latents (several seconds on the CPU, written to
    folder/z.safetensors) to `out`, its stderr to `stderr`."""
    z = torch.randn(24, 42, 4, 4, generator=torch.Generator().manual_seed(2))
    latents = latents_file(folder / "z.safetensors", z)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MINIMAX_H3_VAE_FUSED": "0"}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(latents), str(out), "--model", str(TINY), "--device", "cpu"],
        stderr=stderr,
        stdout=subprocess.DEVNULL,
        env=env,
    )


@pytest.mark.parametrize(
    "signum, code",
    [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)]
    # The other catchable terminating ones take the same handler (test_signals_handled_are_every_catchable_
    # terminating_one checks that they are handled): repeated trials, with the slow ones.
    + [
        pytest.param(s, 128 + s, marks=pytest.mark.slow)
        for s in (signal.SIGQUIT, signal.SIGUSR1, signal.SIGALRM, signal.SIGXCPU)
    ],
)
def test_signal_during_decoding(tmp_path, signum, code):
    """A real process, a real signal once its temporary output exists and frames are being decoded."""
    out, log = tmp_path / "v.mp4", tmp_path / "stderr.txt"
    out.write_bytes(OLD)
    os.chmod(out, 0o640)
    with open(log, "w") as stderr:
        process = start_long_decode(tmp_path, out, stderr)
        try:
            deadline = time.monotonic() + 120
            while not (list(tmp_path.glob(".minimax-h3-decode-*.part.mp4")) and "frames of" in log.read_text()):
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the decode did not start"
                time.sleep(0.05)
            process.send_signal(signum)
            assert process.wait(timeout=60) == code, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines[-1] == f"interrupted by {signal.Signals(signum).name}: nothing was written", lines[-3:]
    assert "Traceback" not in log.read_text()
    assert out.read_bytes() == OLD and out.stat().st_mode & 0o777 == 0o640
    assert tree(tmp_path) == {"v.mp4", "z.safetensors", "stderr.txt"}


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.1, 0.25, 0.5])
def test_signal_during_start_up(tmp_path, delay):
    """A real SIGTERM while torch is still importing (its library is mapped: the import has begun), and a
    little later: the one line, exit 143, nothing written, an existing OUT unchanged."""
    out, log = tmp_path / "v.mp4", tmp_path / "stderr.txt"
    out.write_bytes(OLD)
    with open(log, "w") as stderr:
        process = start_long_decode(tmp_path, out, stderr)
        try:
            maps, deadline = Path(f"/proc/{process.pid}/maps"), time.monotonic() + 120
            while "libtorch" not in maps.read_text():
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "torch was never imported"
                time.sleep(0.005)
            time.sleep(delay)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 143, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines and lines[-1] == "interrupted by SIGTERM: nothing was written", log.read_text()
    assert sum("nothing was written" in line for line in lines) == 1 and "Traceback" not in log.read_text()
    assert out.read_bytes() == OLD
    assert tree(tmp_path) == {"v.mp4", "z.safetensors", "stderr.txt"}


def test_the_error_line_starts_its_own_line_over_a_progress_bar(capsys):
    """A rank's watchdog says the one line from its own thread, whatever the bar was doing (under torchrun, a
    surviving rank's bar is mid-line when rank 0 is killed): the line starts at column 0, and a bar that
    has closed its line gets no blank line after it."""
    capsys.readouterr()
    bar = progress_bar(9, "decoding", "tile")
    bar.update(3)  # the bar's line is drawn, with no newline after it
    said = threading.Thread(target=say, args=("error: rank 0 has stopped; nothing was written",))
    said.start()
    said.join()
    err = capsys.readouterr().err
    assert "error: rank 0 has stopped; nothing was written" in err.split("\n"), repr(err)
    bar.close()
    capsys.readouterr()
    say("error: again")
    assert capsys.readouterr().err == "error: again\n"


def test_a_stop_just_after_the_rename_says_the_output_is_complete(capsys, tmp_path, monkeypatch):
    """A real SIGINT sent the instant OUT has been renamed into place (the summary line still to come, as when
    a parent that does not read stderr lets it block): exit 130, and the line says OUT is complete, never
    that nothing was written over a file that was."""
    out = tmp_path / "f.safetensors"
    out.write_bytes(OLD)
    latents = latents_file(tmp_path / "z.safetensors")
    real_replace = os.replace

    def replace_then_stop(source, target):
        real_replace(source, target)
        if Path(target) == out:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(commit.os, "replace", replace_then_stop)
    code, err = run_cli(capsys, latents, out)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 130, err
    assert lines[-1] == f"interrupted by SIGINT: {out} was already written and is complete", err
    assert "nothing was written" not in err and "Traceback" not in err
    assert load_file(str(out))["video"].shape[0] == 9  # the new output, whole
    assert tree(tmp_path) == {"f.safetensors", "z.safetensors"}


def read_keeping_full(read_end: int, top_up: int) -> bytes:
    """What the command wrote to the pipe since the last call (the filler taken out), leaving the pipe full
    again, so that the command's next write to its stderr blocks until the next call."""
    said = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(read_end, 65536):
            said += chunk
    for size in (4096, 1024, 256, 64, 16, 4, 1):  # a write of up to PIPE_BUF bytes goes whole or not at all
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(top_up, b"\0" * size)
    return said.replace(b"\0", b"")


def waits_writing_stderr(pid: int) -> bool:
    """Whether the process's main thread sits in write(2) on fd 2, within a second (Linux x86-64: /proc's
    syscall file starts with the call's number, 1, and its first argument)."""
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/syscall").read_text().split()[:2] == ["1", "0x2"]:
                return True
        except OSError:
            return False
        time.sleep(0.01)
    return False


def test_a_real_stop_while_the_summary_waits_on_stderr(tmp_path):
    """Row 1's repro with a real process: its stderr is a pipe that the parent keeps full, reading only between
    checks, so the command's summary line blocks once OUT has been renamed into place; then a real SIGINT.
    Exit 130 and the last line says OUT is complete, never that nothing was written. A few trials: the summary
    may slip out between two reads, and the trial that counts is one where it did not."""
    trials = []
    for _ in range(3):
        out = tmp_path / "v.safetensors"
        out.write_bytes(OLD)
        old_inode = out.stat().st_ino
        read_end, write_end = os.pipe()
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
        os.set_blocking(read_end, False)
        # The parent's own writing end, non-blocking; the command's stays blocking (its own open file).
        top_up = os.open(f"/proc/self/fd/{write_end}", os.O_WRONLY | os.O_NONBLOCK)
        said = read_keeping_full(read_end, top_up)
        try:
            process = start_long_decode(tmp_path, out, write_end)
            os.close(write_end)
            deadline = time.monotonic() + 120
            while out.stat().st_ino == old_inode:
                assert process.poll() is None, said.decode()
                assert time.monotonic() < deadline, "OUT was never renamed"
                said += read_keeping_full(read_end, top_up)
                time.sleep(0.01)
            # The summary had not got out and the command waits in write(2) on its stderr, the full pipe (a
            # summary that slipped into the pipe between a read and its top-up is not read yet: the second test).
            blocked = b"wrote" not in said and waits_writing_stderr(process.pid)
            process.send_signal(signal.SIGINT)
            os.close(top_up)
            os.set_blocking(read_end, True)
            while chunk := os.read(read_end, 65536):
                said += chunk
            code = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
            os.close(read_end)
        err = said.replace(b"\0", b"").decode()
        lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
        assert "nothing was written" not in err and "Traceback" not in err, err
        assert load_file(str(out))["video"].shape[0] == 141  # the new output, whole
        assert tree(tmp_path) == {"v.safetensors", "z.safetensors"}
        trials.append(blocked)
        if blocked:
            assert code == 130, err
            assert lines[-1] == f"interrupted by SIGINT: {out} was already written and is complete", lines[-3:]
            break
    assert trials[-1], "the summary got out before the stop in every trial"


def test_temp_name_is_short_and_recognisable(tmp_path):
    name = files.temp_name(tmp_path / ("v" * 251 + ".mp4")).name
    assert name.startswith(".minimax-h3-decode-") and name.endswith(".part.mp4") and len(name) < 40


LATE_STOP = """
import os, signal, time
from minimax_h3_vae.command import main as command
late = {late!r}
if late == "after main":
    run = command.main

    def stopped_after(*args, **kwargs):
        code = run(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
        return code

    command.main = stopped_after
else:
    say = command.say

    def stopped_after(line, *args, **kwargs):
        say(line, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)

    command.say = stopped_after
from minimax_h3_vae.command.console import console_main
console_main()
"""


@pytest.mark.parametrize("late", ["after main", "after the line"])
def test_a_stop_after_the_run_has_said_its_line_adds_none(tmp_path, late):
    """Bug (seen under torchrun): a rank whose run had failed and said its one line got torchrun's SIGTERM as it
    ended, and said a second, `interrupted by SIGTERM: nothing was written`, exiting 143. A stop once the run's
    line is said (in `main`, or after it while the process exits) is ignored: one line, the run's code."""
    script = LATE_STOP.format(late=late)
    command = [sys.executable, "-c", script, str(tmp_path / "missing.safetensors"), str(tmp_path / "out.mp4")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    said = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(said) == 1 and said[0].startswith("error:"), result.stderr
    assert tree(tmp_path) == set()


# ---- permission bits, long names -----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".mp4", ".safetensors"])
def test_existing_output_keeps_its_permission_bits(capsys, tmp_path, suffix):
    out = tmp_path / f"v{suffix}"
    out.write_bytes(OLD)
    os.chmod(out, 0o600)
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors"), out)
    assert code == 0, err
    assert out.read_bytes() != OLD and out.stat().st_mode & 0o7777 == 0o600


@pytest.mark.parametrize("length", [250, 255])
def test_longest_output_names(capsys, tmp_path, length):
    out = tmp_path / ("v" * (length - 4) + ".mp4")
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors"), out)
    assert code == 0, err
    assert iio.imread(out).shape == (9, 32, 32, 3)
    assert tree(tmp_path) == {out.name, "z.safetensors"}


# ---- .safetensors output streams -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 2, 3, 3), (1, 1, 1, 3), (3, 7, 5, 3)])
def test_streamed_safetensors_is_byte_for_byte_save_file(tmp_path, shape):
    frames = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    sink = sinks.SafetensorsSink(tmp_path / "a.safetensors", *shape[:3])
    for part in frames.split(2):
        sink.write(part)
    sink.commit()
    save_file({"video": frames}, str(tmp_path / "b.safetensors"))
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_safetensors_chunks_are_synced_as_they_are_written(tmp_path, monkeypatch):
    """Every chunk is on disk (fdatasync) before the next one is taken, so the fsync before the rename has
    little left; the file is still byte for byte save_file's."""
    synced = []
    sizes = []
    real = os.fdatasync

    def fdatasync(fd):
        real(fd)
        synced.append(fd)
        sizes.append(os.fstat(fd).st_size)

    monkeypatch.setattr(sinks.os, "fdatasync", fdatasync)
    frames = torch.randint(0, 256, (7, 4, 6, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    sink = sinks.SafetensorsSink(tmp_path / "a.safetensors", 7, 4, 6)
    for part in frames.split(3):
        sink.write(part)
    assert len(synced) == 3
    header = sizes[-1] - frames.numel()
    assert sizes == [header + 3 * 72, header + 6 * 72, header + 7 * 72]
    sink.commit()
    save_file({"video": frames}, str(tmp_path / "b.safetensors"))
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_safetensors_frames_reach_the_disk_while_decoding(capsys, tmp_path, monkeypatch):
    """Before the last chunk is decoded, the earlier frames are already in the file: host memory does not
    grow with the clip."""
    real = H3VideoDecoder.decode_stream
    sizes = []

    def decode_stream(self, z, progress=None, **options):
        chunks = list(real(self, z, progress, **options))
        yield from chunks[:-1]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            sizes[:] = [p.stat().st_size for p in tmp_path.glob(".minimax-h3-decode-*")]
            if sizes and sizes[0] >= 17 * 32 * 32 * 3:  # at least the first chunk's frames
                break
            time.sleep(0.02)
        yield chunks[-1]

    monkeypatch.setattr(H3VideoDecoder, "decode_stream", decode_stream)
    z = torch.randn(24, 17, 2, 2, generator=torch.Generator().manual_seed(4))
    out = tmp_path / "v.safetensors"
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors", z), out)
    assert code == 0, err
    assert sizes and sizes[0] >= 17 * 32 * 32 * 3, sizes
    assert load_file(str(out))["video"].shape == (56, 32, 32, 3)


# ---- limits, before the work ---------------------------------------------------------------------------------------


def test_huge_latents_refused_from_the_header(capsys, tmp_path, monkeypatch):
    """A sparse file declaring (24, 3, 4000, 4000) float32 (4.6 GB, no disk used): refused from its header
    with the size and the limit, without reading the data or loading the model."""
    header = json.dumps({"latents": {"dtype": "F32", "shape": [24, 3, 4000, 4000], "data_offsets": [0, 4608000000]}})
    header = header.encode() + b" " * (-len(header) % 8)
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + 4608000000)
    monkeypatch.setattr(latents_module, "read_latents", lambda *a: pytest.fail("read the latents' data"))
    monkeypatch.setattr(H3VideoDecoder, "from_pretrained", lambda *a, **k: pytest.fail("loaded the model"))
    start = time.monotonic()
    code, err = run_cli(capsys, path, tmp_path / "v.safetensors")
    assert code == 2 and time.monotonic() - start < 10
    line = one_error_line(err)
    assert "(24, 3, 4000, 4000)" in line and "host memory" in line and "TiB" in line and "available" in line
    assert tree(tmp_path) == {"huge.safetensors"}


def test_unwritable_folder_fails_before_the_model_loads(capsys, tmp_path, no_model_load):
    latents = latents_file(tmp_path / "z.safetensors")
    if os.geteuid() == 0:
        context = tmpfs(tmp_path / "ro", "1m", read_only=True)
    else:
        (tmp_path / "ro").mkdir()
        os.chmod(tmp_path / "ro", 0o555)
        context = contextlib.nullcontext(tmp_path / "ro")
    with context as folder:
        start = time.monotonic()
        code, err = run_cli(capsys, latents, folder / "v.mp4")
        assert code == 2 and time.monotonic() - start < 5
        line = one_error_line(err)
        assert "cannot create the output there" in line and "PermissionError" not in err
        assert tree(folder) == set()


def test_free_space_preflight(capsys, tmp_path, no_weights_read):
    """The example's 39 frames of 320x256 (9.1 MiB) and its sound, 2 x 52,000 float32 samples (0.4 MiB)."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        code, err = run_cli(capsys, EXAMPLE_LATENTS, disk / "v.safetensors")
        assert code == 2 and "free, the output needs at least 9.5 MiB" in one_error_line(err)
        assert tree(disk) == set()


def edit_config(tmp_path: Path, edit) -> Path:
    model = tmp_path / "model"
    shutil.copytree(TINY, model)
    path = model / "video_vae" / "source" / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
    return model


def test_absurd_config_is_refused_before_allocating(capsys, tmp_path, monkeypatch):
    from minimax_h3_vae import model as model_module

    monkeypatch.setattr(model_module.ViTDecoder, "__init__", lambda *a: pytest.fail("built the model"))
    model = edit_config(tmp_path, lambda c: c["vit_decoder_kwargs"].update(num_layers=1000))
    start = time.monotonic()
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors"), tmp_path / "v.mp4", "--model", model)
    assert code == 2 and time.monotonic() - start < 10
    assert "num_layers 1000 (the tensors hold 2 blocks)" in one_error_line(err)
    with pytest.raises(CheckpointError, match="num_layers 1000 "):
        H3VideoDecoder.from_pretrained(model, device="cpu")


# ---- the error contract --------------------------------------------------------------------------------------------


def _float8(tmp_path):
    return [latents_file(tmp_path / "z.safetensors", torch.zeros(24, 3, 2, 2).to(torch.float8_e4m3fn))]


def _overflow(tmp_path):
    return [latents_file(tmp_path / "z.safetensors", torch.full((24, 3, 2, 2), 3e38))]


def _config(edit):
    def make(tmp_path):
        return [latents_file(tmp_path / "z.safetensors"), "--model", edit_config(tmp_path, edit)]

    return make


def _wrapper(edit):
    def make(tmp_path):
        model = tmp_path / "model"
        shutil.copytree(TINY, model)
        path = model / "video_vae" / "config.json"
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
        return [latents_file(tmp_path / "z.safetensors"), "--model", model]

    return make


def _std_nan(wrapper):
    wrapper["latents_std"][3] = float("nan")
    return wrapper


def _folder_input(tmp_path):
    (tmp_path / "dir.safetensors").mkdir()
    return [tmp_path / "dir.safetensors"]


def _fifo_input(tmp_path):
    os.mkfifo(tmp_path / "fifo.safetensors")
    return [tmp_path / "fifo.safetensors"]


CONTRACT = {
    "float8_latents": (_float8, "floating point"),
    "overflow_after_denormalising": (_overflow, "beyond +-10000"),
    "nan_in_latents_std": (_wrapper(_std_nan), "latents_std"),
    "config_is_a_list": (_wrapper(lambda w: [w]), "JSON object"),
    "vit_kwargs_is_a_list": (_config(lambda c: c.update(vit_decoder_kwargs=[1])), "JSON object"),
    "num_layers_not_whole": (_config(lambda c: c["vit_decoder_kwargs"].update(num_layers=2.5)), "num_layers"),
    "heads_negative": (_config(lambda c: c["vit_decoder_kwargs"].update(heads=-2)), "num_heads"),
    "rope_theta_text": (_config(lambda c: c["vit_decoder_kwargs"].update(rope_theta="big")), "rope_theta"),
    "latents_mean_number": (_wrapper(lambda w: {**w, "latents_mean": 3}), "latents_mean"),
    "tile_overlap_too_big": (_wrapper(lambda w: {**w, "vae_tile_overlap_min": 256}), "tiling overlap"),
    "folder_as_input": (_folder_input, "is a folder"),
    "fifo_as_input": (_fifo_input, "not a regular file"),
}


@pytest.mark.parametrize("name", CONTRACT)
def test_error_contract(capsys, tmp_path, name):
    make, words = CONTRACT[name]
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "v.mp4"
    out.write_bytes(OLD)
    args = make(tmp_path)
    code, err = run_cli(capsys, args[0], out, *args[1:])
    assert code == 2, err
    line = one_error_line(err)
    assert words in line, line
    for python_name in ("AttributeError", "TypeError", "NotImplementedError", "ValueError", "Exception"):
        assert python_name not in err
    assert "NaN or Inf" not in line or name == "nan"
    assert out.read_bytes() == OLD and tree(tmp_path / "out") == {"v.mp4"}


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--preset", "warp"], "--preset"),
        (["--crf", "fine"], "--crf"),
        (["--crf", "52"], "--crf"),
        (["--crf", "-1"], "--crf"),
        (["--tile-batch", "1.5"], "--tile-batch"),
    ],
)
def test_argument_errors_are_one_line(capsys, tmp_path, flags, words):
    """argparse's own errors too: one `error:` line (no usage dump), exit code 2."""
    latents = latents_file(tmp_path / "z.safetensors")
    try:
        code, err = run_cli(capsys, latents, tmp_path / "v.mp4", *flags)
    except SystemExit as exit:
        code, err = exit.code, capsys.readouterr().err
    assert code == 2 and words in one_error_line(err) and "usage:" not in err
    assert tree(tmp_path) == {"z.safetensors"}


@pytest.mark.parametrize(
    "flags, nearest",
    [
        (["--tile", "2"], "--tile-batch"),  # an abbreviation is not taken: it is refused, naming the flag
        (["--tile=2"], "--tile-batch"),
        (["--max-gpu", "4"], "--max-gpu-memory"),
        (["--tile-bach", "2"], "--tile-batch"),
        (["--devise", "cpu"], "--device"),
        (["--no-adio"], "--no-audio"),
    ],
)
def test_unknown_flags_are_refused_naming_the_nearest(capsys, tmp_path, no_model_load, flags, nearest):
    latents = latents_file(tmp_path / "z.safetensors")
    code, err = run_cli_or_parser(capsys, latents, tmp_path / "v.safetensors", *flags)
    line = one_error_line(err)
    assert code == 2 and "usage:" not in err, err
    assert f"unknown flag {flags[0].split('=')[0]} (did you mean {nearest}?)" in line, line
    assert tree(tmp_path) == {"z.safetensors"}


def test_an_unknown_flag_with_nothing_near_is_refused(capsys, tmp_path, no_model_load):
    latents = latents_file(tmp_path / "z.safetensors")
    code, err = run_cli_or_parser(capsys, latents, tmp_path / "v.safetensors", "--xyzzy")
    line = one_error_line(err)
    assert code == 2 and "unknown flag --xyzzy" in line and "did you mean" not in line, line


def test_crf_needs_an_mp4(capsys, tmp_path):
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors"), tmp_path / "v.safetensors", "--crf", "20")
    assert code == 2 and "not an .mp4" in one_error_line(err)


def test_missing_imageio_ffmpeg_is_named_before_the_model_loads(capsys, tmp_path, monkeypatch, no_model_load):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors"), tmp_path / "v.mp4")
    assert code == 2
    line = one_error_line(err)  # advice that works from a clone (the package is not on the index)
    assert 'pip install imageio-ffmpeg, or in the checkout pip install -e ".[video]"' in line, line
    assert "minimax-h3-vae[" not in line
    assert tree(tmp_path) == {"z.safetensors"}


def test_flac_without_imageio_ffmpeg_names_flac_and_offers_wav(capsys, tmp_path, monkeypatch, no_model_load):
    """.flac needs ffmpeg, .wav does not: the message names the format asked for and both ways out."""
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors"), tmp_path / "s.flac")
    assert code == 2
    line = one_error_line(err)
    assert ".flac output needs ffmpeg" in line and "mp4" not in line, line
    assert "write a .wav (no ffmpeg needed)" in line, line
    assert 'pip install imageio-ffmpeg, or in the checkout pip install -e ".[video]"' in line, line
    assert tree(tmp_path) == {"z.safetensors"}


def test_wav_needs_no_imageio_ffmpeg(capsys, tmp_path, monkeypatch):
    """What the .flac message offers works: the sound alone as .wav, with no ffmpeg installed."""
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    z = torch.randn(24, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    audio = torch.randn(2, 32, 15, generator=torch.Generator().manual_seed(1))  # 9 frames at 24 fps: 15 latents
    source = latents_file(tmp_path / "z.safetensors", {"latents": z, "audio_latents": audio})
    code, err = run_cli(capsys, source, tmp_path / "s.wav")
    assert code == 0, err
    assert (tmp_path / "s.wav").read_bytes()[:4] == b"RIFF"


# ---- crf, preset, lossless -----------------------------------------------------------------------------------------


def test_crf_0_is_lossless(capsys, tmp_path):
    z = torch.randn(24, 3, 2, 3, generator=torch.Generator().manual_seed(5))
    out = tmp_path / "v.mp4"
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors", z), out, "--crf", "0")
    assert code == 0, err
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu", fused=False)
    expected = to_uint8_frames(model.decode(denormalize_latents(z[None], model.config)))
    assert torch.equal(torch.from_numpy(iio.imread(out)), expected)


def test_crf_and_preset_reach_the_encoder(capsys, tmp_path):
    z = latents_file(tmp_path / "z.safetensors", torch.randn(24, 3, 4, 4, generator=torch.Generator().manual_seed(6)))
    sizes = {}
    for name, flags in {"default": [], "crf40": ["--crf", "40"], "fast": ["--preset", "ultrafast"]}.items():
        out = tmp_path / f"{name}.mp4"
        code, err = run_cli(capsys, z, out, *flags)
        assert code == 0, err
        assert iio.imread(out).shape == (9, 64, 64, 3)
        sizes[name] = out.stat().st_size
    assert sizes["crf40"] < sizes["default"] and sizes["fast"] != sizes["default"]


def x264_settings(mp4: Path) -> dict[str, str]:
    """The settings x264 writes into its stream (its `options:` text), as name -> value."""
    data = mp4.read_bytes()
    start = data.index(b"options: ") + len(b"options: ")
    text = data[start : data.index(b"\0", start)].decode()
    return dict(item.split("=", 1) for item in text.split() if "=" in item)


def test_the_default_preset_reaches_x264(capsys, tmp_path):
    """No --preset: x264 runs its "faster" preset (4 subpel refinements, 2 references, a 20-frame lookahead),
    not ffmpeg's "medium" (7, 3, 40), which --preset medium still gives."""
    z = latents_file(tmp_path / "z.safetensors", torch.randn(24, 3, 4, 4, generator=torch.Generator().manual_seed(7)))
    settings = {}
    for name, flags in {"default": [], "medium": ["--preset", "medium"]}.items():
        out = tmp_path / f"{name}.mp4"
        code, err = run_cli(capsys, z, out, *flags)
        assert code == 0, err
        settings[name] = x264_settings(out)
    faster, medium = settings["default"], settings["medium"]
    assert (faster["subme"], faster["ref"], faster["rc_lookahead"]) == ("4", "2", "20")
    assert (medium["subme"], medium["ref"], medium["rc_lookahead"]) == ("7", "3", "40")


# ---- a CPU limit, a disk filled mid-write, strict numbers, long paths, odd names -----------------------------------


def test_ulimit_t_leaves_no_litter(tmp_path):
    """`ulimit -t N` sets the soft and the hard CPU limit both to N: the kernel's SIGKILL would come with no
    SIGXCPU first (exit 137, the .part file left). The command lowers its soft limit, so SIGXCPU comes first:
    exit 152, one line, nothing left. A real process under the limit (1 thread: CPU time ~ wall time)."""
    out = tmp_path / "v.safetensors"
    out.write_bytes(OLD)
    z = torch.randn(24, 1600, 8, 8, generator=torch.Generator().manual_seed(30))  # 10-20 CPU s of decoding
    latents = latents_file(tmp_path / "z.safetensors", z)
    log = tmp_path / "stderr.txt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MINIMAX_H3_VAE_FUSED": "0", "OMP_NUM_THREADS": "1"}
    # The limit leaves 4 CPU s after the imports, whose cost varies by machine (a CUDA build of torch takes
    # several seconds to import): measured in a process of the same interpreter.
    imports = subprocess.run(
        [
            sys.executable,
            "-c",
            "import resource, minimax_h3_vae.command.main; r = resource.getrusage(resource.RUSAGE_SELF); "
            "print(r.ru_utime + r.ru_stime)",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    limit = math.ceil(float(imports.stdout)) + 4
    with open(log, "w") as stderr:
        result = subprocess.run(
            [sys.executable, str(SCRIPT), str(latents), str(out), "--model", str(TINY), "--device", "cpu"],
            stderr=stderr,
            stdout=subprocess.DEVNULL,
            env=env,
            timeout=120,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CPU, (limit, limit)),  # as `ulimit -t` sets it
        )
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert result.returncode == 128 + signal.SIGXCPU, lines[-3:]
    assert lines[-1] == "interrupted by SIGXCPU: nothing was written"
    assert out.read_bytes() == OLD and tree(tmp_path) == {"v.safetensors", "z.safetensors", "stderr.txt"}


def test_disk_filled_while_writing_safetensors(capsys, tmp_path, monkeypatch):
    """A real tmpfs that has room at the preflight and is filled by someone else right after it: the error
    names the output and its disk and says there is no space left (the writer's second failure, as its file
    is closed, does not replace it), the writer thread is stopped, and nothing is left."""
    real = checks.check_free_space

    def check_then_fill(out, needed):
        real(out, needed)
        fill(out.parent)

    monkeypatch.setattr(checks, "check_free_space", check_then_fill)
    z = torch.randn(24, 12, 4, 4, generator=torch.Generator().manual_seed(31))  # 45 frames of 64x64: 550 kB
    latents = latents_file(tmp_path / "z.safetensors", z)
    with tmpfs(tmp_path / "disk", "1m") as disk:
        out = disk / "v.safetensors"
        out.write_bytes(OLD)
        code, err = run_cli(capsys, latents, out)
        assert code == 1
        assert f"{out}: no space left on the disk of {disk}; free some space" in one_error_line(err), err
        assert out.read_bytes() == OLD and tree(disk) == {"v.safetensors", "filler"}
    assert not [t for t in threading.enumerate() if t.name == "frame-writer"], "the writer thread was left running"


def test_cleanup_never_raises_over_the_first_error(tmp_path):
    """A sink whose writer fails again as it is closed (a full disk): discard removes the file and raises
    nothing, so the first error is the one reported."""
    sink = sinks.SafetensorsSink(tmp_path / "v.safetensors", 2, 4, 4)

    def close_fails():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    sink.handle.close = close_fails
    sink.discard()
    assert tree(tmp_path) == set()


@pytest.mark.parametrize(
    "flag, value",
    [("--fps", "2_4"), ("--fps", " 24"), ("--fps", "\u0662\u0664"), ("--crf", "1_7"), ("--tile-batch", "\u0661")]
    + [("--max-gpu-memory", "1_0"), ("--fps", "infinity")],
)
def test_flags_read_numbers_strictly(capsys, tmp_path, no_model_load, flag, value):
    """The flags read numbers the one strict way the files' metadata is read (tests/test_latents_file.py):
    Python's int() and float() take "1_7" as 17 and other scripts' digits."""
    code, err = run_cli_or_parser(capsys, latents_file(tmp_path / "z.safetensors"), tmp_path / "v.mp4", flag, value)
    assert code == 2, err
    line = one_error_line(err)
    assert f"argument {flag}: {value!r} is not a" in line and "written in digits" in line, line
    assert tree(tmp_path) == {"z.safetensors"}


def test_a_name_too_long_is_bad_input_before_decoding(capsys, tmp_path, no_model_load):
    latents = latents_file(tmp_path / "z.safetensors")
    code, err = run_cli(capsys, latents, tmp_path / ("v" * 252 + ".mp4"))
    assert code == 2 and "is 256 bytes long, the filesystem takes at most 255" in one_error_line(err)
    assert tree(tmp_path) == {"z.safetensors"}


DEEP = Path("/" + "d/" * 2100)  # 4201 bytes: more than Linux's PATH_MAX of 4096


@pytest.mark.parametrize("which", ["OUT", "IN"])
def test_a_path_over_path_max_is_bad_input_before_decoding(capsys, tmp_path, no_model_load, which):
    latents, out = latents_file(tmp_path / "z.safetensors"), tmp_path / "v.mp4"
    if which == "OUT":
        code, err = run_cli(capsys, latents, DEEP / "v.mp4")
        assert code == 2 and "bytes long" in one_error_line(err) and "give a shorter path" in err, err
    else:
        code, err = run_cli(capsys, DEEP / "z.safetensors", out)
        assert code == 2 and "cannot read it (File name too long)" in one_error_line(err), err
    assert tree(tmp_path) == {"z.safetensors"}


def test_a_checkpoint_path_over_path_max_is_a_checkpoint_error():
    with pytest.raises(CheckpointError, match="cannot look there \\(File name too long\\)"):
        load_checkpoint(DEEP / "model")


def lines_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize("case", ["unknown_format", "missing_input", "missing_folder", "missing_model", "bad_shape"])
def test_every_message_is_one_line_whatever_the_names(capsys, tmp_path, case):
    """Names holding a newline (or a tab, an escape): each path is shown quoted, so that every line the
    command prints, and its error line, stay one line."""
    odd = "new\nline\t\x1b[31m"
    latents, out, flags = latents_file(tmp_path / "z.safetensors"), tmp_path / "v.mp4", []
    if case == "unknown_format":
        out = tmp_path / f"{odd}.mp3"
    elif case == "missing_input":
        latents = tmp_path / f"{odd}.safetensors"
    elif case == "missing_folder":
        out = tmp_path / odd / "v.mp4"
    elif case == "missing_model":
        flags = ["--model", tmp_path / odd]
    else:
        latents = latents_file(tmp_path / f"{odd}.safetensors", torch.zeros(16, 3, 2, 2))
    code, err = run_cli(capsys, latents, out, *flags)
    assert code == 2
    assert all(line.startswith(("error: ", "loading ")) for line in lines_of(err)), err
    line = one_error_line(err)
    assert repr(odd) in line or repr(str(tmp_path / odd)) in line or "new\\nline\\t\\x1b[31m" in line, line


@pytest.mark.parametrize("value", ["0", "-3"])
def test_tile_batch_messages_speak_the_flags_language(capsys, tmp_path, no_model_load, value):
    code, err = run_cli(capsys, latents_file(tmp_path / "z.safetensors"), tmp_path / "v.mp4", "--tile-batch", value)
    line = one_error_line(err)
    assert code == 2 and line.startswith("error: --tile-batch must be") and f"got {value}" in line, line
    assert "None" not in line and "leave --tile-batch out" in line


def test_the_source_folder_as_model_names_the_folder_to_give(capsys, tmp_path):
    """--model .../video_vae/source looked for source/source/config.json: say which folder to give."""
    code, err = run_cli(
        capsys, latents_file(tmp_path / "z.safetensors"), tmp_path / "v.mp4", "--model", TINY / "video_vae" / "source"
    )
    line = one_error_line(err)
    assert (
        code == 2 and "is the source/ folder" in line and f"give the folder that holds it, {TINY / 'video_vae'}" in line
    )
    assert "source/source" not in line


# ---- late failures: NaN frames, no temporary folder, a closed or full stderr ---------------------------------------


def test_nan_frames_are_never_written(capsys, tmp_path, monkeypatch):
    """A decode that yields NaN (here: weights made NaN) fails the run; no file appears."""
    real = H3VideoDecoder.decode_stream

    def poisoned(self, z, progress=None, **options):
        for chunk in real(self, z, progress, **options):
            yield torch.full_like(chunk, float("nan"))

    monkeypatch.setattr(H3VideoDecoder, "decode_stream", poisoned)
    out = tmp_path / "o.mp4"
    code, err = run_cli(capsys, small_latents(tmp_path), out)
    assert code == 1 and "NaN or Inf" in one_error_line(err)
    assert tree(tmp_path) == {"s.safetensors"}


def test_no_temporary_folder_leaves_no_litter(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent")
    out = tmp_path / "out" / "o.mp4"
    out.parent.mkdir()
    code, err = run_cli(capsys, small_latents(tmp_path), out)
    assert code == 0, err
    assert tree(out.parent) == {"o.mp4"}


def run_script(tmp_path: Path, *args, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MINIMAX_H3_VAE_FUSED": "0"}
    command = [sys.executable, str(SCRIPT), *map(str, args), "--model", str(TINY), "--device", "cpu"]
    return subprocess.run(command, env=env, timeout=120, **popen)


@pytest.mark.parametrize("stderr", ["closed", "full", "head"])
def test_diagnostics_never_cost_the_output(tmp_path, stderr):
    latents, out = small_latents(tmp_path), tmp_path / "o.mp4"
    if stderr == "closed":
        result = run_script(tmp_path, latents, out, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.close(2))
    elif stderr == "full":
        with open("/dev/full", "w") as full:
            result = run_script(tmp_path, latents, out, stderr=full)
    else:  # 2>&1 | head -1: the reader goes away after one line
        command = f"{sys.executable} {SCRIPT} {latents} {out} --model {TINY} --device cpu 2>&1 | head -1"
        result = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, timeout=120)
        result.returncode = 0 if out.is_file() else 1
    assert result.returncode == 0 and out.is_file()


# ---- what the command stops on, and an OUT that is a link ----------------------------------------------------------


def test_signals_handled_are_every_catchable_terminating_one():
    from minimax_h3_vae.command.report import STOP_SIGNALS

    assert {signal.SIGQUIT, signal.SIGUSR1, signal.SIGALRM, signal.SIGXCPU} <= set(STOP_SIGNALS)


def test_symlink_out_is_written_through(capsys, tmp_path):
    """Decided: an OUT that is a symbolic link is written through, as cp does: the link stays, its target
    gets the video."""
    target = tmp_path / "real.safetensors"
    target.write_bytes(b"old")
    link = tmp_path / "link.safetensors"
    link.symlink_to(target)
    code, err = run_cli(capsys, small_latents(tmp_path), link)
    assert code == 0, err
    assert link.is_symlink() and load_file(str(target))["video"].shape[0] == 9
